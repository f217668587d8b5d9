package hub

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/registry"
	"github.com/agentmesh/agentmesh/registry/memory"
)

// resyncRegistry is a memory registry that says when it last listed its
// content, as the etcd one does (LastSync).
type resyncRegistry struct {
	registry.Registry
	last atomic.Int64
}

func (r *resyncRegistry) LastSync() time.Time {
	if ns := r.last.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// TestWarmUpWindow (M9 F): within two heartbeat intervals of the hub's
// start, and of its registry's last resync, a method no agent has
// registered is answered UNAVAILABLE, not sent, and retried by the hub's
// own loop; outside them, METHOD_NOT_FOUND at once, as before. A method
// registered and gone is UNAVAILABLE at once either way (S22).
func TestWarmUpWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := &resyncRegistry{Registry: memory.New()}
		defer reg.Close()
		h, err := New(Config{HeartbeatInterval: time.Second}, WithRegistry(reg))
		if err != nil {
			t.Fatal(err)
		}
		defer h.Shutdown(context.Background())
		start := time.Now()
		call := func(method string) (*envelope.Error, time.Duration) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			t0 := time.Now()
			_, err := h.ingress(ctx, &envelope.Request{ID: envelope.NewID(), Method: method, Version: envelope.Version})
			return envelope.AsError(err), time.Since(t0)
		}
		if _, err := reg.Register(t.Context(), registry.Registration{InstanceID: "gone-1", Name: "gone", Hub: h.ID(), Capabilities: []string{"gone.work"}, HeartbeatInterval: time.Second}); err != nil {
			t.Fatal(err)
		}
		if err := reg.Deregister(t.Context(), "gone-1"); err != nil {
			t.Fatal(err)
		}
		warm := func(when string) {
			t.Helper()
			e, took := call("ghost.work")
			if e.Code != envelope.CodeUnavailable || !e.NotSent() || e.Attempts() != 3 || took == 0 {
				t.Errorf("%s: ghost.work = %v (not sent %v, %d attempts) after %v; want UNAVAILABLE, not sent, retried by the hub (3 attempts)",
					when, e, e.NotSent(), e.Attempts(), took)
			}
			if e, took := call("gone.work"); e.Code != envelope.CodeUnavailable || e.Attempts() != 1 || took != 0 {
				t.Errorf("%s: gone.work = %v (%d attempts) after %v; want UNAVAILABLE at once", when, e, e.Attempts(), took)
			}
		}
		cold := func(when string) {
			t.Helper()
			if e, took := call("ghost.work"); e.Code != envelope.CodeMethodNotFound || e.Attempts() != 1 || took != 0 {
				t.Errorf("%s: ghost.work = %v (%d attempts) after %v; want METHOD_NOT_FOUND at once", when, e, e.Attempts(), took)
			}
			if e, took := call("gone.work"); e.Code != envelope.CodeUnavailable || e.Attempts() != 1 || took != 0 {
				t.Errorf("%s: gone.work = %v (%d attempts) after %v; want UNAVAILABLE at once", when, e, e.Attempts(), took)
			}
		}
		warm("at start")
		time.Sleep(time.Until(start.Add(1500 * time.Millisecond)))
		warm("1.5 s after the start")
		time.Sleep(time.Until(start.Add(2 * time.Second)))
		cold("2 s (two heartbeat intervals) after the start")

		reg.last.Store(time.Now().UnixNano()) // the registry lists its content again
		warm("after a resync")
		time.Sleep(2 * time.Second)
		cold("2 s after the resync")
	})
}

// TestWarmUpOff: WarmUp < 0 turns the window off.
func TestWarmUpOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, err := New(Config{HeartbeatInterval: time.Second, WarmUp: -1})
		if err != nil {
			t.Fatal(err)
		}
		defer h.Shutdown(context.Background())
		_, err = h.ingress(t.Context(), &envelope.Request{ID: envelope.NewID(), Method: "ghost.work", Version: envelope.Version})
		if envelope.CodeOf(err) != envelope.CodeMethodNotFound {
			t.Errorf("ghost.work at start with no warm-up = %v; want METHOD_NOT_FOUND", err)
		}
	})
}
