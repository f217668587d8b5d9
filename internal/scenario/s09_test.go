//go:build scenario

package scenario_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/scenario"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/reliability"
)

// attemptLog records, per request id, the attempts agents executed.
type attemptLog struct {
	mu sync.Mutex
	m  map[string][]attemptRec
}

type attemptRec struct {
	retry    int
	instance string
	at       time.Time
}

func (l *attemptLog) add(ctx context.Context, instance string) attemptRec {
	r := agents.RequestFrom(ctx)
	rec := attemptRec{r.Headers.RetryCount, instance, time.Now()}
	l.mu.Lock()
	l.m[r.ID] = append(l.m[r.ID], rec)
	l.mu.Unlock()
	return rec
}

func (l *attemptLog) get(id string) []attemptRec {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.m[id])
}

// call makes one call and records it in the ledger.
func call(t *testing.T, c *mesh.Client, led *scenario.Ledger, method string, idem bool, i int) {
	led.Call(t.Context(), c.Invoke, method, idem, i, time.Now())
}

// TestS09RetrySemantics is scenario S09 of RELIABILITY.md.
func TestS09RetrySemantics(t *testing.T) {
	n := 1000
	if testing.Short() {
		n = 200
	}
	t.Run("a idempotent UNAVAILABLE twice then OK", func(t *testing.T) {
		m := meshtest.Start(t, hub.Config{Reliability: config("s09a", reliability.Policy{Timeout: 5 * time.Second, Retries: 3, Idempotent: true,
			Backoff: reliability.BackoffConfig{Strategy: reliability.Fixed, Initial: time.Millisecond}}, nil)})
		log := &attemptLog{m: map[string][]attemptRec{}}
		for i := range 3 {
			id := fmt.Sprintf("a%d", i)
			a := agents.New("s09a", agents.WithID(id))
			a.Handle("s09a.work", func(ctx context.Context, p json.RawMessage) (any, error) {
				if rec := log.add(ctx, id); rec.retry < 2 {
					return nil, envelope.NewError(envelope.CodeUnavailable, "not yet")
				}
				return p, nil
			})
			m.RunAgent(t, a)
		}
		c := m.Client(t, mesh.WithoutReliability())
		led := scenario.NewLedger()
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Go(func() {
				for i := w; i < n; i += 8 {
					call(t, c, led, "s09a.work", true, i)
				}
			})
		}
		wg.Wait()
		s := led.Summarize("S09a", n)
		report(t, s)
		if s.Succeeded != n {
			t.Errorf("succeeded %d of %d", s.Succeeded, n)
		}
		led2 := 0
		for id, recs := range log.m {
			if len(recs) != 3 {
				t.Fatalf("request %s executed %d times; want exactly 3", id, len(recs))
			}
			seen := map[string]bool{}
			for i, r := range recs {
				if r.retry != i {
					t.Fatalf("request %s attempt %d carried retryCount %d", id, i, r.retry)
				}
				seen[r.instance] = true
			}
			if len(seen) >= 2 {
				led2++
			}
		}
		if led2 != n {
			t.Errorf("%d of %d requests spread their 3 attempts over at least 2 instances; want all", led2, n)
		}
	})

	t.Run("b not idempotent, link drops after the handler ran", func(t *testing.T) {
		rc := config("s09b", reliability.Policy{Timeout: 5 * time.Second, Retries: 3,
			Backoff: reliability.BackoffConfig{Strategy: reliability.Fixed, Initial: time.Millisecond}}, nil)
		m := meshtest.Start(t, hub.Config{Reliability: rc})
		c := m.Client(t, mesh.WithReliability(*rc))
		led := scenario.NewLedger()
		k := 50
		for i := range k {
			var l *link.Link
			ran := make(chan struct{})
			l, err := link.Dial(t.Context(), m.WS, link.Config{}, link.WithHandler(
				func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
					led.Executed(req.ID, 1)
					close(ran)
					<-ctx.Done() // the link drops before we answer
					return nil, ctx.Err()
				}))
			if err != nil {
				t.Fatal(err)
			}
			reg, _ := json.Marshal(control.RegisterParams{AgentID: fmt.Sprintf("b%d", i), Capabilities: []string{"s09b.work"}})
			if _, err := l.Call(t.Context(), &envelope.Request{Method: "agent.register", Params: reg}); err != nil {
				t.Fatal(err)
			}
			go func() { <-ran; l.Close() }()
			call(t, c, led, "s09b.work", false, i)
			l.Close()
			// The next call must find only the next instance: while this
			// one is still listed, a call can pick it, fail not sent on
			// its closed link and, with the retry budget spent, end not
			// sent without reaching any handler (true, but not case b).
			id := fmt.Sprintf("b%d", i)
			meshtest.WaitFor(t, 5*time.Second, func() bool { return m.Hub.Registry().Snapshot().Instance(id) == nil })
		}
		s := led.Summarize("S09b", k)
		report(t, s)
		if s.Failed["UNAVAILABLE"] != k {
			t.Errorf("outcomes %+v; want all %d UNAVAILABLE (may have executed, not retried)", s.Failed, k)
		}
		if s.Indeterminate != k {
			t.Errorf("indeterminate %d; want %d: the errors must not claim 'not sent'", s.Indeterminate, k)
		}
	})

	t.Run("c not idempotent, refused before send, retried", func(t *testing.T) {
		rc := config("s09c", reliability.Policy{Timeout: 5 * time.Second, Retries: 3,
			Backoff: reliability.BackoffConfig{Strategy: reliability.Fixed, Initial: 80 * time.Millisecond}}, func(rc *reliability.Config) {
			rc.Bulkhead = reliability.BulkheadConfig{MaxConcurrent: 1, QueueSize: 0}
		})
		m := meshtest.Start(t, hub.Config{Reliability: rc})
		led := scenario.NewLedger()
		a := agents.New("s09c")
		a.Handle("s09c.work", func(ctx context.Context, p json.RawMessage) (any, error) {
			led.Executed(agents.RequestFrom(ctx).ID, 1)
			time.Sleep(30 * time.Millisecond)
			return p, nil
		})
		m.RunAgent(t, a)
		// The client retries what the hub refused before sending (its own
		// bulkhead is left wide).
		crc := *rc
		crc.Bulkhead = reliability.DefaultBulkheadConfig()
		c := m.Client(t, mesh.WithReliability(crc))
		k := 40
		var wg sync.WaitGroup
		for i := range k {
			wg.Go(func() { call(t, c, led, "s09c.work", false, i) })
			if i%2 == 1 {
				wg.Wait() // pairs: one runs, the other is refused with OVERLOADED and retried
			}
		}
		s := led.Summarize("S09c", k)
		report(t, s)
		if s.Succeeded != k {
			t.Errorf("succeeded %d of %d; want all (OVERLOADED before send is retried)", s.Succeeded, k)
		}
		for _, o := range led.Outcomes() {
			if n := led.Executions(o.ID); n != 1 {
				t.Errorf("request %s executed %d times; want exactly 1", o.ID, n)
			}
		}
	})

	t.Run("d caller errors are not retried", func(t *testing.T) {
		rc := config("s09d", reliability.Policy{Timeout: 5 * time.Second, Retries: 3, Idempotent: true}, nil)
		m := meshtest.Start(t, hub.Config{Reliability: rc})
		led := scenario.NewLedger()
		a := agents.New("s09d")
		a.Handle("s09d.bad", func(ctx context.Context, p json.RawMessage) (any, error) {
			led.Executed(agents.RequestFrom(ctx).ID, 1)
			return nil, envelope.NewError(envelope.CodeInvalidParams, "no")
		})
		a.Handle("s09d.fail", func(ctx context.Context, p json.RawMessage) (any, error) {
			led.Executed(agents.RequestFrom(ctx).ID, 1)
			return nil, envelope.NewError(envelope.CodeRPCError, "handler failed")
		})
		m.RunAgent(t, a)
		c := m.Client(t, mesh.WithReliability(*rc))
		for i := range n / 2 {
			call(t, c, led, "s09d.bad", true, i)
			call(t, c, led, "s09d.fail", true, i)
		}
		s := led.Summarize("S09d", n/2*2)
		report(t, s)
		if s.Failed["INVALID_PARAMS"] != n/2 || s.Failed["RPC_ERROR"] != n/2 {
			t.Errorf("outcomes %+v", s.Failed)
		}
		for _, o := range led.Outcomes() {
			if k := led.Executions(o.ID); k != 1 {
				t.Fatalf("request %s executed %d times; want 1", o.ID, k)
			}
		}
	})

	t.Run("e backoff gaps and the deadline", func(t *testing.T) {
		ms := time.Millisecond
		m := meshtest.Start(t, hub.Config{Reliability: config("s09e", reliability.Policy{Timeout: 5 * time.Second, Retries: 3, Idempotent: true,
			Backoff: reliability.BackoffConfig{Strategy: reliability.Linear, Initial: 20 * ms, Max: 40 * ms, Jitter: true}}, nil)})
		log := &attemptLog{m: map[string][]attemptRec{}}
		a := agents.New("s09e")
		a.Handle("s09e.work", func(ctx context.Context, p json.RawMessage) (any, error) {
			log.add(ctx, "e")
			return nil, envelope.NewError(envelope.CodeUnavailable, "down")
		})
		m.RunAgent(t, a)
		c := m.Client(t, mesh.WithoutReliability())
		for i := range 20 {
			req := &envelope.Request{ID: envelope.NewID(), Method: "s09e.work", Params: json.RawMessage(fmt.Sprint(i))}
			_, err := c.Invoke(t.Context(), req)
			if envelope.CodeOf(err) != envelope.CodeUnavailable {
				t.Fatalf("error = %v; want the last attempt's UNAVAILABLE", err)
			}
			recs := log.get(req.ID)
			if len(recs) != 4 {
				t.Fatalf("%d attempts; want 4", len(recs))
			}
			for j := 1; j < len(recs); j++ {
				if gap := recs[j].at.Sub(recs[j-1].at); gap < 10*ms || gap > 40*ms+15*ms {
					t.Errorf("gap before attempt %d = %v; want within [initial×(1−jitter), max] = [10ms, 40ms] (+15ms slack for the hops)", j, gap)
				}
			}
		}
		// A deadline shorter than the next backoff: no attempt starts after
		// it, and the answer carries the last attempt's code.
		req := &envelope.Request{ID: envelope.NewID(), Method: "s09e.work"}
		deadline := time.Now().Add(15 * ms)
		ctx, cancel := context.WithDeadline(t.Context(), deadline)
		defer cancel()
		_, err := c.Invoke(ctx, req)
		if code := envelope.CodeOf(err); code != envelope.CodeUnavailable && code != envelope.CodeTimeout {
			t.Errorf("error = %v; want UNAVAILABLE or TIMEOUT naming it", err)
		}
		time.Sleep(60 * ms)
		for _, r := range log.get(req.ID) {
			if r.at.After(deadline) {
				t.Errorf("an attempt started %v after the deadline", r.at.Sub(deadline))
			}
		}
	})

	t.Run("f pushback honoured", func(t *testing.T) {
		m := meshtest.Start(t, hub.Config{Reliability: config("s09f", reliability.Policy{Timeout: 5 * time.Second, Retries: 2, Idempotent: true,
			Backoff: reliability.BackoffConfig{Strategy: reliability.Fixed, Initial: time.Millisecond}}, nil)})
		log := &attemptLog{m: map[string][]attemptRec{}}
		a := agents.New("s09f")
		a.Handle("s09f.work", func(ctx context.Context, p json.RawMessage) (any, error) {
			if rec := log.add(ctx, "f"); rec.retry == 0 {
				return nil, envelope.NewError(envelope.CodeOverloaded, "slow down").WithData(map[string]int{"retryAfterMs": 100})
			}
			return p, nil
		})
		m.RunAgent(t, a)
		c := m.Client(t, mesh.WithoutReliability())
		for i := range 10 {
			req := &envelope.Request{ID: envelope.NewID(), Method: "s09f.work", Params: json.RawMessage(fmt.Sprint(i))}
			if _, err := c.Invoke(t.Context(), req); err != nil {
				t.Fatal(err)
			}
			recs := log.get(req.ID)
			if len(recs) != 2 || recs[1].at.Sub(recs[0].at) < 100*time.Millisecond {
				t.Errorf("attempts %+v; want the retry no sooner than the 100ms pushback", recs)
			}
		}
	})
}
