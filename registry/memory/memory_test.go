package memory_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/agentmesh/agentmesh/registry"
	"github.com/agentmesh/agentmesh/registry/memory"
	"github.com/agentmesh/agentmesh/registry/registrytest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	registrytest.Run(t, func(t *testing.T) registry.Registry {
		r := memory.New()
		t.Cleanup(func() { _ = r.Close() })
		return r
	})
}

func TestExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New(memory.WithExpiryCheck(100 * time.Millisecond))
		defer r.Close()
		ctx := context.Background()
		reg := registrytest.Reg("alive", "m")
		reg.HeartbeatInterval = time.Second
		_, _ = r.Register(ctx, reg)
		reg.InstanceID = "silent"
		_, _ = r.Register(ctx, reg)
		watch, _ := r.Watch(ctx)
		<-watch
		for range 10 {
			time.Sleep(time.Second)
			if err := r.Heartbeat(ctx, "alive", registry.Beat{}); err != nil {
				t.Fatalf("heartbeat of a live instance: %v", err)
			}
			if r.Snapshot().Instance("silent") == nil {
				break
			}
		}
		s := r.Snapshot()
		if s.Instance("alive") == nil {
			t.Error("the heartbeating instance expired")
		}
		if s.Instance("silent") != nil {
			t.Error("the silent instance did not expire")
		}
		gone := <-watch
		if gone.Instance("silent") != nil {
			t.Error("the watcher did not see the expiry")
		}
	})
}

func TestExpiryTiming(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := memory.New(memory.WithExpiryCheck(10 * time.Millisecond))
		defer r.Close()
		reg := registrytest.Reg("s", "m")
		reg.HeartbeatInterval = time.Second
		_, _ = r.Register(context.Background(), reg)
		time.Sleep(2990 * time.Millisecond)
		if r.Snapshot().Instance("s") == nil {
			t.Fatal("expired before three intervals")
		}
		time.Sleep(30 * time.Millisecond)
		if r.Snapshot().Instance("s") != nil {
			t.Fatal("still registered after three intervals and one check")
		}
	})
}

func TestConcurrentUse(t *testing.T) {
	r := memory.New()
	defer r.Close()
	ctx := context.Background()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 200 {
				id := fmt.Sprintf("w%d-%d", w, i%10)
				_, _ = r.Register(ctx, registrytest.Reg(id, "m.*", fmt.Sprintf("x%d", i%3)))
				_ = r.Heartbeat(ctx, id, registry.Beat{Load: 0.1})
				registry.Pick(r.Snapshot().Lookup("m.get"), nil)
				if i%3 == 0 {
					_ = r.Deregister(ctx, id)
				}
			}
		})
	}
	wg.Wait()
	for _, in := range r.Snapshot().Instances() {
		if !in.Serves("m.anything") {
			t.Errorf("instance %s lost its capabilities", in.InstanceID)
		}
	}
}
