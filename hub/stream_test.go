package hub_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/registry/etcd"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
)

// TestStreamAcrossPeerHop: a stream from a client on hub B to an agent on
// hub A crosses the peer link: 5,000 chunks in order with a window of 8
// (credit relayed back through both hubs), the end intact; a cancel
// crosses it too, and stops the agent's handler.
func TestStreamAcrossPeerHop(t *testing.T) {
	srv := etcdtest.Start(t)
	newReg := func() *etcd.Registry {
		reg, err := etcd.New(etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: "/stream-hop/"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return reg
	}
	a := meshtest.StartCluster(t, hub.Config{ID: "hub-A"}, newReg())
	b := meshtest.StartCluster(t, hub.Config{ID: "hub-B"}, newReg())
	echo := agents.NewEcho(agents.WithID("echo-on-a"))
	stopped := make(chan error, 1)
	echo.HandleStream("hop.forever", func(ctx context.Context, _ json.RawMessage, s *agents.Stream) error {
		for i := 0; ; i++ {
			if err := s.Send(ctx, i); err != nil {
				stopped <- err
				return err
			}
		}
	})
	a.RunAgent(t, echo)
	meshtest.WaitFor(t, 5*time.Second, func() bool { return b.Hub.Registry().Snapshot().Instance("echo-on-a") != nil })

	c := b.Client(t)
	s, err := c.Stream(t.Context(), "echo.stream", map[string]any{"n": 5000}, mesh.Window(8))
	if err != nil {
		t.Fatal(err)
	}
	n := int64(0)
	for raw, err := range s.All() {
		if err != nil {
			t.Fatalf("after %d chunks: %v", n, err)
		}
		var ch struct{ I int64 }
		if json.Unmarshal(raw, &ch) != nil || ch.I != n+1 {
			t.Fatalf("chunk %d: %s", n+1, raw)
		}
		n++
	}
	s.Close()
	if n != 5000 || s.Result() == nil || string(s.Result().Result) != `{"chunks":5000}` {
		t.Fatalf("got %d chunks, end %+v", n, s.Result())
	}

	s, err = c.Stream(t.Context(), "hop.forever", nil, mesh.Window(4))
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		if _, err := s.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	select {
	case err := <-stopped:
		if envelope.CodeOf(err) != envelope.CodeCancelled {
			t.Errorf("the handler on A stopped with %v; want CANCELLED", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the cancel did not cross the peer link to the handler on hub A")
	}
}
