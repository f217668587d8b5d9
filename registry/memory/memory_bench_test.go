package memory_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/registry"
	"github.com/agentmesh/agentmesh/registry/memory"
)

// BenchmarkRegister is one agent registering and leaving a registry that
// holds n others (each serving a method of its own and one they share):
// the cost a registration pays for the fleet's size.
func BenchmarkRegister(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			r := memory.New()
			defer r.Close()
			ctx := context.Background()
			reg := func(id string) registry.Registration {
				return registry.Registration{InstanceID: id, Name: "sim", Capabilities: []string{"own." + id, "shared.ping"}, HeartbeatInterval: time.Hour}
			}
			for i := range n {
				if _, err := r.Register(ctx, reg(fmt.Sprint("agent-", i))); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				id := fmt.Sprint("extra-", i)
				if _, err := r.Register(ctx, reg(id)); err != nil {
					b.Fatal(err)
				}
				if err := r.Deregister(ctx, id); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
