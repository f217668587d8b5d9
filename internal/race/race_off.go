//go:build !race

package race

// Enabled: see race_on.go.
const Enabled = false
