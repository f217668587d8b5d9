package gcfloor

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
)

// waitCycles runs collections until the floor's cleanup has run after
// them: a cleanup runs on the runtime's goroutine some time after the
// cycle that found its sentinel unreachable.
func waitCycles(t *testing.T, f *Floor, ok func(int) bool) int {
	t.Helper()
	var p int
	for range 200 {
		runtime.GC()
		runtime.Gosched()
		if p = f.Percent(); ok(p) {
			return p
		}
	}
	t.Fatalf("GOGC stayed %d", p)
	return p
}

func TestFloorRaisesGOGCOnASmallHeap(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	f := Start(64 << 20)
	defer f.Stop()
	// The test binary's live heap is a few MiB: the goal must be live +
	// 64 MiB, far above GOGC=100's.
	p := waitCycles(t, f, func(p int) bool { return p > 1000 })
	if got := debug.SetGCPercent(p); got != p {
		t.Fatalf("runtime GOGC %d, floor says %d", got, p)
	}
	// The runtime's goal is the live heap + the floor (to within the
	// eighth the floor lets GOGC drift, and the stacks' and globals'
	// movement): GOGC's headroom covers stacks and globals too, and a
	// floor that forgot them set meshd's goal at 200 MiB, not 66.
	var headroom uint64
	for range 200 {
		runtime.GC()
		runtime.Gosched()
		goal, live := readUint64("/gc/heap/goal:bytes"), readUint64("/gc/heap/live:bytes")
		if headroom = goal - live; headroom >= 56<<20 && headroom <= 80<<20 {
			break
		}
	}
	if headroom < 56<<20 || headroom > 80<<20 {
		t.Fatalf("heap goal %d MiB past the live heap; want the floor, 64 MiB", headroom>>20)
	}
	f.Stop()
	if got := gogc(); got != 100 {
		t.Fatalf("after Stop GOGC = %d, want 100", got)
	}
}

func readUint64(name string) uint64 {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

func TestFloorLeavesALargeHeapAlone(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	live := make([][]byte, 0, 96)
	for range 96 {
		live = append(live, make([]byte, 1<<20)) // 96 MiB live: past the floor
	}
	f := Start(32 << 20)
	defer f.Stop()
	waitCycles(t, f, func(p int) bool { return p == 100 })
	runtime.KeepAlive(live) // and no further: the heap shrinks below the floor, the goal rises again
	waitCycles(t, f, func(p int) bool { return p > 200 })
}

func TestFloorKeepsAnOperatorsGOGC(t *testing.T) {
	t.Setenv("GOGC", "100")
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	f := Start(64 << 20)
	defer f.Stop()
	for range 3 {
		runtime.GC()
	}
	if p := gogc(); p != 100 {
		t.Fatalf("GOGC set in the environment: the floor changed it to %d", p)
	}
	if p := f.Percent(); p != 100 {
		t.Fatalf("a floor that does nothing reports GOGC %d, want the configured 100", p)
	}
}

func TestPercentFor(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		live, scan, floor uint64
		base, want        int
	}{
		{4 * mib, 4 * mib, 64 * mib, 100, 1600},     // the headroom over 4 MiB scanned: 64 MiB
		{2 * mib, 5 * mib, 64 * mib, 100, 1280},     // stacks and globals count: meshd's case
		{256 << 10, 512 << 10, 64 * mib, 100, 1606}, // the minimum goal (4 MiB × GOGC/100) stays at live + floor
		{64 * mib, 66 * mib, 64 * mib, 100, 100},
		{200 * mib, 202 * mib, 64 * mib, 100, 100},
		{100 * mib, 100 * mib, 64 * mib, 50, 64},
		{1 << 10, 1 << 10, 640 * mib, 100, maxPercent},
		{0, 0, 64 * mib, 100, 100},
		{0, 0, 64 * mib, 8000, 8000},
	} {
		if got := percentFor(c.live, c.scan, c.floor, c.base); got != c.want {
			t.Errorf("percentFor(%d, %d, %d, %d) = %d, want %d", c.live, c.scan, c.floor, c.base, got, c.want)
		}
	}
}
