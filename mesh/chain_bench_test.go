package mesh_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
)

// BenchmarkClientChain measures what the client's reliability chain
// (policy lookup, per-method breaker, bulkhead, retry wrapper) costs over
// the bare transport, in the same run: in memory (the chain alone) and
// over a real routed call (client → hub → echo agent).
//
//	go test -run '^$' -bench ClientChain -benchmem -count 6 ./mesh | tee chain.txt
func BenchmarkClientChain(b *testing.B) {
	ctx := context.Background()
	loop := func(c *mesh.Client) func(b *testing.B) {
		return func(b *testing.B) {
			var out json.RawMessage
			b.ReportAllocs()
			for b.Loop() {
				if err := c.Call(ctx, "echo.echo", testkit.Payload128, &out); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	// An echo transport that does nothing else, so that the chain's own
	// cost shows.
	echo := func(_ context.Context, req *envelope.Request) (*envelope.Response, error) {
		return &envelope.Response{ID: req.ID, Result: req.Params}, nil
	}
	client := func(opts ...mesh.ClientOption) *mesh.Client {
		c, err := mesh.NewClient(nil, append(opts, mesh.WithTransport(echo))...)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		return c
	}
	b.Run("memory/bare", loop(client(mesh.WithoutReliability())))
	b.Run("memory/chain", loop(client()))

	m := meshtest.Start(b, hub.Config{})
	m.RunAgent(b, agents.NewEcho())
	b.Run("routed/bare", loop(m.Client(b, mesh.WithoutReliability())))
	b.Run("routed/chain", loop(m.Client(b)))
}
