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
		insts: map[string]*registry.Instance{}, owners: map[string]owner{}, byHub: map[string]map[string]struct{}{},
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
	r.setHubLocked("hub-c", hubState{epoch: "ec", addr: "c:1", lease: 8}, time.Now())
	r.setInstLocked(instanceOf(500, "hub-c"), owner{epoch: "ec", lease: 8})
	r.publishLocked()
	r.setHubLocked("hub-b", hubState{}, time.Now()) // hub-b left: its 100 instances, and only they, are looked at
	if r.allDirty || len(r.dirty) != 100 {
		t.Errorf("after hub-b left: allDirty %v, %d dirty; want false, its 100 instances", r.allDirty, len(r.dirty))
	}
	r.publishLocked()
	if got := len(r.Snapshot().Instances()); got != 1 || r.Snapshot().Instance("agent-000500") == nil {
		t.Errorf("%d instances published after hub-b left; want hub-c's 1", got)
	}
	r.setHubLocked("hub-b", hubState{epoch: "eb", addr: "b:1", lease: 7}, time.Now()) // back, the same life
	r.publishLocked()
	if got := len(r.Snapshot().Instances()); got != 101 {
		t.Errorf("%d instances published after hub-b came back; want 101", got)
	}
}

// BenchmarkPresencePublish: the publish after one hub of 20 loses its
// presence, in a view of n instances spread over them: the hub's
// instances alone, against the whole view it cost before.
func BenchmarkPresencePublish(b *testing.B) {
	const hubs = 20
	for _, n := range []int{20000, 100000} {
		for _, whole := range []bool{false, true} {
			name := fmt.Sprintf("n=%d/incremental", n)
			if whole {
				name = fmt.Sprintf("n=%d/whole", n)
			}
			b.Run(name, func(b *testing.B) {
				r := viewOf(0)
				for h := range hubs {
					hub := fmt.Sprintf("hub-%d", h)
					r.setHubLocked(hub, hubState{epoch: "e" + hub, addr: "x:1", lease: int64(h + 1)}, time.Now())
				}
				for i := range n {
					h := i % hubs
					r.setInstLocked(instanceOf(i, fmt.Sprintf("hub-%d", h)), owner{epoch: fmt.Sprintf("ehub-%d", h), lease: int64(h + 1)})
				}
				r.publishLocked()
				up := hubState{epoch: "ehub-3", addr: "x:1", lease: 4}
				for i := 0; b.Loop(); i++ {
					st := up
					if i%2 == 0 {
						st = hubState{} // gone, then back
					}
					r.setHubLocked("hub-3", st, time.Now())
					r.allDirty = whole
					r.publishLocked()
				}
			})
		}
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
