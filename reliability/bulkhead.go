package reliability

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
)

// BulkheadConfig bounds one pool: at most MaxConcurrent calls run, at most
// QueueSize wait (each at most QueueTimeout), the rest are refused with
// OVERLOADED at once.
type BulkheadConfig struct {
	MaxConcurrent int           `koanf:"maxConcurrent" json:"maxConcurrent"`
	QueueSize     int           `koanf:"queueSize" json:"queueSize"`
	QueueTimeout  time.Duration `koanf:"queueTimeout" json:"queueTimeout"`
}

// DefaultBulkheadConfig is the kOS seed's: 100 running, 1,000 queued, 30 s.
func DefaultBulkheadConfig() BulkheadConfig {
	return BulkheadConfig{MaxConcurrent: 100, QueueSize: 1000, QueueTimeout: 30 * time.Second}
}

// Priority ranks a call for a full bulkhead: higher runs first, lower is
// shed first.
type Priority uint8

// The kOS priorities.
const (
	PriorityLow Priority = iota
	PriorityNormal
	PriorityHigh
	PriorityCritical
	numPriorities
)

// ParsePriority maps the priority header ("" is normal).
func ParsePriority(s string) Priority {
	switch s {
	case envelope.PriorityLow:
		return PriorityLow
	case envelope.PriorityHigh:
		return PriorityHigh
	case envelope.PriorityCritical:
		return PriorityCritical
	}
	return PriorityNormal
}

// Bulkhead is one pool. When the queue is full, an arriving call evicts
// the newest queued call of a lower priority (which gets OVERLOADED);
// queued calls are admitted highest priority first, FIFO within one
// priority. So low-priority calls are shed before high ones, and a
// critical call is never shed while a lower one is queued.
// Safe for concurrent use.
type Bulkhead struct {
	cfg      BulkheadConfig
	mu       sync.Mutex
	active   int
	queued   int
	queues   [numPriorities][]*waiter
	rejected atomic.Int64
	rel      func() // b.release, bound once so that Acquire does not allocate it
}

type waiter struct {
	ch chan bool // true: admitted; false: shed
}

// NewBulkhead returns a pool; MaxConcurrent <= 0 means unbounded.
func NewBulkhead(cfg BulkheadConfig) *Bulkhead {
	b := &Bulkhead{cfg: cfg}
	b.rel = b.release
	return b
}

// Rejected counts the calls refused or shed so far.
func (b *Bulkhead) Rejected() int64 { return b.rejected.Load() }

// Active returns the calls running and queued now.
func (b *Bulkhead) Active() (running, queued int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.active, b.queued
}

func (b *Bulkhead) overloaded(why string) *envelope.Error {
	b.rejected.Add(1)
	return envelope.NewError(envelope.CodeOverloaded, why).MarkNotSent()
}

// Acquire waits for a slot. On success call release exactly once.
func (b *Bulkhead) Acquire(ctx context.Context, p Priority) (release func(), err error) {
	if b.cfg.MaxConcurrent <= 0 {
		return noRelease, nil
	}
	b.mu.Lock()
	if b.active < b.cfg.MaxConcurrent && b.queued == 0 {
		b.active++
		b.mu.Unlock()
		return b.rel, nil
	}
	if b.queued >= b.cfg.QueueSize && !b.evictLocked(p) {
		b.mu.Unlock()
		return nil, b.overloaded("bulkhead full: calls running and queue full")
	}
	w := &waiter{ch: make(chan bool, 1)}
	b.queues[p] = append(b.queues[p], w)
	b.queued++
	b.mu.Unlock()

	var timeout <-chan time.Time
	// No timer of its own when the caller's deadline comes first: ctx
	// ends the wait then, and a timer per queued call costs an allocation
	// and two heap operations under the runtime's timer lock.
	if d, ok := ctx.Deadline(); b.cfg.QueueTimeout > 0 && (!ok || time.Until(d) > b.cfg.QueueTimeout) {
		t := time.NewTimer(b.cfg.QueueTimeout)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case ok := <-w.ch:
		if ok {
			return b.rel, nil
		}
		return nil, b.overloaded("shed from the bulkhead queue by a call of higher priority")
	case <-timeout:
		if b.dequeue(w, p) {
			return nil, b.overloaded("waited the bulkhead's queue timeout")
		}
	case <-ctx.Done():
		if b.dequeue(w, p) {
			return nil, envelope.AsError(ctx.Err())
		}
	}
	// Admitted or shed just as we gave up: the verdict stands.
	if <-w.ch {
		return b.rel, nil
	}
	return nil, b.overloaded("shed from the bulkhead queue by a call of higher priority")
}

// TryAcquire takes a slot if one is free with no call queued, without
// waiting; ok is false when Acquire would queue the call (or refuse it).
// On success call release exactly once.
func (b *Bulkhead) TryAcquire() (release func(), ok bool) {
	if b.cfg.MaxConcurrent <= 0 {
		return noRelease, true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.active < b.cfg.MaxConcurrent && b.queued == 0 {
		b.active++
		return b.rel, true
	}
	return nil, false
}

func noRelease() {}

// evictLocked sheds the newest queued call of the lowest priority below p.
func (b *Bulkhead) evictLocked(p Priority) bool {
	for lp := Priority(0); lp < p; lp++ {
		q := b.queues[lp]
		if n := len(q); n > 0 {
			w := q[n-1]
			b.queues[lp] = q[:n-1]
			b.queued--
			w.ch <- false
			return true
		}
	}
	return false
}

// dequeue removes w if it is still queued.
func (b *Bulkhead) dequeue(w *waiter, p Priority) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	q := b.queues[p]
	for i, x := range q {
		if x == w {
			b.queues[p] = append(q[:i], q[i+1:]...)
			b.queued--
			return true
		}
	}
	return false
}

func (b *Bulkhead) release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for p := numPriorities - 1; ; p-- {
		if q := b.queues[p]; len(q) > 0 {
			w := q[0]
			b.queues[p] = q[1:]
			b.queued--
			w.ch <- true // the slot passes on; active stays
			return
		}
		if p == 0 {
			break
		}
	}
	b.active--
}
