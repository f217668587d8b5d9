//go:build race

package cli_test

// raceEnabled: the race detector slows every figure several times.
const raceEnabled = true
