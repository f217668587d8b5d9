package main

import (
	"strings"
	"testing"

	"github.com/agentmesh/agentmesh/internal/s26"
)

// The knobs are checked before any hub or attacker starts: an -only that
// matches no input would leave the attackers nothing to send.
func TestCheck(t *testing.T) {
	for _, c := range []struct {
		windows, legit int
		k              knobs
		bad            string // part of the error; "" for none
	}{
		{10, 100, knobs{}, ""},
		{1, 1, knobs{Only: "fragments", Noise: 200, Burn: 1000}, ""},
		{0, 100, knobs{}, "-windows"},
		{10, 0, knobs{}, "-legit"},
		{10, 100, knobs{Noise: -1}, "-noise"},
		{10, 100, knobs{Burn: 1001}, "-burn"},
		{10, 100, knobs{Only: "no such input"}, `"16 MiB header"`}, // lists the inputs
	} {
		err := check(c.windows, c.legit, c.k)
		if (c.bad == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.bad)) {
			t.Errorf("check(%d, %d, %+v) = %v; want an error naming %q", c.windows, c.legit, c.k, err, c.bad)
		}
	}
	if got := narrow(s26.Corpus(), "fragments"); len(got) != 1 || got[0].Name != "fragments past the limit" || !got[0].Native() {
		t.Errorf("-only fragments keeps %d inputs; want the one native input 'fragments past the limit'", len(got))
	}
	if got, all := narrow(s26.Corpus(), ""), s26.Corpus(); len(got) != len(all) {
		t.Errorf("no -only keeps %d of %d inputs", len(got), len(all))
	}
}
