//go:build !race

package testkit

// RaceEnabled: see race_on.go.
const RaceEnabled = false
