package registry_test

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/registry"
)

func inst(id string, caps ...string) *registry.Instance {
	return registry.NewInstance(registry.Registration{InstanceID: id, Capabilities: caps, HeartbeatInterval: time.Second}, time.Now())
}

func TestValidCapability(t *testing.T) {
	for _, c := range []string{"echo.echo", "memory.*", "*", "a.b.c.*", "tools/call"} {
		if err := registry.ValidCapability(c); err != nil {
			t.Errorf("ValidCapability(%q) = %v; want ok", c, err)
		}
	}
	for _, c := range []string{"", "a b", "me*mory", "memory*", "*.x", "x\n", strings.Repeat("a", 257)} {
		if err := registry.ValidCapability(c); err == nil {
			t.Errorf("ValidCapability(%q) = nil; want an error", c)
		}
	}
}

func TestMatch(t *testing.T) {
	cases := []struct {
		c, m string
		want bool
	}{
		{"echo.echo", "echo.echo", true}, {"echo.echo", "echo.echox", false}, {"echo.*", "echo.x", true},
		{"echo.*", "echox", false}, {"*", "anything", true}, {"a.b.*", "a.b.c.d", true},
	}
	for _, tc := range cases {
		if got := registry.Match(tc.c, tc.m); got != tc.want {
			t.Errorf("Match(%q, %q) = %v; want %v", tc.c, tc.m, got, tc.want)
		}
	}
}

func ids(ins []*registry.Instance) string {
	var s []string
	for _, in := range ins {
		s = append(s, in.InstanceID)
	}
	return strings.Join(s, ",")
}

func TestSnapshotLookup(t *testing.T) {
	a, b, c, d := inst("a", "kv.get"), inst("b", "kv.*"), inst("c", "*"), inst("d", "kv.get", "kv.*")
	busy := inst("e", "kv.get")
	busy.Beat(registry.Beat{State: registry.StateBusy}, time.Now())
	s := registry.NewSnapshot(1, []*registry.Instance{d, c, b, a, busy}, []string{"old.*"})
	cases := map[string]string{
		"kv.get": "a,d,b,c", // exact first, then patterns longest first, no duplicates
		"kv.put": "b,d,c",
		"other":  "c",
	}
	for m, want := range cases {
		if got := ids(s.Lookup(m)); got != want {
			t.Errorf("Lookup(%s) = %s; want %s", m, got, want)
		}
	}
	if ids(s.Instances()) != "a,b,c,d,e" {
		t.Errorf("Instances = %s; want all, sorted", ids(s.Instances()))
	}
	if !s.Known("old.thing") || !s.Known("kv.get") || registry.NewSnapshot(1, []*registry.Instance{a}, nil).Known("nope") {
		t.Error("Known is wrong")
	}
	if len(s.Methods()["kv.get"]) != 3 {
		t.Errorf("Methods()[kv.get] = %d instances; want 3 (busy included)", len(s.Methods()["kv.get"]))
	}
	if n := testing.AllocsPerRun(100, func() { s.Lookup("other") }); n != 0 {
		t.Errorf("Lookup of one pattern allocates %v; want 0", n)
	}
}

func TestInstanceState(t *testing.T) {
	t0 := time.Now()
	in := registry.NewInstance(registry.Registration{InstanceID: "a", Capabilities: []string{"m"}, HeartbeatInterval: time.Second}, t0)
	if in.State() != registry.StateReady || in.Expired(t0.Add(3*time.Second)) || !in.Expired(t0.Add(3100*time.Millisecond)) {
		t.Error("a new instance must be ready and expire after three intervals")
	}
	if !in.Beat(registry.Beat{State: registry.StateBusy, Load: 0.3}, time.Now()) || in.Beat(registry.Beat{State: registry.StateBusy, Load: 0.3}, time.Now()) {
		t.Error("Beat must report state changes only")
	}
	in.Beat(registry.Beat{Load: math.NaN()}, time.Now())
	in.Beat(registry.Beat{Load: -1}, time.Now())
	if in.Load() != 0.3 {
		t.Errorf("Load = %v after NaN and negative beats; want 0.3 kept", in.Load())
	}
	rel := in.Acquire()
	rel2 := in.Acquire()
	if in.InFlight() != 2 {
		t.Errorf("InFlight = %d", in.InFlight())
	}
	rel()
	rel2()
	if in.InFlight() != 0 {
		t.Errorf("InFlight = %d after releases", in.InFlight())
	}
}

func TestPick(t *testing.T) {
	if registry.Pick(nil, nil) != nil {
		t.Error("Pick(nil) != nil")
	}
	one := []*registry.Instance{inst("a", "m")}
	if registry.Pick(one, nil) != one[0] || registry.Pick(one, func(*registry.Instance) bool { return true }) != nil {
		t.Error("Pick of one")
	}
	var cands []*registry.Instance
	for i := range 4 {
		cands = append(cands, inst(fmt.Sprint(i), "m"))
	}
	// Equal instances share the load.
	count := map[string]int{}
	for range 40000 {
		count[registry.Pick(cands, nil).InstanceID]++
	}
	for id, n := range count {
		if n < 8000 || n > 12000 {
			t.Errorf("instance %s picked %d of 40000; want about 10000", id, n)
		}
	}
	// A busy instance is picked far less.
	for range 100 {
		cands[0].Acquire()
	}
	busy := 0
	for range 10000 {
		if registry.Pick(cands, nil) == cands[0] {
			busy++
		}
	}
	if busy > 100 {
		t.Errorf("the instance with 100 in flight was picked %d of 10000 times", busy)
	}
	// skip is honoured.
	for range 1000 {
		if p := registry.Pick(cands, func(in *registry.Instance) bool { return in.InstanceID != "3" }); p != cands[3] {
			t.Fatalf("Pick with all but 3 skipped = %v", p)
		}
	}
	if n := testing.AllocsPerRun(100, func() { registry.Pick(cands, func(in *registry.Instance) bool { return in.InstanceID == "1" }) }); n != 0 {
		t.Errorf("Pick allocates %v times; want 0", n)
	}
}

func BenchmarkPick(b *testing.B) {
	var cands []*registry.Instance
	for i := range 8 {
		cands = append(cands, inst(fmt.Sprint(i), "m"))
	}
	b.ReportAllocs()
	for b.Loop() {
		registry.Pick(cands, nil)
	}
}

func BenchmarkLookup(b *testing.B) {
	var ins []*registry.Instance
	for i := range 100 {
		ins = append(ins, inst(fmt.Sprint(i), fmt.Sprintf("svc%d.get", i), fmt.Sprintf("pat%d.*", i)))
	}
	s := registry.NewSnapshot(1, ins, nil)
	b.ReportAllocs()
	for b.Loop() {
		s.Lookup("svc50.get")
	}
}
