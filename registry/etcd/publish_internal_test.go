package etcd

import (
	"fmt"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/registry"
)

// viewOf is a registry without etcd holding n instances of another hub,
// present: what follow builds from the watch.
func viewOf(n int) *Registry {
	r := &Registry{
		cfg: Config{Hub: "hub-a"}, epoch: "ea", Publisher: registry.NewPublisher(),
		insts: map[string]*registry.Instance{}, owners: map[string]owner{}, perHub: map[string]int{},
		local: map[string]*registry.Instance{}, hubs: map[string]hubState{}, dirty: map[string]struct{}{},
	}
	r.setHubLocked("hub-b", hubState{epoch: "eb", addr: "b:1", lease: 7}, time.Now())
	for i := range n {
		r.setInstLocked(instanceOf(i, "hub-b"), owner{epoch: "eb", lease: 7})
	}
	r.publishLocked()
	return r
}

func instanceOf(i int, hub string) *registry.Instance {
	return registry.NewInstance(registry.Registration{
		InstanceID: fmt.Sprintf("agent-%06d", i), Name: "w", Hub: hub, HubAddr: "b:1",
		Capabilities: []string{fmt.Sprintf("svc%d.run", i%100)}, HeartbeatInterval: time.Second,
	}, time.Now())
}

// TestIncrementalPublish: a publish after watch events applies the
// instances they touched, and yields the view a whole publish would: a
// new instance in, a replaced one swapped, a removed one out, a state
// change re-indexed, and a hub's departure taking its instances along.
func TestIncrementalPublish(t *testing.T) {
	r := viewOf(100)
	r.setInstLocked(instanceOf(100, "hub-b"), owner{epoch: "eb", lease: 7})
	repl := instanceOf(5, "hub-b")
	r.setInstLocked(repl, owner{epoch: "eb", lease: 7})
	r.delInstLocked("agent-000007")
	busy := r.insts["agent-000009"]
	busy.Beat(registry.Beat{State: registry.StateBusy, Load: -1}, time.Now())
	r.dirty["agent-000009"] = struct{}{}
	r.publishLocked()
	snap := r.Snapshot()
	if got := len(snap.Instances()); got != 100 {
		t.Errorf("%d instances published; want 100 (100 - 1 removed + 1 new)", got)
	}
	if snap.Instance("agent-000100") == nil || snap.Instance("agent-000005") != repl || snap.Instance("agent-000007") != nil {
		t.Error("the new instance, the replacement or the removal is not in the published view")
	}
	for _, in := range snap.Lookup("svc9.run") {
		if in.InstanceID == "agent-000009" {
			t.Error("agent-000009 turned busy but is still ready for svc9.run")
		}
	}
	if len(r.dirty) != 0 {
		t.Errorf("%d dirty left after the publish", len(r.dirty))
	}
	r.setHubLocked("hub-b", hubState{}, time.Now()) // hub-b left
	r.publishLocked()
	if got := len(r.Snapshot().Instances()); got != 0 {
		t.Errorf("%d instances published after their hub left; want 0", got)
	}
}

// BenchmarkWatchEventPublish: the publish after one watch event (an
// instance's record put again) in a view of n instances, incremental
// against the whole-view publish every event cost before.
func BenchmarkWatchEventPublish(b *testing.B) {
	for _, n := range []int{1000, 20000} {
		for _, whole := range []bool{false, true} {
			name := fmt.Sprintf("n=%d/incremental", n)
			if whole {
				name = fmt.Sprintf("n=%d/whole", n)
			}
			b.Run(name, func(b *testing.B) {
				r := viewOf(n)
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					r.setInstLocked(instanceOf(i%n, "hub-b"), owner{epoch: "eb", lease: 7})
					r.allDirty = whole
					r.publishLocked()
					i++
				}
			})
		}
	}
}
