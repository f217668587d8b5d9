// Package scenario is the harness of the acceptance scenarios of
// RELIABILITY.md: an open-loop load driver that measures latency from the
// intended send time, and a Jepsen-style ledger that joins what clients saw
// with what agents executed and prints one JSON summary line.
package scenario

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
)

// Outcome is what a client saw of one request.
type Outcome struct {
	ID         string
	Method     string
	Idempotent bool
	Intended   time.Time // when it should have been sent (open loop)
	End        time.Time
	Code       envelope.Code // CodeOK on success
	NotSent    bool          // the error says the request never reached a handler
	Echo       string        // what came back, to check it is this request's
	Want       string        // what should have come back
}

// HangAfter is how long Ledger.Call waits for a call before it counts
// it lost: far past every scenario's timeouts (2-3 s).
var HangAfter = 30 * time.Second

// Ledger collects outcomes and executions. Safe for concurrent use.
type Ledger struct {
	mu       sync.Mutex
	outcomes []Outcome
	execs    map[string]int // request id -> executions seen by agents
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger { return &Ledger{execs: map[string]int{}} }

// Record adds a client outcome.
func (l *Ledger) Record(o Outcome) {
	l.mu.Lock()
	l.outcomes = append(l.outcomes, o)
	l.mu.Unlock()
}

// Executed adds n executions of request id (from the agents' counts).
func (l *Ledger) Executed(id string, n int) {
	l.mu.Lock()
	l.execs[id] += n
	l.mu.Unlock()
}

// Summary is the ledger's verdict, printed as one JSON line.
type Summary struct {
	Scenario      string         `json:"scenario"`
	Requests      int            `json:"requests"`
	Succeeded     int            `json:"succeeded"`
	Failed        map[string]int `json:"failed"`
	Lost          int            `json:"lost"`
	Duplicates    int            `json:"duplicates"`
	Phantom       int            `json:"phantom"`
	Misdelivered  int            `json:"misdelivered"`
	Indeterminate int            `json:"indeterminate"`
	P50Ms         float64        `json:"p50Ms"`
	P99Ms         float64        `json:"p99Ms"`
	MaxMs         float64        `json:"maxMs"`
}

// Summarize joins outcomes and executions. sent is how many requests the
// driver issued: those without an outcome are lost.
func (l *Ledger) Summarize(name string, sent int) Summary {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := Summary{Scenario: name, Requests: sent, Failed: map[string]int{}}
	lat := make([]time.Duration, 0, len(l.outcomes))
	for _, o := range l.outcomes {
		lat = append(lat, o.End.Sub(o.Intended))
		if o.Code == envelope.CodeOK {
			s.Succeeded++
			if o.Echo != o.Want {
				s.Misdelivered++
			}
		} else {
			s.Failed[o.Code.String()]++
			if !o.NotSent && (o.Code == envelope.CodeTimeout || o.Code == envelope.CodeUnavailable) {
				s.Indeterminate++
			}
		}
		n := l.execs[o.ID]
		if !o.Idempotent && n > 1 {
			s.Duplicates++
		}
		if o.NotSent && n > 0 {
			s.Phantom++
		}
	}
	s.Lost = sent - len(l.outcomes) // the hung ones included
	if len(lat) > 0 {
		slices.Sort(lat)
		ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
		s.P50Ms, s.P99Ms, s.MaxMs = ms(lat[len(lat)/2]), ms(lat[len(lat)*99/100]), ms(lat[len(lat)-1])
	}
	return s
}

// Print writes s as one JSON line to w; to standard output, through
// Emit (so also to $MESH_SCENARIO_LOG).
func (s Summary) Print(w io.Writer) {
	b, _ := json.Marshal(s)
	if w == os.Stdout {
		Emit(b)
		return
	}
	fmt.Fprintf(w, "%s\n", b)
}

// Drive sends rate requests per second for d, open loop: each request
// starts at its intended time on its own goroutine (at most maxInFlight at
// once; a send that finds them all busy is still recorded, late). call
// makes request i and reports its outcome; Drive returns how many it sent
// after every call returned.
func Drive(ctx context.Context, rate float64, d time.Duration, maxInFlight int, call func(ctx context.Context, i int, intended time.Time)) int {
	interval := time.Duration(float64(time.Second) / rate)
	sem := make(chan struct{}, maxInFlight)
	var wg sync.WaitGroup
	start := time.Now()
	n := 0
	t := time.NewTimer(0)
	defer t.Stop()
	for ; ; n++ {
		intended := start.Add(time.Duration(n) * interval)
		if intended.Sub(start) >= d {
			break
		}
		if wait := time.Until(intended); wait > 0 {
			t.Reset(wait)
			select {
			case <-t.C:
			case <-ctx.Done():
				wg.Wait()
				return n
			}
		}
		sem <- struct{}{}
		i := n
		wg.Go(func() {
			defer func() { <-sem }()
			call(ctx, i, intended)
		})
	}
	wg.Wait()
	return n
}

// Outcomes returns a copy of the recorded outcomes.
func (l *Ledger) Outcomes() []Outcome {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.outcomes)
}

// Executions returns how many executions of id were recorded.
func (l *Ledger) Executions(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.execs[id]
}

// Call makes call number i of method through inv, with params that the
// echoing agents return ({"i":N}), and records its outcome against its
// intended start.
// A call that has not returned HangAfter after it started gets no
// outcome: it counts as lost (Summarize), and Call returns, so that a
// hung request fails the scenario instead of hanging it.
func (l *Ledger) Call(ctx context.Context, inv envelope.Invoker, method string, idempotent bool, i int, intended time.Time) {
	want := fmt.Sprintf(`{"i":%d}`, i)
	req := &envelope.Request{ID: envelope.NewID(), Method: method, Params: json.RawMessage(want)}
	type ret struct {
		res *envelope.Response
		err error
	}
	done := make(chan ret, 1)
	go func() {
		res, err := inv(ctx, req)
		done <- ret{res, err}
	}()
	hang := time.NewTimer(HangAfter)
	defer hang.Stop()
	var res *envelope.Response
	var err error
	select {
	case r := <-done:
		res, err = r.res, r.err
	case <-hang.C:
		return // no outcome: lost
	}
	o := Outcome{ID: req.ID, Method: method, Idempotent: idempotent, Intended: intended, End: time.Now(), Want: want}
	if err != nil {
		e := envelope.AsError(err)
		o.Code, o.NotSent = e.Code, e.NotSent()
	} else {
		o.Echo = string(res.Result)
	}
	l.Record(o)
}

// Emit prints one figures line of a scenario (a []byte or string as it
// is, anything else as JSON) on standard output and, when
// $MESH_SCENARIO_LOG names a file, appends it there too: go test shows
// a passing package's output only with -v, and CI prints that file so
// that every run's figures are on record.
func Emit(v any) {
	var b []byte
	switch x := v.(type) {
	case []byte:
		b = x
	case string:
		b = []byte(x)
	default:
		b, _ = json.Marshal(x)
	}
	line := append(bytes.TrimRight(b, "\n"), '\n')
	_, _ = os.Stdout.Write(line)
	if path := os.Getenv("MESH_SCENARIO_LOG"); path != "" {
		logMu.Lock()
		defer logMu.Unlock()
		if f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			_, _ = f.Write(line)
			_ = f.Close()
		}
	}
}

var logMu sync.Mutex
