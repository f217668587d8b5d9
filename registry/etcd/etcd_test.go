package etcd_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentmesh/agentmesh/registry"
	"github.com/agentmesh/agentmesh/registry/etcd"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
	"github.com/agentmesh/agentmesh/registry/registrytest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc.(*addrConn).resetTransportAndUnlock"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
}

func TestConformance(t *testing.T) {
	srv := etcdtest.Start(t)
	n := 0
	registrytest.Run(t, func(t *testing.T) registry.Registry {
		n++
		r, err := etcd.New(etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: "/conformance/" + t.Name() + "/"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		return r
	})
}

// TestTwoHubsShareOneView: what one hub registers, the other sees through
// its watch; a lease left to expire takes the instance out everywhere.
func TestTwoHubsShareOneView(t *testing.T) {
	srv := etcdtest.Start(t)
	cfg := etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: "/two/", Hub: "hub-a"}
	a, err := etcd.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	cfg.Hub = "hub-b"
	b, err := etcd.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	reg := registrytest.Reg("agent-on-a", "kv.*")
	reg.Hub = "hub-a"
	reg.HeartbeatInterval = 400 * time.Millisecond // lease TTL 2 s (rounded up)
	if _, err := a.Register(context.Background(), reg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "hub b to see the agent", 5*time.Second, func() bool {
		in := b.Snapshot().Instance("agent-on-a")
		return in != nil && in.Hub == "hub-a" && len(b.Snapshot().Lookup("kv.get")) == 1
	})
	// Synced, within the probe's 1 s timeout: a CI run under load saw one
	// probe time out (not synced for a second) right at this point.
	waitFor(t, "hub b to be synced", 5*time.Second, b.Synced)
	// State travels too.
	if err := a.Heartbeat(context.Background(), "agent-on-a", registry.Beat{State: registry.StateBusy}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "hub b to see busy", 5*time.Second, func() bool {
		in := b.Snapshot().Instance("agent-on-a")
		return in != nil && in.State() == registry.StateBusy
	})
	// No more heartbeats: the lease expires and both views drop it.
	start := time.Now()
	waitFor(t, "the lease to expire", 10*time.Second, func() bool {
		return b.Snapshot().Instance("agent-on-a") == nil && a.Snapshot().Instance("agent-on-a") == nil
	})
	t.Logf("expired %v after the last heartbeat", time.Since(start).Round(time.Millisecond))
	if err := a.Heartbeat(context.Background(), "agent-on-a", registry.Beat{}); err == nil {
		t.Error("heartbeat of an expired instance succeeded; the agent must register again")
	}
}

// TestEtcdDownKeepsRouting: with etcd frozen the last view still routes;
// when it returns the hubs resync.
func TestEtcdDownKeepsRouting(t *testing.T) {
	srv := etcdtest.Start(t)
	cfg := etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: "/down/", OpTimeout: 500 * time.Millisecond}
	a, _ := etcd.New(cfg, nil)
	defer a.Close()
	b, _ := etcd.New(cfg, nil)
	defer b.Close()
	reg := registrytest.Reg("x1", "m.*")
	reg.HeartbeatInterval = 5 * time.Second
	if _, err := a.Register(context.Background(), reg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to see x1", 5*time.Second, func() bool { return b.Snapshot().Instance("x1") != nil })
	srv.Pause()
	if _, err := a.Register(context.Background(), registrytest.Reg("x2", "m.*")); err == nil {
		t.Error("registering while etcd is frozen succeeded")
	}
	if len(b.Snapshot().Lookup("m.get")) != 1 {
		t.Error("b lost its view while etcd was down")
	}
	srv.Resume()
	reg.InstanceID = "x3"
	waitFor(t, "registration after etcd returns", 10*time.Second, func() bool {
		_, err := a.Register(context.Background(), reg)
		return err == nil
	})
	waitFor(t, "b to resync", 10*time.Second, func() bool { return b.Snapshot().Instance("x3") != nil })
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
