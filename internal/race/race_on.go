//go:build race

// Package race tells tests whether the binary runs under the race
// detector, whose slowdown they do not judge latency under.
package race

// Enabled: this binary runs under the race detector, with its
// slowdown; latency figures are judged in a run without it.
const Enabled = true
