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
// asked until it is due; then when it was last heard from counts as its
// last beat: heard within three intervals, it is filed again from then
// (and listed as heard from then); heard no later than its last beat, or
// not at all (zero), it expires.
func TestExpiryKeepAlive(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	reg := func(id string) Registration {
		return Registration{InstanceID: id, Name: "x", Capabilities: []string{"x.y"}, HeartbeatInterval: time.Second}
	}
	in, gone := NewInstance(reg("k"), t0), NewInstance(reg("g"), t0)
	var e Expiry
	e.Add(in)
	e.Add(gone)
	heard, asked := t0.Add(2*time.Second), 0
	in.KeepAliveWhile(func() time.Time { asked++; return heard })
	gone.KeepAliveWhile(func() time.Time { return time.Time{} }) // its link closed
	current := func(*Instance) bool { return true }
	if out := e.Due(t0.Add(2*time.Second), current); len(out) != 0 || asked != 0 {
		t.Fatalf("before the deadline: gone %v, liveness asked %d times; want none, 0", out, asked)
	}
	if out := e.Due(t0.Add(3*time.Second+1), current); len(out) != 1 || out[0] != gone || asked != 1 {
		t.Fatalf("due: gone %v, asked %d times; want [g], k asked once", out, asked)
	}
	if got := in.LastHeartbeat(); !got.Equal(heard) {
		t.Errorf("the kept instance's last beat = %v; want when it was heard from, %v", got, heard)
	}
	asked = 0
	if out := e.Due(t0.Add(5*time.Second), current); len(out) != 0 || asked != 0 {
		t.Fatalf("before its new deadline (heard + 3 s): gone %v, asked %d; want none, 0", out, asked)
	}
	// Not heard from since: it expires three intervals after it last was.
	if out := e.Due(t0.Add(5*time.Second+1), current); len(out) != 1 || out[0] != in || asked != 1 {
		t.Fatalf("due, not heard from since: gone %v, asked %d; want [k], once", out, asked)
	}
}
