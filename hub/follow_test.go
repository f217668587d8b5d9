package hub_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/registry"
	"github.com/agentmesh/agentmesh/registry/memory"
)

// laggingRegistry is a registry whose view lags its writes, as a cluster
// registry's does (a write is acknowledged before the watch brings it
// back): Snapshot and Watch give each snapshot lag after it was made.
type laggingRegistry struct {
	*memory.Registry
	lag time.Duration

	mu      sync.Mutex
	view    *registry.Snapshot
	watches []chan *registry.Snapshot
	stop    chan struct{}
	done    chan struct{}
}

func newLaggingRegistry(lag time.Duration) *laggingRegistry {
	r := &laggingRegistry{Registry: memory.New(), lag: lag, view: registry.Empty(), stop: make(chan struct{}), done: make(chan struct{})}
	src, _ := r.Registry.Watch(context.Background())
	go func() {
		defer close(r.done)
		for {
			select {
			case s, ok := <-src:
				if !ok {
					return
				}
				time.AfterFunc(lag, func() {
					r.mu.Lock()
					defer r.mu.Unlock()
					if s.Rev < r.view.Rev {
						return
					}
					r.view = s
					for _, ch := range r.watches {
						select {
						case <-ch:
						default:
						}
						ch <- s
					}
				})
			case <-r.stop:
				return
			}
		}
	}()
	return r
}

func (r *laggingRegistry) Snapshot() *registry.Snapshot {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.view
}

func (r *laggingRegistry) Watch(ctx context.Context) (<-chan *registry.Snapshot, error) {
	ch := make(chan *registry.Snapshot, 1)
	r.mu.Lock()
	ch <- r.view
	r.watches = append(r.watches, ch)
	r.mu.Unlock()
	return ch, nil
}

func (r *laggingRegistry) Close() error {
	close(r.stop)
	err := r.Registry.Close()
	<-r.done
	time.Sleep(2 * r.lag) // the lagging deliveries in flight
	r.mu.Lock()
	for _, ch := range r.watches {
		close(ch)
	}
	r.watches = nil
	r.mu.Unlock()
	return err
}

// TestFollowDoesNotCloseLiveLinks reproduces the race issue [M11c]
// measured (4-8 live links closed at 1,000 agents): the hub compared its
// bindings with a registry view that predates registrations already
// acknowledged, took them for gone and closed their links. Here the
// registry's view lags its writes by 30 ms, and 40 agents register one
// after another: every snapshot the hub follows lacks the latest
// registrations. No link may be closed, and every agent answers.
func TestFollowDoesNotCloseLiveLinks(t *testing.T) {
	reg := newLaggingRegistry(30 * time.Millisecond)
	m := meshtest.Start(t, hub.Config{}, hub.WithRegistry(reg))
	t.Cleanup(func() { _ = reg.Close() })
	const n = 40
	as := make([]*agents.Agent, n)
	for i := range as {
		as[i] = agents.NewEcho(agents.WithID("echo-" + string(rune('a'+i%26)) + string(rune('a'+i/26))))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		t.Cleanup(func() { cancel(); <-done })
		go func(a *agents.Agent) { defer close(done); _ = a.Run(ctx, m.WS) }(as[i])
		select {
		case <-as[i].Registered():
		case <-time.After(10 * time.Second):
			t.Fatalf("agent %d did not register", i)
		}
	}
	time.Sleep(200 * time.Millisecond) // every lagging view delivered and followed
	c := m.Client(t)
	for _, a := range as {
		select {
		case <-a.Registered():
		default:
			t.Fatalf("agent %s lost its registration: its link was closed", a.ID())
		}
		if err := c.Call(t.Context(), "echo.echo", "hi", nil, mesh.To(a.ID())); err != nil {
			t.Fatalf("agent %s: %v", a.ID(), err)
		}
	}
}
