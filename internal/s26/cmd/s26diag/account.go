package main

import (
	"os"
	"runtime/metrics"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// processTimes is the user and the system CPU time this process has
// used (the hub's, mostly: the attackers run in another process).
func processTimes() (user, sys time.Duration) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}

func processCPU() time.Duration {
	user, sys := processTimes()
	return user + sys
}

// runDelay is the time this process's threads have spent runnable but
// waiting for a CPU (the second field of /proc/self/task/*/schedstat).
func runDelay() time.Duration {
	ents, _ := os.ReadDir("/proc/self/task")
	var sum int64
	for _, e := range ents {
		b, err := os.ReadFile("/proc/self/task/" + e.Name() + "/schedstat")
		if err != nil {
			continue
		}
		if f := strings.Fields(string(b)); len(f) >= 2 {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			sum += n
		}
	}
	return time.Duration(sum)
}

// cpuTimes is the machine's aggregate CPU time per state, in ms, as
// /proc/stat's "cpu" line orders them: user nice system idle iowait irq
// softirq steal.
type cpuTimes [8]float64

func readCPUTimes() (t cpuTimes) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return t
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	for i := range t {
		if i+1 < len(f) {
			v, _ := strconv.ParseFloat(f[i+1], 64)
			t[i] = v * 10 // USER_HZ is 100 on Linux: 10 ms a tick
		}
	}
	return t
}

func (t *cpuTimes) add(from, to cpuTimes) {
	for i := range t {
		t[i] += to[i] - from[i]
	}
}

// schedLatencies is the histogram of the time goroutines spent runnable
// before they ran (Go's run queues, not the OS's).
func schedLatencies() *metrics.Float64Histogram {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(s)
	return s[0].Value.Float64Histogram()
}

// histDiff sums the differences of pairs of snapshots of one histogram.
type histDiff struct {
	buckets []float64
	counts  []uint64
}

func (h *histDiff) add(from, to *metrics.Float64Histogram) {
	if from == nil || to == nil {
		return
	}
	if h.counts == nil {
		h.buckets, h.counts = to.Buckets, make([]uint64, len(to.Counts))
	}
	for i := range to.Counts {
		h.counts[i] += to.Counts[i] - from.Counts[i]
	}
}

// pctl is the upper bound of the bucket holding the p-th percentile.
func (h *histDiff) pctl(p float64) float64 {
	var total uint64
	for _, c := range h.counts {
		total += c
	}
	seen := uint64(0)
	for i, c := range h.counts {
		seen += c
		if total > 0 && float64(seen) >= float64(total)*p/100 {
			return h.buckets[i+1]
		}
	}
	return 0
}

// gcFigures are the collector's cycles so far and the p99 of its
// stop-the-world pauses, from runtime/metrics (no stop of its own).
type gcFigures struct {
	cycles     uint64
	pauseP99ms float64
}

func gcStats() gcFigures {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/sched/pauses/total/gc:seconds"}}
	metrics.Read(s)
	h := s[1].Value.Float64Histogram()
	var pauses histDiff
	pauses.add(&metrics.Float64Histogram{Counts: make([]uint64, len(h.Counts)), Buckets: h.Buckets}, h)
	return gcFigures{cycles: s[0].Value.Uint64(), pauseP99ms: pauses.pctl(99) * 1000}
}

// snapshot is this process's and the machine's counters at a window
// boundary.
type snapshot struct {
	wait, cpu, sys time.Duration
	sched          *metrics.Float64Histogram
	machine        cpuTimes
}

func takeSnapshot() snapshot {
	user, sys := processTimes()
	return snapshot{wait: runDelay(), cpu: user + sys, sys: sys, sched: schedLatencies(), machine: readCPUTimes()}
}

// phase sums, over the windows of one kind, the hub process's time
// runnable but off CPU (the OS's run queue), its CPU time (and the
// kernel's part of it), its goroutines' wait in Go's run queues, and the
// machine's CPU time per state.
type phase struct {
	windows        int
	wait, cpu, sys time.Duration
	sched          histDiff
	machine        cpuTimes
}

func (p *phase) add(from, to snapshot) {
	p.windows++
	p.wait += to.wait - from.wait
	p.cpu += to.cpu - from.cpu
	p.sys += to.sys - from.sys
	p.sched.add(from.sched, to.sched)
	p.machine.add(from.machine, to.machine)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// summary is the phase per second of window (windows are 1 s).
func (p *phase) summary() map[string]float64 {
	n := float64(max(p.windows, 1))
	return map[string]float64{
		"os_wait_ms_per_s": ms(p.wait) / n,
		"cpu_ms_per_s":     ms(p.cpu) / n,
		"cpu_sys_ms_per_s": ms(p.sys) / n,
		// The machine's CPUs, every process: ms per s in each state.
		"machine_user_ms_per_s":    p.machine[0] / n,
		"machine_system_ms_per_s":  p.machine[2] / n,
		"machine_softirq_ms_per_s": p.machine[6] / n,
		"machine_steal_ms_per_s":   p.machine[7] / n,
		"machine_idle_ms_per_s":    p.machine[3] / n,
		"go_sched_p99_us":          p.sched.pctl(99) * 1e6,
		"go_sched_p999_us":         p.sched.pctl(99.9) * 1e6,
	}
}

// loadAvg is the machine's 1-minute load average.
func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return ""
}
