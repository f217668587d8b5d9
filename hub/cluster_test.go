package hub_test

import (
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/registry/etcd"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
)

// TestClusterForwarding: three hubs on one etcd; agents on hubs A and C;
// a client on hub B calls methods served only on A and only on C, through
// peer links, and a call to a method nobody serves still fails at once.
func TestClusterForwarding(t *testing.T) {
	srv := etcdtest.Start(t)
	hubs := map[string]*meshtest.Mesh{}
	for _, name := range []string{"A", "B", "C"} {
		reg, err := etcd.New(etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: "/cluster/"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		m := meshtest.StartCluster(t, hub.Config{ID: "hub-" + name}, reg)
		hubs[name] = m
	}
	a := agents.NewEcho(agents.WithID("echo-on-a"))
	hubs["A"].RunAgent(t, a)
	kv := agents.NewKV(agents.WithID("kv-on-c"))
	hubs["C"].RunAgent(t, kv)
	b := hubs["B"]
	meshtest.WaitFor(t, 5*time.Second, func() bool {
		s := b.Hub.Registry().Snapshot()
		return s.Instance("echo-on-a") != nil && s.Instance("kv-on-c") != nil
	})
	c := b.Client(t)
	var got string
	if err := c.Call(t.Context(), "echo.echo", "via B to A", &got); err != nil || got != "via B to A" {
		t.Fatalf("echo.echo through B = %q, %v; want the agent on A to answer", got, err)
	}
	if err := c.Call(t.Context(), "memory.put", map[string]any{"key": "k", "value": 1}, nil); err != nil {
		t.Fatalf("memory.put through B: %v", err)
	}
	var kvres struct{ Found bool }
	if err := c.Call(t.Context(), "memory.get", map[string]string{"key": "k"}, &kvres); err != nil || !kvres.Found {
		t.Fatalf("memory.get through B = %+v, %v; want the agent on C to answer", kvres, err)
	}
	if err := c.Call(t.Context(), "nobody.serves", nil, nil); envelope.CodeOf(err) != envelope.CodeMethodNotFound {
		t.Errorf("unknown method in a cluster = %v; want METHOD_NOT_FOUND", err)
	}
	// Many calls from B, answered by A, one peer link.
	for i := range 200 {
		if err := c.Call(t.Context(), "echo.echo", i, nil); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
}
