package reliability

import (
	"container/heap"
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/deadline"
	"github.com/agentmesh/agentmesh/internal/mono"
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
//
// A call waits in the queue one of two ways: Acquire blocks its
// goroutine; a Waiter (Init, Enqueue) waits with no goroutine, and its
// Admitter hears the verdict: from the call whose release frees the
// slot, the call that sheds it, or the pool's timer.
// Safe for concurrent use.
type Bulkhead struct {
	cfg      BulkheadConfig
	mu       sync.Mutex
	active   int
	queued   int
	queues   [numPriorities][]*Waiter
	rejected atomic.Int64
	rel      func() // b.release, bound once so that Acquire does not allocate it

	// Waiters admitted by a release, whose admit funcs run one after
	// the other in handOff, on the goroutine of the release that found
	// none running (handing).
	handoff  []*Waiter
	handNext int // the next in handoff to admit
	handing  bool

	// The queue timeouts and deadlines of the Waiters queued (Enqueue):
	// a heap, earliest first, and one timer for the pool, armed at
	// armedAt (mono) or earlier. A Waiter that leaves the queue leaves
	// the heap and the timer as it is: a timer that finds nothing due
	// re-arms for what is (an idle pool's timer fires at most once more).
	expiries waiterHeap
	expTimer *time.Timer
	armedAt  int64
}

// waiterHeap orders queued Waiters by expiry (container/heap).
type waiterHeap []*Waiter

func (h waiterHeap) Len() int           { return len(h) }
func (h waiterHeap) Less(i, j int) bool { return h[i].expires < h[j].expires }
func (h waiterHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].hi, h[j].hi = i+1, j+1
}
func (h *waiterHeap) Push(x any) {
	w := x.(*Waiter)
	w.hi = len(*h) + 1
	*h = append(*h, w)
}
func (h *waiterHeap) Pop() any {
	old := *h
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	w.hi = 0
	return w
}

// A Waiter is a call queued without a goroutine (Init, then Enqueue).
type Waiter struct {
	b       *Bulkhead
	p       Priority
	ch      chan verdict // Acquire's
	admit   Admitter     // a Waiter's
	expires int64        // mono: its queue timeout or deadline, while in b.expiries
	hi      int          // its index in b.expiries, plus one; 0: not in it
	byDeath bool         // expires is the call's deadline, not the queue timeout
}

