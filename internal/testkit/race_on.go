//go:build race

package testkit

// RaceEnabled: this binary runs under the race detector, with its
// slowdown; latency figures are judged in a run without it.
const RaceEnabled = true
