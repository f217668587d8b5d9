// Package cpustat measures the CPU time a process burns, for benchmarks
// on a shared machine: wall time per op swings with the neighbours'
// load; the CPU the process burns per op moves much less.
package cpustat

import (
	"syscall"
	"testing"
	"time"
)

// Process returns the user + system CPU time this process has used.
func Process() time.Duration {
	user, sys := Times()
	return user + sys
}

// Times returns the user and the system CPU time this process has used.
func Times() (user, sys time.Duration) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}

// Report reports the process's CPU time per operation (cpu-ns/op) from
// the time it is called to the end of the benchmark. When everything
// runs in the benchmark's process (client, hub, agent), it is the CPU
// cost of the whole round trip; A/B comparisons use it.
func Report(b *testing.B) {
	start := Process()
	b.Cleanup(func() {
		if b.N > 0 {
			b.ReportMetric(float64(Process()-start)/float64(b.N), "cpu-ns/op")
		}
	})
}
