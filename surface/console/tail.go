package console

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/agentmesh/agentmesh/surface"
	"github.com/agentmesh/agentmesh/telemetry"
)

// tail keeps the hub's latest failed and slow calls (WatchCalls) while a
// page is open, and passes each to the open pages.
type tail struct {
	h    surface.Host
	slow time.Duration
	max  int

	mu     sync.Mutex
	recent [][]byte // newest last, at most max
	subs   map[chan []byte]struct{}
	stop   func() // WatchCalls' while subscribed
	closed bool
}

func newTail(h surface.Host, slow time.Duration, max int) *tail {
	return &tail{h: h, slow: slow, max: max, subs: map[chan []byte]struct{}{}}
}

// subscribe returns a channel of call records until ctx ends. A page too
// slow for them misses records, never holds a call.
func (t *tail) subscribe(ctx context.Context) <-chan []byte {
	ch := make(chan []byte, 64)
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		close(ch)
		return ch
	}
	t.subs[ch] = struct{}{}
	if t.stop == nil {
		t.stop = t.h.WatchCalls(t.slow, t.add)
	}
	t.mu.Unlock()
	context.AfterFunc(ctx, func() {
		t.mu.Lock()
		delete(t.subs, ch)
		var stop func()
		if len(t.subs) == 0 {
			stop, t.stop = t.stop, nil
		}
		t.mu.Unlock()
		if stop != nil {
			stop()
		}
	})
	return ch
}

// add takes one call record (on the call's goroutine: it never blocks).
func (t *tail) add(rec telemetry.CallRecord) {
	b, _ := json.Marshal(rec)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.recent = append(t.recent, b)
	if len(t.recent) > t.max {
		t.recent = t.recent[len(t.recent)-t.max:]
	}
	for ch := range t.subs {
		select {
		case ch <- b:
		default:
		}
	}
}

// recentCalls returns the records kept, oldest first.
func (t *tail) recentCalls() [][]byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([][]byte(nil), t.recent...)
}

// close stops watching and ends the subscriptions.
func (t *tail) close() {
	t.mu.Lock()
	t.closed = true
	stop := t.stop
	t.stop = nil
	for ch := range t.subs {
		delete(t.subs, ch)
		close(ch)
	}
	t.mu.Unlock()
	if stop != nil {
		stop()
	}
}
