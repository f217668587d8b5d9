// Package registrytest is the conformance suite every registry backend
// runs: the memory backend now, the etcd backend later.
package registrytest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/registry"
)

// Reg returns a valid registration.
func Reg(id string, caps ...string) registry.Registration {
	return registry.Registration{InstanceID: id, Name: "t", Hub: "h1", Capabilities: caps, HeartbeatInterval: time.Minute}
}

// Run runs the suite against registries made by newRegistry (which must
// close them when the test ends).
func Run(t *testing.T, newRegistry func(t *testing.T) registry.Registry) {
	ctx := context.Background()
	t.Run("register and look up", func(t *testing.T) {
		r := newRegistry(t)
		if _, err := r.Register(ctx, Reg("a1", "echo.echo", "kv.*")); err != nil {
			t.Fatal(err)
		}
		s := r.Snapshot()
		if s.Instance("a1") == nil || len(s.Lookup("echo.echo")) != 1 || len(s.Lookup("kv.get")) != 1 || len(s.Lookup("other")) != 0 {
			t.Errorf("snapshot after Register: %+v", s.Instances())
		}
	})
	t.Run("re-register replaces", func(t *testing.T) {
		r := newRegistry(t)
		_, _ = r.Register(ctx, Reg("a1", "echo.echo"))
		_, _ = r.Register(ctx, Reg("a1", "kv.get"))
		s := r.Snapshot()
		if len(s.Instances()) != 1 || len(s.Lookup("echo.echo")) != 0 || len(s.Lookup("kv.get")) != 1 {
			t.Errorf("after re-register: %d instances, echo %d, kv %d", len(s.Instances()), len(s.Lookup("echo.echo")), len(s.Lookup("kv.get")))
		}
	})
	t.Run("invalid registration", func(t *testing.T) {
		r := newRegistry(t)
		for _, reg := range []registry.Registration{Reg("", "x.y"), Reg("a"), Reg("a", "bad name"), {InstanceID: "a", Capabilities: []string{"x"}}} {
			if _, err := r.Register(ctx, reg); !errors.Is(err, registry.ErrInvalid) {
				t.Errorf("Register(%+v) = %v; want ErrInvalid", reg, err)
			}
		}
	})
	t.Run("heartbeat", func(t *testing.T) {
		r := newRegistry(t)
		if err := r.Heartbeat(ctx, "nobody", registry.Beat{}); !errors.Is(err, registry.ErrNotFound) {
			t.Errorf("Heartbeat(unknown) = %v; want ErrNotFound", err)
		}
		_, _ = r.Register(ctx, Reg("a1", "m"))
		if err := r.Heartbeat(ctx, "a1", registry.Beat{State: registry.StateBusy, Load: 0.5}); err != nil {
			t.Fatal(err)
		}
		s := r.Snapshot()
		if in := s.Instance("a1"); in == nil || in.State() != registry.StateBusy || in.Load() != 0.5 || len(s.Lookup("m")) != 0 {
			t.Errorf("after a busy heartbeat: %+v, lookup %d; want busy, load 0.5, not routed", in, len(s.Lookup("m")))
		}
		_ = r.Heartbeat(ctx, "a1", registry.Beat{State: registry.StateReady})
		if len(r.Snapshot().Lookup("m")) != 1 {
			t.Error("ready again but not routed")
		}
	})
	t.Run("deregister", func(t *testing.T) {
		r := newRegistry(t)
		_, _ = r.Register(ctx, Reg("a1", "m.*"))
		if err := r.Deregister(ctx, "a1"); err != nil {
			t.Fatal(err)
		}
		if err := r.Deregister(ctx, "a1"); !errors.Is(err, registry.ErrNotFound) {
			t.Errorf("second Deregister = %v; want ErrNotFound", err)
		}
		s := r.Snapshot()
		if s.Instance("a1") != nil || len(s.Lookup("m.x")) != 0 || !s.Known("m.x") || s.Known("n.x") {
			t.Errorf("after deregister: instance %v, known(m.x) %v", s.Instance("a1"), s.Known("m.x"))
		}
	})
	t.Run("watch", func(t *testing.T) {
		r := newRegistry(t)
		_, _ = r.Register(ctx, Reg("a1", "m"))
		wctx, cancel := context.WithCancel(ctx)
		ch, err := r.Watch(wctx)
		if err != nil {
			t.Fatal(err)
		}
		first := recv(t, ch)
		if first.Instance("a1") == nil {
			t.Fatal("the first snapshot is not the full current state")
		}
		_, _ = r.Register(ctx, Reg("a2", "m"))
		var s *registry.Snapshot
		for s = recv(t, ch); s.Instance("a2") == nil; s = recv(t, ch) {
		}
		if s.Rev <= first.Rev {
			t.Errorf("revision %d after %d; want it to grow", s.Rev, first.Rev)
		}
		cancel()
		deadline := time.After(5 * time.Second)
		for {
			select {
			case _, ok := <-ch:
				if !ok {
					return
				}
			case <-deadline:
				t.Fatal("the watch channel did not close when its context ended")
			}
		}
	})
	t.Run("close", func(t *testing.T) {
		r := newRegistry(t)
		ch, err := r.Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		<-ch
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		if err := r.Close(); err != nil {
			t.Errorf("second Close = %v", err)
		}
		// A snapshot published just before Close may still be waiting
		// in the channel (a receiver sees the newest): then it closes.
		timeout := time.After(5 * time.Second)
		for n := 0; ; n++ {
			select {
			case _, ok := <-ch:
				if !ok {
					return
				}
				if n > 0 {
					t.Fatal("watch channel still delivering after Close")
				}
				continue
			case <-timeout:
				t.Fatal("watch channel not closed by Close")
			}
		}
	})
}

func recv(t *testing.T, ch <-chan *registry.Snapshot) *registry.Snapshot {
	t.Helper()
	select {
	case s, ok := <-ch:
		if !ok {
			t.Fatal("watch channel closed")
		}
		return s
	case <-time.After(5 * time.Second):
		t.Fatal("no snapshot within 5s")
	}
	return nil
}