// An Admitter hears a queued call's verdict (Waiter).
type Admitter interface {
	Admitted(release func(), err *envelope.Error)
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

const (
	whyFull    = "bulkhead full: calls running and queue full"
	whyShed    = "shed from the bulkhead queue by a call of higher priority"
	whyTimeout = "waited the bulkhead's queue timeout"
)

// Acquire waits for a slot. On success call release exactly once.
func (b *Bulkhead) Acquire(ctx context.Context, p Priority) (release func(), err error) {
	if b.cfg.MaxConcurrent <= 0 {
		return noRelease, nil
	}
	b.mu.Lock()
	release, shed, refused := b.arriveLocked(p)
	if release != nil || refused != nil {
		b.mu.Unlock()
		if refused != nil {
			return nil, refused
		}
		return release, nil
	}
	// The wait ends at ctx's deadline by the pool's timer, which also
	// keeps the queue timeout: no timer of the call's own. A ctx whose
	// Done nothing asked for yet (deadline.Lazy) is waited for by its
	// parent's Done alone, so that the wait makes no timer either.
	at, _ := ctx.Deadline()
	_, done, lazy := deadline.Lazy(ctx)
	w := &Waiter{b: b, p: p, ch: make(chan verdict, 1)}
	b.queueLocked(w, at)
	b.mu.Unlock()
	b.shed(shed)
	if !lazy {
		done = ctx.Done()
	}
	select {
	case v := <-w.ch:
		return b.verdict(v)
	case <-done:
		if b.dequeue(w) {
			return nil, envelope.AsError(ctx.Err())
		}
	}
	// Admitted, shed or expired just as we gave up: the verdict stands.
	return b.verdict(<-w.ch)
}

// verdict is what a blocked Acquire's Waiter heard.
type verdict uint8

const (
	admitted verdict = iota
	wasShed
	queueTimedOut
	deadlinePassed
)

// verdict is Acquire's answer for v.
func (b *Bulkhead) verdict(v verdict) (func(), error) {
	switch v {
	case admitted:
		return b.rel, nil
	case wasShed:
		return nil, b.overloaded(whyShed)
	case queueTimedOut:
		return nil, b.overloaded(whyTimeout)
	default:
		return nil, envelope.AsError(context.DeadlineExceeded)
	}
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

// Init makes w, which the caller holds (a field of its own struct: no
// allocation), a call of priority p in b ready to Enqueue: a will hear
// its verdict, once, unless Withdraw takes it back first. Admitted gets
// a release (call it exactly once) or a coded error: OVERLOADED when the
// call was shed or waited the queue timeout, DEADLINE_EXCEEDED when its
// deadline came first. It runs on another call's goroutine (the one that
// released or shed) or on the pool's timer: it must not block.
func (w *Waiter) Init(b *Bulkhead, p Priority, a Admitter) { *w = Waiter{b: b, p: p, admit: a} }

// Enqueue is Acquire without a goroutine: it takes a slot at once
// (release), refuses the call at once (err: the queue is full and holds
// nothing of a lower priority to shed), or queues it (both nil) until a
// slot frees, a higher call sheds it, the queue timeout or deadline (if
// not zero) passes, or Withdraw; w.admit is called then, not before
// Enqueue returns.
func (b *Bulkhead) Enqueue(w *Waiter, deadline time.Time) (release func(), err *envelope.Error) {
	if b.cfg.MaxConcurrent <= 0 {
		return noRelease, nil
	}
	b.mu.Lock()
	release, shed, err := b.arriveLocked(w.p)
	if release != nil || err != nil {
		b.mu.Unlock()
		return release, err
	}
	b.queueLocked(w, deadline)
	b.mu.Unlock()
	b.shed(shed)
	return nil, nil
}

// queueLocked queues w, which arrived to a full pool, with its expiry:
// the queue timeout, or the call's deadline (if not zero) when that
// comes first, on the pool's one timer.
func (b *Bulkhead) queueLocked(w *Waiter, deadline time.Time) {
	wait := b.cfg.QueueTimeout
	if !deadline.IsZero() {
		if d := time.Until(deadline); wait <= 0 || d < wait {
			wait, w.byDeath = max(d, 0), true
		}
	}
	if wait > 0 || !deadline.IsZero() {
		w.expires = mono.Now() + int64(wait)
		heap.Push(&b.expiries, w)
		if b.armedAt == 0 || w.expires < b.armedAt {
			b.armLocked(w.expires, wait)
		}
	}
	b.queues[w.p] = append(b.queues[w.p], w)
	b.queued++
}

// Withdraw takes back a call Enqueue queued; false: it is no longer
// queued (its admit has been or is being called).
func (w *Waiter) Withdraw() bool { return w.b.dequeue(w) }

// armLocked sets the pool's timer to fire at (mono), wait from now.
func (b *Bulkhead) armLocked(at int64, wait time.Duration) {
	b.armedAt = at
	if b.expTimer == nil {
		b.expTimer = time.AfterFunc(wait, b.expire)
	} else {
		b.expTimer.Reset(wait)
	}
}

// expire is the pool's timer: the Waiters whose queue timeout or
// deadline passed leave the queue and hear it; the timer is armed for
// the next.
func (b *Bulkhead) expire() {
	b.mu.Lock()
	b.armedAt = 0
	now := mono.Now()
	var due []*Waiter
	for len(b.expiries) > 0 && b.expiries[0].expires <= now {
		w := heap.Pop(&b.expiries).(*Waiter)
		b.removeLocked(w)
		due = append(due, w)
	}
	if len(b.expiries) > 0 {
		at := b.expiries[0].expires
		b.armLocked(at, time.Duration(at-now))
	}
	b.mu.Unlock()
	for _, w := range due {
		if w.ch != nil { // Acquire's
			if w.byDeath {
				w.ch <- deadlinePassed
			} else {
				w.ch <- queueTimedOut
			}
			continue
		}
		if w.byDeath {
			w.admit.Admitted(nil, envelope.AsError(context.DeadlineExceeded))
		} else {
			w.admit.Admitted(nil, b.overloaded(whyTimeout))
		}
	}
}

// removeLocked takes w out of its queue; false: it was not queued.
func (b *Bulkhead) removeLocked(w *Waiter) bool {
	q := b.queues[w.p]
	for i, x := range q {
		if x == w {
			b.queues[w.p] = append(q[:i], q[i+1:]...)
			q[len(q)-1] = nil
			b.queued--
			return true
		}
	}
	return false
}

func noRelease() {}

// arriveLocked is what a call of priority p gets on arrival: a slot
// (release), a refusal (err), or a place in the queue (both nil), for
// which shed, if not nil, was evicted (tell it, with shed, after b.mu).
func (b *Bulkhead) arriveLocked(p Priority) (release func(), shed *Waiter, err *envelope.Error) {
	if b.active < b.cfg.MaxConcurrent && b.queued == 0 {
		b.active++
		return b.rel, nil, nil
	}
	if b.queued >= b.cfg.QueueSize {
		if shed = b.evictLocked(p); shed == nil {
			return nil, nil, b.overloaded(whyFull)
		}
	}
	return nil, shed, nil
}

// evictLocked takes out the newest queued call of the lowest priority
// below p, for shed.
func (b *Bulkhead) evictLocked(p Priority) *Waiter {
	for lp := Priority(0); lp < p; lp++ {
		q := b.queues[lp]
		if n := len(q); n > 0 {
			w := q[n-1]
			q[n-1] = nil
			b.queues[lp] = q[:n-1]
			b.queued--
			b.unexpireLocked(w)
			return w
		}
	}
	return nil
}

// shed gives w (if any), evicted by a call of higher priority, its
// OVERLOADED; out of b.mu.
func (b *Bulkhead) shed(w *Waiter) {
	switch {
	case w == nil:
	case w.ch != nil:
		w.ch <- wasShed
	default:
		w.admit.Admitted(nil, b.overloaded(whyShed))
	}
}

// unexpireLocked takes w, which left the queue, out of the expiries.
func (b *Bulkhead) unexpireLocked(w *Waiter) {
	if w.hi > 0 {
		heap.Remove(&b.expiries, w.hi-1)
	}
}

// dequeue removes w if it is still queued.
func (b *Bulkhead) dequeue(w *Waiter) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.removeLocked(w) {
		return false
	}
	b.unexpireLocked(w)
	return true
}

func (b *Bulkhead) release() {
	b.mu.Lock()
	var w *Waiter
	for p := numPriorities - 1; ; p-- {
		if q := b.queues[p]; len(q) > 0 {
			w = q[0]
			q[0] = nil
			b.queues[p] = q[1:]
			b.queued--
			break
		}
		if p == 0 {
			break
		}
	}
	switch {
	case w == nil:
		b.active--
		b.mu.Unlock()
		return
	}
	b.unexpireLocked(w)
	if w.ch != nil {
		w.ch <- admitted // the slot passes on; active stays
		b.mu.Unlock()
		return
	}
	b.handoff = append(b.handoff, w)
	if b.handing {
		b.mu.Unlock()
		return // the goroutine running handOff admits w
	}
	b.handing = true
	b.mu.Unlock()
	b.handOff()
}

// maxHandoff bounds the admissions one goroutine makes in handOff.
const maxHandoff = 64

// handOff admits the Waiters released to it (handoff), in order, until
// none are left. The release that found none running runs it: an
// admitted call that ends at once releases again, and that admission
// runs in this loop, not one stack frame deeper. A goroutine that has
// made maxHandoff admissions hands the loop to a new goroutine, so that
// under a sustained queue no caller's release (an agent link's reader,
// completing a call) runs everybody else's admissions for long.
func (b *Bulkhead) handOff() {
	b.mu.Lock()
	for n := 0; b.handNext < len(b.handoff); n++ {
		if n == maxHandoff {
			b.mu.Unlock()
			go b.handOff() // handing stays set: the new goroutine runs the loop
			return
		}
		w := b.handoff[b.handNext]
		b.handoff[b.handNext] = nil
		b.handNext++
		b.mu.Unlock()
		w.admit.Admitted(b.rel, nil)
		b.mu.Lock()
	}
	b.handoff, b.handNext = b.handoff[:0], 0
	b.handing = false
	b.mu.Unlock()
}
