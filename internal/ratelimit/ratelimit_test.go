package ratelimit_test

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/internal/ratelimit"
)

// fakeClock is a settable clock.
type fakeClock struct{ t atomic.Int64 }

func newClock() *fakeClock {
	c := &fakeClock{}
	c.t.Store(time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}
func (c *fakeClock) Now() time.Time      { return time.Unix(0, c.t.Load()) }
func (c *fakeClock) Add(d time.Duration) { c.t.Add(int64(d)) }
func (c *fakeClock) Set(t time.Time)     { c.t.Store(t.UnixNano()) }

func newLimiter(t *testing.T, c ratelimit.Config) *ratelimit.Limiter {
	t.Helper()
	l, err := ratelimit.New(c)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestBurstThenRetryAfter(t *testing.T) {
	clk := newClock()
	l := newLimiter(t, ratelimit.Config{Rate: 100, Burst: 200, Now: clk.Now})
	for i := 0; i < 200; i++ {
		if ok, _ := l.Allow("a"); !ok {
			t.Fatalf("request %d of the burst refused", i)
		}
	}
	ok, ra := l.Allow("a")
	if ok || ra != 10*time.Millisecond {
		t.Fatalf("201st: ok=%v retryAfter=%v; want refused, 10ms", ok, ra)
	}
	// Another key is untouched.
	if ok, _ := l.Allow("b"); !ok {
		t.Fatal("key b refused")
	}
	clk.Add(5 * time.Millisecond)
	if ok, ra := l.Allow("a"); ok || ra != 5*time.Millisecond {
		t.Fatalf("after 5 ms: ok=%v retryAfter=%v; want refused, 5ms", ok, ra)
	}
	clk.Add(5 * time.Millisecond)
	if ok, _ := l.Allow("a"); !ok {
		t.Fatal("refused after waiting the retry-after hint")
	}
	if ok, _ := l.Allow("a"); ok {
		t.Fatal("a second token appeared from nowhere")
	}
	// A clock step backwards gives nothing.
	clk.Add(-time.Hour)
	if ok, _ := l.Allow("a"); ok {
		t.Fatal("clock going back refilled the bucket")
	}
}

// S28 (a) in miniature: one key at 1000 req/s is held to 100 req/s (after
// its burst), five keys at 50 req/s each never see a refusal.
func TestSustainedRate(t *testing.T) {
	clk := newClock()
	l := newLimiter(t, ratelimit.Config{Rate: 100, Burst: 200, Now: clk.Now})
	const seconds = 30
	accepted, refused := 0, 0
	var others [5]int
	var hintsOK = true
	for ms := 0; ms < seconds*1000; ms++ {
		ok, ra := l.Allow("flood")
		if ok {
			accepted++
		} else {
			refused++
			if ra <= 0 || ra > 10*time.Millisecond {
				hintsOK = false
			}
		}
		if ms%20 == 0 { // 50 req/s each
			for i := range others {
				if ok, _ := l.Allow(fmt.Sprint("other-", i)); !ok {
					others[i]++
				}
			}
		}
		clk.Add(time.Millisecond)
	}
	rate := float64(accepted-200) / seconds
	t.Logf("flood: %d accepted (%.1f req/s after the burst of 200), %d refused; others refused %v", accepted, rate, refused, others)
	if math.Abs(rate-100) > 10 {
		t.Errorf("accepted rate %.1f req/s; want 100 ± 10 %%", rate)
	}
	if !hintsOK {
		t.Error("a retry-after hint was not in (0, 10ms]")
	}
	if others != [5]int{} {
		t.Errorf("other keys refused: %v", others)
	}
}

// A flood of distinct keys cannot grow the map past MaxKeys, and idle
// keys are dropped as traffic goes on.
func TestBoundedKeys(t *testing.T) {
	clk := newClock()
	l := newLimiter(t, ratelimit.Config{Rate: 10, Burst: 5, MaxKeys: 100, Now: clk.Now})
	for i := 0; i < 100_000; i++ {
		l.Allow(fmt.Sprint("k", i))
		if n := l.Len(); n > 100 {
			t.Fatalf("after %d keys Len = %d > MaxKeys", i+1, n)
		}
	}
	if l.Len() != 100 {
		t.Fatalf("Len = %d; want 100", l.Len())
	}
	// After the refill time (Burst/Rate = 0.5 s) every bucket is full and
	// equivalent to a new one; a little traffic drops them.
	clk.Add(600 * time.Millisecond)
	for i := 0; i < 60; i++ {
		l.Allow("live")
	}
	if n := l.Len(); n > 1 {
		t.Errorf("Len = %d after the others idled; want 1", n)
	}
	l.Forget("live")
	if l.Len() != 0 {
		t.Errorf("Len = %d after Forget", l.Len())
	}
}

// An over-limit key stays limited while fewer than MaxKeys other keys pass
// between its requests (LRU keeps it).
func TestActiveKeyNotEvicted(t *testing.T) {
	clk := newClock()
	l := newLimiter(t, ratelimit.Config{Rate: 1, Burst: 1, MaxKeys: 50, Now: clk.Now})
	l.Allow("hot")
	for round := 0; round < 100; round++ {
		for i := 0; i < 40; i++ {
			l.Allow(fmt.Sprint("cold-", round, "-", i))
		}
		if ok, _ := l.Allow("hot"); ok {
			t.Fatalf("round %d: the limited key was let through (evicted?)", round)
		}
		clk.Add(time.Millisecond)
	}
}

func TestNewRefuses(t *testing.T) {
	for _, c := range []ratelimit.Config{{Rate: 0, Burst: 1}, {Rate: -1, Burst: 1}, {Rate: math.NaN(), Burst: 1}, {Rate: math.Inf(1), Burst: 1}, {Rate: 1, Burst: 0}} {
		if _, err := ratelimit.New(c); err == nil {
			t.Errorf("New(%+v) accepted", c)
		}
	}
}

// Real clock, many goroutines: never more than burst + rate × elapsed.
func TestConcurrentRealClock(t *testing.T) {
	l := newLimiter(t, ratelimit.Config{Rate: 200, Burst: 20})
	var accepted atomic.Int64
	start := time.Now()
	deadline := start.Add(500 * time.Millisecond)
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				if ok, _ := l.Allow("k"); ok {
					accepted.Add(1)
				}
				l.Allow(fmt.Sprint("g", g))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	limit := 20 + 200*elapsed
	t.Logf("%d accepted in %.3f s (ceiling %.0f)", accepted.Load(), elapsed, limit)
	if float64(accepted.Load()) > limit+1 {
		t.Errorf("accepted %d > burst + rate × elapsed = %.0f", accepted.Load(), limit)
	}
	if accepted.Load() < 20 {
		t.Errorf("accepted %d < burst", accepted.Load())
	}
}
