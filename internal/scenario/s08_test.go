//go:build scenario

package scenario_test

import (
	"context"
	"encoding/json"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/registry/etcd"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
	"github.com/agentmesh/agentmesh/reliability"
)

// TestS08DeadlineAndCancel is scenario S08 on one hub: a handler that
// sleeps 10 s but watches its context; the client (a) times out at 1 s,
// (b) cancels at 300 ms, (c) goes away mid-call. In every case the
// handler's context ends within 100 ms of the client's deadline or cancel,
// and goroutines return to their baseline.
func TestS08DeadlineAndCancel(t *testing.T) {
	rc := config("s08", reliability.Policy{Timeout: 30 * time.Second}, nil)
	m := meshtest.Start(t, hub.Config{Reliability: rc})
	runS08(t, rc, m, m)
}

// TestS08ThreeHops is S08 as the scenario sets it: client → hub A → hub B
// → agent, the hubs on a real etcd, the call crossing a peer link; the
// deadline and the cancel travel both hops.
func TestS08ThreeHops(t *testing.T) {
	srv := etcdtest.Start(t)
	rc := config("s08", reliability.Policy{Timeout: 30 * time.Second}, nil)
	hub := func(name string) *meshtest.Mesh {
		reg, err := etcd.New(etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: "/s08/", Hub: "hub-" + name}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return meshtest.StartCluster(t, hub.Config{ID: "hub-" + name, Reliability: rc}, reg)
	}
	a, b := hub("A"), hub("B")
	runS08(t, rc, a, b)
}

func runS08(t *testing.T, rc *reliability.Config, m, agentHub *meshtest.Mesh) {
	rounds := 5
	if !testing.Short() {
		rounds = 20
	}
	type seen struct {
		ttl   int64
		ended time.Time
	}
	var mu sync.Mutex
	ends := map[string]seen{}
	a := agents.New("s08")
	a.Handle("s08.sleep", func(ctx context.Context, _ json.RawMessage) (any, error) {
		r := agents.RequestFrom(ctx)
		select {
		case <-time.After(10 * time.Second):
		case <-ctx.Done():
		}
		mu.Lock()
		ends[r.ID] = seen{r.Headers.TTL, time.Now()}
		mu.Unlock()
		return nil, ctx.Err()
	})
	agentHub.RunAgent(t, a)
	meshtest.WaitFor(t, 5*time.Second, func() bool { return len(m.Hub.Registry().Snapshot().Lookup("s08.sleep")) == 1 })
	if m != agentHub {
		// Warm the peer link, so the baseline counts its goroutines.
		c := m.Client(t, mesh.WithoutReliability())
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		_ = c.Call(ctx, "s08.sleep", nil, nil)
		cancel()
		time.Sleep(200 * time.Millisecond)
	}
	baseline := runtime.NumGoroutine()

	check := func(t *testing.T, id string, at time.Time, ttlMax int64) {
		t.Helper()
		var s seen
		meshtest.WaitFor(t, 2*time.Second, func() bool {
			mu.Lock()
			defer mu.Unlock()
			var ok bool
			s, ok = ends[id]
			return ok
		})
		if d := s.ended.Sub(at); d > 100*time.Millisecond {
			t.Errorf("handler context ended %v after the client's deadline or cancel; want <= 100ms", d)
		}
		if ttlMax > 0 && s.ttl > ttlMax {
			t.Errorf("agent saw ttl %dms; want <= the client's %dms", s.ttl, ttlMax)
		}
	}
	c := m.Client(t, mesh.WithReliability(*rc))
	t.Run("a timeout", func(t *testing.T) {
		for range rounds {
			var wg sync.WaitGroup
			for range 50 {
				wg.Go(func() {
					req := &envelope.Request{ID: envelope.NewID(), Method: "s08.sleep"}
					ctx, cancel := context.WithTimeout(t.Context(), time.Second)
					defer cancel()
					start := time.Now()
					deadline, _ := ctx.Deadline()
					_, err := c.Invoke(ctx, req)
					if took := time.Since(start); envelope.CodeOf(err) != envelope.CodeTimeout || took < 950*time.Millisecond || took > 1050*time.Millisecond {
						t.Errorf("got %v after %v; want TIMEOUT at 1s ± 50ms", err, took)
					}
					check(t, req.ID, deadline, 1000)
				})
			}
			wg.Wait()
		}
	})
	t.Run("b cancel", func(t *testing.T) {
		for range rounds {
			var wg sync.WaitGroup
			for range 50 {
				wg.Go(func() {
					req := &envelope.Request{ID: envelope.NewID(), Method: "s08.sleep"}
					ctx, cancel := context.WithCancel(t.Context())
					var at time.Time
					time.AfterFunc(300*time.Millisecond, func() { at = time.Now(); cancel() })
					_, err := c.Invoke(ctx, req)
					if envelope.CodeOf(err) != envelope.CodeCancelled || time.Since(at) > 50*time.Millisecond {
						t.Errorf("got %v %v after the cancel; want CANCELLED within 50ms", err, time.Since(at))
					}
					check(t, req.ID, at, 0)
				})
			}
			wg.Wait()
		}
	})
	t.Run("c client goes away", func(t *testing.T) {
		gone, err := mesh.NewClient([]string{m.WS}, mesh.WithoutReliability())
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		var wg sync.WaitGroup
		var idMu sync.Mutex
		for range 50 {
			wg.Go(func() {
				req := &envelope.Request{ID: envelope.NewID(), Method: "s08.sleep"}
				idMu.Lock()
				ids = append(ids, req.ID)
				idMu.Unlock()
				_, _ = gone.Invoke(t.Context(), req)
			})
		}
		time.Sleep(300 * time.Millisecond)
		at := time.Now()
		_ = gone.Close()
		wg.Wait()
		for _, id := range ids {
			check(t, id, at, 0)
		}
	})
	// Goroutines back to baseline: every handler, pending call and link
	// entry of the 50 × rounds calls is gone.
	meshtest.WaitFor(t, 2*time.Second, func() bool { return runtime.NumGoroutine() <= baseline+5 })
}
