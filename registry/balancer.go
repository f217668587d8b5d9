package registry

import "math/rand/v2"

// Pick chooses an instance by the power of two choices: two candidates at
// random, the one with the lower cost wins, where cost grows with the
// requests in flight and the load the instance reports. skip, when not nil,
// excludes instances (already tried, breaker open); if every candidate is
// excluded Pick returns nil. It does not allocate.
func Pick(cands []*Instance, skip func(*Instance) bool) *Instance {
	n := len(cands)
	switch n {
	case 0:
		return nil
	case 1:
		if skip != nil && skip(cands[0]) {
			return nil
		}
		return cands[0]
	}
	if skip == nil {
		i := rand.IntN(n)
		j := rand.IntN(n - 1)
		if j >= i {
			j++
		}
		a, b := cands[i], cands[j]
		if cost(b) < cost(a) {
			return b
		}
		return a
	}
	// With exclusions: two random picks among the allowed ones, by
	// reservoir sampling so that no slice is allocated.
	var a, b *Instance
	seen := 0
	for _, in := range cands {
		if skip(in) {
			continue
		}
		seen++
		if seen == 1 {
			a = in
			continue
		}
		if seen == 2 {
			b = in
			if rand.IntN(2) == 0 {
				a, b = b, a
			}
			continue
		}
		if r := rand.IntN(seen); r == 0 {
			a = in
		} else if r == 1 {
			b = in
		}
	}
	if b != nil && cost(b) < cost(a) {
		return b
	}
	return a
}

func cost(in *Instance) float64 {
	return float64(in.InFlight()+1) * (1 + in.Load())
}
