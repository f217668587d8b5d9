package mesh_test

import (
	"syscall"
	"testing"
	"time"
)

// processCPU returns the user + system CPU time this process has used.
func processCPU() time.Duration {
	user, sys := processTimes()
	return user + sys
}

// processTimes returns the user and the system CPU time this process has
// used.
func processTimes() (user, sys time.Duration) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}

// reportCPU reports the process's CPU time per operation (cpu-ns/op) from
// the time it is called to the end of the benchmark. On a shared, busy
// machine wall time per op swings with the neighbours' load; the CPU the
// process burns per op moves much less, so A/B comparisons use it.
// Everything runs in this process (client, hub, agent), so it is the
// CPU cost of the whole round trip.
func reportCPU(b *testing.B) {
	start := processCPU()
	b.Cleanup(func() {
		if b.N > 0 {
			b.ReportMetric(float64(processCPU()-start)/float64(b.N), "cpu-ns/op")
		}
	})
}
