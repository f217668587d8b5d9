// Package callwatch is the hub's list of call watchers (Hub.WatchCalls,
// the console's live tail of failed and slow calls): copy on write, so
// that a call with no watcher costs one atomic load.
package callwatch

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/telemetry"
)

// watch is one subscriber.
type watch struct {
	slow time.Duration
	fn   func(telemetry.CallRecord)
}

// List is the watchers. The zero value is ready.
type List struct {
	p atomic.Pointer[[]*watch]
}

// Add makes fn hear of each call noted that failed or took slow or
// longer, until stop.
func (l *List) Add(slow time.Duration, fn func(telemetry.CallRecord)) (stop func()) {
	w := &watch{slow, fn}
	l.swap(func(ws []*watch) []*watch { return append(ws, w) })
	return func() {
		l.swap(func(ws []*watch) []*watch { return slices.DeleteFunc(ws, func(x *watch) bool { return x == w }) })
	}
}

func (l *List) swap(f func([]*watch) []*watch) {
	for {
		old := l.p.Load()
		var cur []*watch
		if old != nil {
			cur = slices.Clone(*old)
		}
		next := f(cur)
		var p *[]*watch
		if len(next) > 0 {
			p = &next
		}
		if l.p.CompareAndSwap(old, p) {
			return
		}
	}
}

// Active reports whether anyone watches (a call then notes its start).
func (l *List) Active() bool { return l.p.Load() != nil }

// Note tells the watchers of req, begun at start and ended with err (on
// instance, when known). It runs on the call's goroutine; the watchers'
// functions must not block.
func (l *List) Note(req *envelope.Request, start time.Time, instance string, err error) {
	ws := l.p.Load()
	if ws == nil || start.IsZero() {
		return
	}
	d := time.Since(start)
	var rec *telemetry.CallRecord
	for _, w := range *ws {
		if err == nil && d < w.slow {
			continue
		}
		if rec == nil {
			rec = &telemetry.CallRecord{At: start, Method: req.Method, Code: envelope.CodeOK.String(),
				DurationMs: float64(d.Microseconds()) / 1000, Instance: instance, TraceID: req.Headers.TraceID, RequestID: req.ID}
			if err != nil {
				e := envelope.AsError(err)
				rec.Code, rec.Message = e.Code.String(), e.Message
			}
		}
		w.fn(*rec)
	}
}
