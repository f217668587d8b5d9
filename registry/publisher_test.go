package registry_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentmesh/agentmesh/registry"
)

// TestApplyMatchesRebuild: a publisher fed random registrations,
// departures, replacements and state changes one batch at a time holds,
// after every batch, the snapshot a from-scratch build of the same set
// gives: the same instances, the same ready instances per method and
// pattern, the same known methods; and every departure is in its log.
func TestApplyMatchesRebuild(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	p := registry.NewPublisher()
	defer p.Close()
	live := map[string]*registry.Instance{}
	caps := []string{"a.x", "a.y", "b.x", "a.*", "*", "c.z"}
	var seen uint64
	departed := map[*registry.Instance]bool{}
	for step := range 2000 {
		var puts, gone []*registry.Instance
		used := map[string]bool{} // one change per id in a batch
		for range 1 + rng.IntN(4) {
			id := fmt.Sprintf("i%02d", rng.IntN(40))
			if used[id] {
				continue
			}
			used[id] = true
			switch op := rng.IntN(10); {
			case op < 5: // register (or replace)
				var cs []string
				for _, c := range caps {
					if rng.IntN(3) == 0 {
						cs = append(cs, c)
					}
				}
				if len(cs) == 0 {
					cs = []string{"a.x"}
				}
				in := registry.NewInstance(registry.Registration{InstanceID: id, Capabilities: cs, HeartbeatInterval: time.Second}, time.Now())
				live[id] = in
				puts = append(puts, in)
			case op < 8: // leave
				if in := live[id]; in != nil {
					delete(live, id)
					gone = append(gone, in)
				}
			default: // change state
				if in := live[id]; in != nil {
					st := []string{registry.StateReady, registry.StateBusy, registry.StateOverloaded}[rng.IntN(3)]
					in.Beat(registry.Beat{State: st}, time.Now())
					puts = append(puts, in)
				}
			}
		}
		before := p.Snapshot()
		p.Apply(puts, gone)
		got := p.Snapshot()
		list := make([]*registry.Instance, 0, len(live))
		for _, in := range live {
			list = append(list, in)
		}
		want := registry.NewSnapshot(0, list, nil)
		if ids(got.Instances()) != ids(want.Instances()) {
			t.Fatalf("step %d: instances %s; want %s", step, ids(got.Instances()), ids(want.Instances()))
		}
		for _, m := range []string{"a.x", "a.y", "b.x", "c.z", "a.other", "zzz"} {
			g, w := ids(sorted(got.Lookup(m))), ids(sorted(want.Lookup(m)))
			if g != w {
				t.Fatalf("step %d: Lookup(%s) = %s; want %s", step, m, g, w)
			}
			if want.Known(m) && !got.Known(m) {
				t.Fatalf("step %d: %s not known", step, m)
			}
		}
		for _, in := range gone {
			if before.Instance(in.InstanceID) == in {
				departed[in] = true
			}
		}
		removed, upTo, complete := got.Removed(seen)
		if !complete {
			t.Fatalf("step %d: the log does not reach back to %d", step, seen)
		}
		for _, in := range removed {
			if !departed[in] {
				t.Fatalf("step %d: %s logged as gone, but it did not leave", step, in.InstanceID)
			}
			delete(departed, in)
		}
		seen = upTo
	}
	if len(departed) != 0 {
		t.Fatalf("%d departures never logged", len(departed))
	}
}

func sorted(ins []*registry.Instance) []*registry.Instance {
	out := slices.Clone(ins)
	slices.SortFunc(out, func(a, b *registry.Instance) int {
		if a.InstanceID < b.InstanceID {
			return -1
		}
		if a.InstanceID > b.InstanceID {
			return 1
		}
		return 0
	})
	return out
}

// TestRecentlyServedStaysKnown: a method whose last instance left stays
// known (UNAVAILABLE, not METHOD_NOT_FOUND, for its callers) for
// RecentTTL, then is forgotten; serving it again in between keeps it.
func TestRecentlyServedStaysKnown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := registry.NewPublisher()
		defer p.Close()
		a := registry.NewInstance(registry.Registration{InstanceID: "a", Capabilities: []string{"m.x", "p.*"}}, time.Now())
		p.Apply([]*registry.Instance{a}, nil)
		p.Apply(nil, []*registry.Instance{a})
		if s := p.Snapshot(); !s.Known("m.x") || !s.Known("p.y") || len(s.Lookup("m.x")) != 0 {
			t.Fatal("a method left a moment ago is not known, or is still routed")
		}
		time.Sleep(registry.RecentTTL + time.Second)
		p.Apply(nil, nil) // any change expires what is due
		if s := p.Snapshot(); s.Known("m.x") || s.Known("p.y") {
			t.Fatal("a method left more than RecentTTL ago is still known")
		}
	})
}

// TestRemovedLogTruncates: a reader further behind than the log holds is
// told to compare with the whole snapshot.
func TestRemovedLogTruncates(t *testing.T) {
	p := registry.NewPublisher()
	defer p.Close()
	for i := range 5000 {
		in := registry.NewInstance(registry.Registration{InstanceID: fmt.Sprint(i), Capabilities: []string{"m.x"}}, time.Now())
		p.Apply([]*registry.Instance{in}, nil)
		p.Apply(nil, []*registry.Instance{in})
	}
	if _, _, complete := p.Snapshot().Removed(0); complete {
		t.Fatal("5,000 departures later, the log claims to reach back to the first")
	}
	s := p.Snapshot()
	_, upTo, _ := s.Removed(0)
	if gone, _, complete := s.Removed(upTo - 10); !complete || len(gone) != 10 {
		t.Fatalf("the last 10 departures: %d, complete %v", len(gone), complete)
	}
}

// TestSnapshotStreaming: the snapshot counts the instances whose schemas
// declare a method streaming, as they come, are replaced and go, in any
// state, without a walk of the registry.
func TestSnapshotStreaming(t *testing.T) {
	p := registry.NewPublisher()
	mk := func(id, schemas string) *registry.Instance {
		return registry.NewInstance(registry.Registration{InstanceID: id, Name: "s", Capabilities: []string{"s.*"},
			Schemas: json.RawMessage(schemas), HeartbeatInterval: time.Second}, time.Now())
	}
	a := mk("a", `{"s.watch":{"streaming":true},"s.get":{}}`)
	b := mk("b", `{"s.watch":{"streaming":true}}`)
	p.Apply([]*registry.Instance{a, b}, nil)
	if s := p.Snapshot(); !s.Streaming("s.watch") || s.Streaming("s.get") || s.Streaming("s.other") {
		t.Fatalf("two instances declaring s.watch: Streaming(s.watch, s.get, s.other) = %v, %v, %v; want true, false, false",
			s.Streaming("s.watch"), s.Streaming("s.get"), s.Streaming("s.other"))
	}
	a.Beat(registry.Beat{State: registry.StateBusy, Load: -1}, time.Now())
	p.Apply([]*registry.Instance{a}, []*registry.Instance{b})
	if !p.Snapshot().Streaming("s.watch") {
		t.Fatal("b gone, a busy: s.watch no longer streaming; want it still (a declares it, in any state)")
	}
	p.Apply([]*registry.Instance{mk("a", `{"s.get":{}}`)}, nil) // a replaced by a version without the stream
	if p.Snapshot().Streaming("s.watch") {
		t.Fatal("no instance declares s.watch any more, yet it is still streaming")
	}
}
