//go:build race

package hub_test

// raceEnabled: this test binary runs under the race detector, with its
// slowdown (latency figures are judged in a run without it).
const raceEnabled = true
