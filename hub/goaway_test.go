package hub_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
)

// TestGoAwayMovesClientAndAgent: hub A begins to drain while a call is in
// flight on it. A sends goaway: the agent registers on hub B and leaves A,
// the client sends new calls to B at once, and the call A admitted still
// completes over the old links.
func TestGoAwayMovesClientAndAgent(t *testing.T) {
	a := meshtest.Start(t, hub.Config{DrainTimeout: 5 * time.Second})
	b := meshtest.Start(t, hub.Config{})
	ag := agents.NewEcho(agents.WithID("echo-1"))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = ag.Run(ctx, a.WS, b.WS) })
	defer func() { cancel(); wg.Wait() }()
	<-ag.Registered()
	c, err := mesh.NewClient([]string{a.WS, b.WS}, mesh.WithoutReliability())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Call(t.Context(), "echo.echo", 1, nil); err != nil {
		t.Fatal(err)
	}

	slow := make(chan error, 1)
	go func() { slow <- c.Call(t.Context(), "echo.sleep", map[string]int{"ms": 400}, nil) }()
	meshtest.WaitFor(t, 2*time.Second, func() bool { return c.Pending() == 1 })
	a.Hub.BeginDrain()
	began := time.Now()
	// The agent moves to B and leaves A's registry.
	meshtest.WaitFor(t, 2*time.Second, func() bool {
		return b.Hub.Registry().Snapshot().Instance("echo-1") != nil && a.Hub.Registry().Snapshot().Instance("echo-1") == nil
	})
	moved := time.Since(began)
	// New calls go to B, and succeed, while the slow call is still on A.
	var res envelope.Response
	if err := c.Call(t.Context(), "echo.echo", 2, nil, mesh.ResponseInto(&res)); err != nil {
		t.Fatalf("new call after goaway = %v; want it served through hub B", err)
	}
	select {
	case err := <-slow:
		t.Fatalf("the call in flight on A ended (%v) before its 400 ms", err)
	default:
	}
	if err := <-slow; err != nil {
		t.Errorf("the call A admitted before the drain = %v; want it to complete", err)
	}
	t.Logf("agent on B and gone from A %v after BeginDrain", moved.Round(time.Millisecond))
	if moved > time.Second {
		t.Errorf("the agent moved after %v; want at once (well under 1 s)", moved)
	}
	meshtest.WaitFor(t, 2*time.Second, func() bool { return c.Pending() == 0 && ag.Pending() == 0 })
}

// TestLinkGoAway: SendGoAway closes the peer's GoAway channel and leaves
// the link open for the answers still due.
func TestLinkGoAway(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	l, err := link.Dial(t.Context(), m.WS, link.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	select {
	case <-l.GoAway():
		t.Fatal("goaway before the hub drains")
	default:
	}
	m.Hub.BeginDrain()
	select {
	case <-l.GoAway():
	case <-time.After(2 * time.Second):
		t.Fatal("no goaway within 2 s of BeginDrain")
	}
	if l.Err() != nil {
		t.Fatalf("link closed on goaway: %v", l.Err())
	}
	// The draining hub refuses new calls on it, as not sent.
	_, err = l.Call(t.Context(), &envelope.Request{ID: envelope.NewID(), Method: "mesh.ping"})
	if e := envelope.AsError(err); e.Code != envelope.CodeUnavailable || !e.NotSent() {
		t.Errorf("call on a draining hub = %v; want UNAVAILABLE, not sent", err)
	}
}

// TestRedial: every delay is at least 100 ms; the ceiling is 1 s for the
// first four and never above 5 s; the delays are spread, not equal.
func TestRedial(t *testing.T) {
	for range 200 {
		var r link.Redial
		for n := range 20 {
			d := r.Next()
			ceil := link.RedialMax
			if n < 4 {
				ceil = link.RedialInitial
			}
			if d < link.RedialMin || d > ceil {
				t.Fatalf("delay %d = %v; want within [%v, %v]", n, d, link.RedialMin, ceil)
			}
		}
	}
	var r link.Redial
	lo, hi := time.Hour, time.Duration(0)
	for range 100 {
		r.Reset()
		d := r.Next()
		lo, hi = min(lo, d), max(hi, d)
	}
	if hi-lo < 400*time.Millisecond {
		t.Errorf("first delays span only %v..%v: not jittered", lo, hi)
	}
}

// TestDrainingRefusalRedirects: calls race hub A's drain. One that
// reaches A after the drain began but before the client heard A's goaway
// is refused unexecuted, after a goaway on the same link; the client sends
// it on to hub B instead of failing it, even without retries. So no call
// fails, and on a raw link no refusal comes before the goaway.
func TestDrainingRefusalRedirects(t *testing.T) {
	for round := range 5 {
		a := meshtest.Start(t, hub.Config{DrainTimeout: 5 * time.Second})
		b := meshtest.Start(t, hub.Config{})
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for hb, url := range map[string]string{"a": a.WS, "b": b.WS} {
			ag := agents.NewEcho(agents.WithID("echo-" + hb))
			wg.Go(func() { _ = ag.Run(ctx, url) })
			<-ag.Registered()
		}
		c, err := mesh.NewClient([]string{a.WS, b.WS}, mesh.WithoutReliability())
		if err != nil {
			t.Fatal(err)
		}
		raw, err := link.Dial(t.Context(), a.WS, link.Config{})
		if err != nil {
			t.Fatal(err)
		}
		var (
			mu      sync.Mutex
			calls   int
			failed  []error
			refused int
		)
		stop := make(chan struct{})
		var callers sync.WaitGroup
		for range 4 {
			callers.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					err := c.Call(t.Context(), "echo.echo", 1, nil)
					mu.Lock()
					calls++
					if err != nil {
						failed = append(failed, err)
					}
					mu.Unlock()
				}
			})
		}
		callers.Go(func() {
			for {
				_, err := raw.Call(t.Context(), &envelope.Request{ID: envelope.NewID(), Method: "echo.echo", Params: []byte("1"), Version: envelope.Version})
				if err != nil {
					goaway := false
					select {
					case <-raw.GoAway():
						goaway = true
					default:
					}
					mu.Lock()
					refused++
					if !goaway {
						failed = append(failed, fmt.Errorf("raw link: refused (%w) before any goaway", err))
					}
					mu.Unlock()
					return
				}
			}
		})
		time.Sleep(30 * time.Millisecond)
		a.Hub.BeginDrain()
		time.Sleep(50 * time.Millisecond)
		close(stop)
		callers.Wait()
		raw.Close()
		c.Close()
		cancel()
		wg.Wait()
		t.Logf("round %d: %d calls, %d failed, raw link refused %d", round, calls, len(failed), refused)
		for _, err := range failed {
			t.Errorf("round %d: %v", round, err)
		}
	}
}
