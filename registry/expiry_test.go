package registry

import (
	"testing"
	"time"
)

// TestExpiry: Due returns exactly the filed instances silent for three
// intervals, refiles those that beat since, drops those no longer in
// force, and looks at no instance before its deadline.
func TestExpiry(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	reg := func(id string) Registration {
		return Registration{InstanceID: id, Name: "x", Capabilities: []string{"x.y"}, HeartbeatInterval: time.Second}
	}
	var e Expiry
	a, b, c := NewInstance(reg("a"), t0), NewInstance(reg("b"), t0), NewInstance(reg("c"), t0.Add(time.Second))
	for _, in := range []*Instance{a, b, c} {
		e.Add(in)
	}
	current := map[*Instance]bool{a: true, b: true, c: true}
	looked := 0
	isCurrent := func(in *Instance) bool { looked++; return current[in] }

	if gone := e.Due(t0.Add(3*time.Second-1), isCurrent); len(gone) != 0 || looked != 0 {
		t.Fatalf("before any deadline: gone %d, looked at %d; want none", len(gone), looked)
	}
	b.Beat(Beat{Load: -1}, t0.Add(2*time.Second)) // b beat: its deadline moves to t0+5s
	// At exactly the deadline nothing has expired yet (Expired is strict),
	// and Due must not spin on it.
	if gone := e.Due(t0.Add(3*time.Second), isCurrent); len(gone) != 0 {
		t.Fatalf("at the deadline: gone %v; want none", gone)
	}
	gone := e.Due(t0.Add(3*time.Second+1), isCurrent)
	if len(gone) != 1 || gone[0] != a {
		t.Fatalf("just after a's deadline: gone %v; want [a]", gone)
	}
	delete(current, a)
	delete(current, c) // c deregistered: dropped at its deadline, not returned
	if gone := e.Due(t0.Add(4*time.Second+1), isCurrent); len(gone) != 0 {
		t.Fatalf("at c's deadline (c no longer in force): gone %v; want none", gone)
	}
	if gone := e.Due(t0.Add(5*time.Second+1), isCurrent); len(gone) != 1 || gone[0] != b {
		t.Fatalf("at b's new deadline: gone %v; want [b]", gone)
	}
	if e.Len() != 0 {
		t.Errorf("%d entries left; want 0", e.Len())
	}
}

// TestExpiryKeepAlive: an instance kept alive (KeepAliveWhile) is not
// beaten until it is due; then its liveness is asked once, a true counts
// as a beat (filed again three intervals on, listed as heard from now),
// and a false expires it.
func TestExpiryKeepAlive(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	in := NewInstance(Registration{InstanceID: "k", Name: "x", Capabilities: []string{"x.y"}, HeartbeatInterval: time.Second}, t0)
	var e Expiry
	e.Add(in)
	alive, asked := true, 0
	in.KeepAliveWhile(func() bool { asked++; return alive })
	current := func(*Instance) bool { return true }
	if gone := e.Due(t0.Add(2*time.Second), current); len(gone) != 0 || asked != 0 {
		t.Fatalf("before the deadline: gone %v, liveness asked %d times; want none, 0", gone, asked)
	}
	if gone := e.Due(t0.Add(3*time.Second+1), current); len(gone) != 0 || asked != 1 {
		t.Fatalf("due, alive: gone %v, asked %d times; want none, once", gone, asked)
	}
	if got := in.st.lastBeat.Load(); got != t0.Add(3*time.Second+1).UnixNano() {
		t.Errorf("the kept instance's beat = %v; want the time it was found alive", time.Unix(0, got))
	}
	if d := time.Since(in.LastHeartbeat()); d < 0 || d > time.Minute {
		t.Errorf("LastHeartbeat of a live kept instance = %v ago; want now", d)
	}
	asked = 0
	if gone := e.Due(t0.Add(5*time.Second), current); len(gone) != 0 || asked != 0 {
		t.Fatalf("before its new deadline: gone %v, asked %d; want none, 0", gone, asked)
	}
	alive = false
	if gone := e.Due(t0.Add(6*time.Second+2), current); len(gone) != 1 || gone[0] != in || asked != 1 {
		t.Fatalf("due, not alive: gone %v, asked %d; want [k], once", gone, asked)
	}
	if !in.LastHeartbeat().Equal(t0.Add(3*time.Second + 1)) {
		t.Errorf("LastHeartbeat of a dead kept instance = %v; want its last beat", in.LastHeartbeat())
	}
}
