package reliability

import (
	"slices"
	"sync"
	"time"

	"github.com/agentmesh/agentmesh/internal/cow"
)

// Latency keeps the recent successful latencies of each method, so that a
// retry that could not finish in the time left is not started. Safe for
// concurrent use; Observe allocates nothing once a method is known.
type Latency struct {
	methods cow.Map[string, *latRing]
}

const latSamples = 128

type latRing struct {
	mu  sync.Mutex
	buf [latSamples]time.Duration
	n   int // samples written
}

// NewLatency returns an empty tracker.
func NewLatency() *Latency { return &Latency{} }

// Observe records how long a successful call of method took.
func (l *Latency) Observe(method string, d time.Duration) {
	if l == nil {
		return
	}
	r := l.methods.LoadOrCreate(method, func() *latRing { return &latRing{} })
	r.mu.Lock()
	r.buf[r.n%latSamples] = d
	r.n++
	r.mu.Unlock()
}

// P90 returns the 90th percentile of the method's recent latencies, and
// false while fewer than 10 are known.
func (l *Latency) P90(method string) (time.Duration, bool) {
	if l == nil {
		return 0, false
	}
	r, ok := l.methods.Load(method)
	if !ok {
		return 0, false
	}
	r.mu.Lock()
	n := min(r.n, latSamples)
	s := slices.Clone(r.buf[:n])
	r.mu.Unlock()
	if n < 10 {
		return 0, false
	}
	slices.Sort(s)
	return s[n*9/10], true
}
