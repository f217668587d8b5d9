package hub_test

import (
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/registry/etcd"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
)

// TestWarmUpAfterEtcdResync (M9 F): a hub on etcd whose watch is lost
// (etcd frozen past the registry's 1 s probe) lists the prefix again when
// etcd answers; for its warm-up after that, a method no agent has
// registered is UNAVAILABLE (not sent), then METHOD_NOT_FOUND again.
func TestWarmUpAfterEtcdResync(t *testing.T) {
	const warmUp = time.Second
	srv := etcdtest.Start(t)
	reg, err := etcd.New(etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: "/warmup/", OpTimeout: 500 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := meshtest.StartCluster(t, hub.Config{ID: "hub-w", WarmUp: warmUp}, reg)
	c := m.Client(t, mesh.WithoutReliability())
	call := func() *envelope.Error {
		return envelope.AsError(c.Call(t.Context(), "ghost.work", nil, nil, mesh.CallTimeout(5*time.Second)))
	}
	meshtest.WaitFor(t, 10*time.Second, reg.Synced)
	time.Sleep(time.Until(reg.LastSync().Add(warmUp)))
	time.Sleep(time.Until(time.Now().Add(warmUp))) // and past the hub's start
	if e := call(); e.Code != envelope.CodeMethodNotFound {
		t.Fatalf("ghost.work past the warm-up = %v; want METHOD_NOT_FOUND", e)
	}
	listed := reg.LastSync()
	srv.Pause()
	meshtest.WaitFor(t, 5*time.Second, func() bool { return !reg.Synced() })
	srv.Resume()
	meshtest.WaitFor(t, 10*time.Second, func() bool { return reg.LastSync().After(listed) })
	if e := call(); e.Code != envelope.CodeUnavailable || !e.NotSent() {
		t.Errorf("ghost.work just after the resync = %v (not sent %v); want UNAVAILABLE, not sent", e, e.NotSent())
	}
	if since := time.Since(reg.LastSync()); since >= warmUp {
		t.Fatalf("the call ended %v after the resync, past the %v warm-up: the machine is too slow for this test", since, warmUp)
	}
	time.Sleep(time.Until(reg.LastSync().Add(warmUp)))
	if e := call(); e.Code != envelope.CodeMethodNotFound {
		t.Errorf("ghost.work past the warm-up after the resync = %v; want METHOD_NOT_FOUND", e)
	}
}
