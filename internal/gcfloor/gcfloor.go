// Package gcfloor keeps the garbage collector from running on a small
// heap far more often than its work is worth.
//
// With GOGC=100 the runtime collects each time the heap doubles (once it
// has reached 4 MiB). A hub's live heap is a few MiB until it holds
// thousands of links, while routing 100,000 calls a second allocates
// about 150 MB/s: forty collections a second, each with two
// stop-the-world pauses, a mark phase that takes a quarter of the Ps and
// assists charged to whichever goroutine allocates next. Those
// collections were the hub's tail latency at 128 calls in flight (p99
// 2.58 ms with GOGC=400 against 4.05–4.83 ms at 100, NATS 2.6 ms, in
// bench/'s harness).
//
// Start sets the heap goal after every collection to at least the live
// heap plus a floor, as Java's -Xms or the runtime's proposed minimum
// heap (golang/go#44309) would: GOGC stays as configured once the live
// heap is past the floor, so a large hub keeps its proportional headroom
// and no more. The memory cost is bounded: at most the floor above what
// GOGC alone would allow. A GOMEMLIMIT still caps the heap.
package gcfloor

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// DefaultFloor is meshd's default: room for about half a second of
// allocation at 100,000 routed calls a second.
const DefaultFloor = 64 << 20

// The runtime's goal is live + (live + stacks + globals) × GOGC/100: the
// GOGC headroom covers the scannable stacks and globals too (Go 1.18's
// pacer), which in meshd are a few MiB, as large as its live heap.
var scanMetrics = []string{"/gc/heap/live:bytes", "/gc/scan/stack:bytes", "/gc/scan/globals:bytes"}

// Floor keeps the heap goal at least live + bytes (Start).
type Floor struct {
	bytes uint64
	base  int // the GOGC in effect at Start

	mu      sync.Mutex
	stopped bool
	percent int // the GOGC set now
	sample  []metrics.Sample
}

// sentinel is collected once per GC cycle; its cleanup adjusts the goal
// and makes the next one. 32 bytes: never in the tiny allocator, whose
// blocks live as long as their longest-lived object.
type sentinel [4]uint64

// Start keeps the heap goal at least the live heap plus bytes until Stop.
// GOGC is process-wide: a process runs one floor at a time.
// It does nothing (and Stop does nothing) when bytes is 0 or the GOGC
// environment variable is set: an operator who tuned the collector
// keeps their setting.
func Start(bytes uint64) *Floor {
	f := &Floor{bytes: bytes, base: gogc()}
	for _, name := range scanMetrics {
		f.sample = append(f.sample, metrics.Sample{Name: name})
	}
	if bytes == 0 || os.Getenv("GOGC") != "" {
		f.stopped = true
		return f
	}
	if f.base <= 0 {
		f.stopped = true // GC off or unknown: nothing to raise
		return f
	}
	f.percent = f.base
	f.mu.Lock()
	f.adjustLocked()
	f.mu.Unlock()
	f.arm()
	return f
}

// Percent is the GOGC the floor set last (the configured one when the
// live heap is past the floor, or when stopped).
func (f *Floor) Percent() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return f.base
	}
	return f.percent
}

// Stop gives the collector back its configured GOGC. Cleanups already
// queued find the floor stopped and end there.
func (f *Floor) Stop() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return
	}
	f.stopped = true
	debug.SetGCPercent(f.base)
}

// arm allocates the sentinel whose collection runs cycle.
func (f *Floor) arm() {
	runtime.AddCleanup(new(sentinel), (*Floor).cycle, f)
}

// cycle runs once per GC cycle, on the runtime's cleanup goroutine.
func (f *Floor) cycle() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stopped {
		return
	}
	f.adjustLocked()
	f.arm()
}

// adjustLocked sets GOGC so that the next goal, live + (live + stacks +
// globals) × GOGC/100, is at least live + bytes, and never below the
// configured GOGC. It leaves GOGC alone when the change would be under an
// eighth: the live heap moves a little every cycle.
func (f *Floor) adjustLocked() {
	metrics.Read(f.sample)
	var v [3]uint64 // live, stacks, globals
	for i, s := range f.sample {
		if s.Value.Kind() == metrics.KindUint64 {
			v[i] = s.Value.Uint64()
		}
	}
	p := percentFor(v[0], v[0]+v[1]+v[2], f.bytes, f.base)
	if p == f.percent || (abs(p-f.percent) < f.percent/8 && p != f.base) {
		return
	}
	f.percent = p
	debug.SetGCPercent(p)
}

// maxPercent bounds GOGC: a heap of a few hundred KiB (just started)
// would otherwise ask for tens of thousands.
const maxPercent = 5000

// minHeap is the runtime's smallest goal at GOGC=100; it scales with
// GOGC (4 MiB × GOGC/100).
const minHeap = 4 << 20

// percentFor is the GOGC whose goal is live + floor: its headroom over
// scan (the live heap, stacks and globals) is floor, and the minimum
// goal it scales to stays within live + floor. Never below base.
func percentFor(live, scan, floor uint64, base int) int {
	if scan == 0 {
		return base // nothing measured yet: GOGC as configured
	}
	p := min(floor*100/scan, (live+floor)*100/minHeap, maxPercent)
	return max(base, int(p))
}

// gogc is the GOGC in effect (-1: off).
func gogc() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return -1
	}
	v := s[0].Value.Uint64()
	if v == 0 || v > 1<<30 {
		return -1 // off
	}
	return int(v)
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
