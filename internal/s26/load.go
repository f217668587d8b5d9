package s26

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/mesh"
)

// Schedule is the attack's timetable: from Start, windows of Window
// alternate quiet and loaded, quiet first and last, Loaded of them
// loaded. With Control, loaded windows alternate hostile (the corpus)
// and benign (the same connections sending well-formed calls at the same
// rate); without, all are hostile. Both processes read the same clock.
type Schedule struct {
	Start   time.Time
	Window  time.Duration
	Loaded  int
	Control bool
}

// LoadedWindow is the k-th loaded window and whether it is hostile.
func (s Schedule) LoadedWindow(k int) (from, to time.Time, hostile bool) {
	from = s.Start.Add(time.Duration(2*k+1) * s.Window)
	return from, from.Add(s.Window), !s.Control || k%2 == 0
}

// End is the end of the last (quiet) window.
func (s Schedule) End() time.Time { return s.Start.Add(time.Duration(2*s.Loaded+1) * s.Window) }

// Settle is how long after a loaded window the hub may still be
// finishing its last messages: calls starting then count for no figure.
const Settle = 100 * time.Millisecond

// Split sorts the legitimate calls: under attack (or under benign load)
// if they overlap a hostile (benign) window at all; healthy if they lie
// wholly in a quiet window, past Settle after the loaded window before
// it; others (before the start, straddling the settling time) are not
// counted.
func (s Schedule) Split(samples []Sample) (healthy, hostile, benign []time.Duration) {
	for _, x := range samples {
		s0, s1 := x.Start, x.Start.Add(x.D)
		if s0.Before(s.Start) || s1.After(s.End()) {
			continue
		}
		in, settled := 0, true // in: 1 hostile, 2 benign
		for k := range s.Loaded {
			from, to, h := s.LoadedWindow(k)
			if s0.Before(to) && s1.After(from) {
				in = 2
				if h {
					in = 1
				}
				break
			}
			if !s0.Before(to) && s0.Before(to.Add(Settle)) {
				settled = false
			}
		}
		switch {
		case in == 1:
			hostile = append(hostile, x.D)
		case in == 2:
			benign = append(benign, x.D)
		case settled:
			healthy = append(healthy, x.D)
		}
	}
	return healthy, hostile, benign
}

// RunWindows calls traffic for each loaded window in turn, at its start,
// with a context that ends with it, and waits for traffic to return. It
// returns early, with ctx's error, when ctx ends.
func (s Schedule) RunWindows(ctx context.Context, traffic func(ctx context.Context, k int, hostile bool)) error {
	for k := range s.Loaded {
		from, to, hostile := s.LoadedWindow(k)
		t := time.NewTimer(time.Until(from))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wctx, cancel := context.WithDeadline(ctx, to)
		traffic(wctx, k, hostile)
		cancel()
	}
	return ctx.Err()
}

// Sample is one legitimate call: when it started and how long it took.
type Sample struct {
	Start time.Time
	D     time.Duration
}

// LegitLoad calls echo.echo on c at rate per second (open loop: one call
// per tick, whatever the previous ones do; a starved ticker drops ticks)
// until ctx ends. Its result waits for the calls in flight and returns
// the successful ones, the count of failures and the first few errors.
func LegitLoad(ctx context.Context, c *mesh.Client, rate int) (samples func() ([]Sample, int64, []string)) {
	var mu sync.Mutex
	var ss []Sample
	var fails int64
	var errs []string
	var wg sync.WaitGroup
	wg.Go(func() {
		tk := time.NewTicker(time.Second / time.Duration(rate))
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
			}
			wg.Go(func() {
				cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				start := time.Now()
				var got string
				err := c.Call(cctx, "echo.echo", "legit", &got)
				d := time.Since(start)
				mu.Lock()
				defer mu.Unlock()
				if err != nil || got != "legit" {
					fails++
					if len(errs) < 5 {
						errs = append(errs, fmt.Sprintf("%v (got %q)", err, got))
					}
					return
				}
				ss = append(ss, Sample{start, d})
			})
		}
	})
	return func() ([]Sample, int64, []string) {
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return ss, fails, errs
	}
}

// NewCounter returns the agent "count" the corpus calls: count.hit and
// count.other count their calls in hits and others. A hostile message
// that must execute nothing leaves both alone; "method and METHOD"
// (routed to the method named by "method") adds one to hits, never to
// others.
func NewCounter() (a *agents.Agent, hits, others *atomic.Int64) {
	hits, others = new(atomic.Int64), new(atomic.Int64)
	a = agents.New("count")
	a.Handle("count.hit", func(context.Context, json.RawMessage) (any, error) { hits.Add(1); return "hit", nil })
	a.Handle("count.other", func(context.Context, json.RawMessage) (any, error) { others.Add(1); return "other", nil })
	return a, hits, others
}
