package freeport

import (
	"net"
	"strconv"
	"testing"
)

// TestAddrsBindable: the addresses are distinct, below the ephemeral range,
// and can be bound.
func TestAddrsBindable(t *testing.T) {
	addrs := Addrs(t, 50)
	seen := map[string]bool{}
	low := ephemeralLow()
	for _, a := range addrs {
		if seen[a] {
			t.Fatalf("%s handed out twice", a)
		}
		seen[a] = true
		_, ps, err := net.SplitHostPort(a)
		if err != nil {
			t.Fatal(err)
		}
		p, _ := strconv.Atoi(ps)
		if p < lowest || p >= low {
			t.Fatalf("%s outside %s", a, String())
		}
		ln, err := net.Listen("tcp", a)
		if err != nil {
			t.Fatalf("bind %s: %v", a, err)
		}
		ln.Close()
	}
}

// TestSkipsBound: a port someone listens on is never handed out.
func TestSkipsBound(t *testing.T) {
	base := Port(t) // a free spot to start a small range at
	lo, hi := base, base+29
	if hi >= ephemeralLow() {
		lo, hi = base-29, base
	}
	held := map[int]bool{}
	for p := lo; p <= hi && len(held) < 20; p++ {
		if l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p))); err == nil {
			defer l.Close()
			held[p] = true
		}
	}
	for range hi - lo + 1 - len(held) - 2 {
		if p := pickIn(t, lo, hi); held[p] {
			t.Fatalf("port %d is bound but was handed out", p)
		}
	}
}
