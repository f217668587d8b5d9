// Package deadline is context.WithDeadline for calls, without its cost
// when nothing waits on it (Ctx), and the test that tells a waiter it
// may wait for such a deadline on a timer of its own (Lazy).
package deadline

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Ctx is context.WithDeadline (or WithCancel, with no deadline) for
// calls, without its cost when nothing waits on it: context.WithDeadline
// makes a context, a runtime timer and, at the first Done, a channel, a
// tenth of a caller's CPU per call. A Ctx makes them only when Done is
// first asked for (then exactly what context.WithDeadline makes); until
// then Err reads the clock against the deadline, and a waiter that holds
// deadlines of its own (a link's deadline heap, a bulkhead's queue) asks
// Lazy and, when it may, waits for the deadline on its one timer for
// all and for the parent's Done, not for Done.
//
// Any context derived from it that can be cancelled (WithCancel,
// WithTimeout) asks for Done when it is made, so a waiter sees a Ctx
// still without its timer only when nothing between them can be
// cancelled. End it when the call is done, as a CancelFunc.
type Ctx struct {
	parent   context.Context
	deadline time.Time // zero: none
	shared   bool      // anyone may End it at any time (Init): Lazy says no

	mu     sync.Mutex
	err    error              // the end before inner was made (sticky)
	inner  context.Context    // made by the first Done
	cancel context.CancelFunc // inner's
	// made is inner, for Value without the lock: once inner exists, a
	// context derived from c must find inner's cancellation through
	// Value, or context.WithCancel starts a goroutine to watch it.
	made atomic.Pointer[context.Context]
}

// ctxKey finds a Ctx through the contexts derived from it.
type ctxKey struct{}

// New returns a context that ends at d (or with parent), as
// context.WithDeadline's does; End releases it. Its owner ends it, once
// the call made with it returned.
func New(parent context.Context, d time.Time) *Ctx {
	c := new(Ctx)
	c.Init(parent, d, false)
	return c
}

// Init makes c, held in a struct of the caller's (no allocation of its
// own), what New makes; a zero d is no deadline (context.WithCancel).
// shared is for a Ctx that anyone may End while calls made with it wait
// (a served request's, ended by its caller's cancel or the link's loss):
// Lazy says no for it, so that those calls watch its Done.
func (c *Ctx) Init(parent context.Context, d time.Time, shared bool) {
	if pd, ok := parent.Deadline(); ok && (d.IsZero() || pd.Before(d)) {
		d = pd // the parent's comes first
	}
	c.parent, c.deadline, c.shared = parent, d, shared
}

func (c *Ctx) Deadline() (time.Time, bool) { return c.deadline, !c.deadline.IsZero() }

func (c *Ctx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inner == nil {
		if c.deadline.IsZero() {
			c.inner, c.cancel = context.WithCancel(c.parent)
		} else {
			c.inner, c.cancel = context.WithDeadline(c.parent, c.deadline)
		}
		c.made.Store(&c.inner)
		if c.err == context.Canceled {
			c.cancel() // ended before (a passed deadline made it DeadlineExceeded already)
		}
	}
	return c.inner.Done()
}

func (c *Ctx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inner != nil {
		return c.inner.Err()
	}
	if c.err == nil {
		if err := c.parent.Err(); err != nil {
			c.err = err
		} else if c.passed() {
			c.err = context.DeadlineExceeded
		}
	}
	return c.err
}

// passed reports whether c's deadline (if any) has passed.
func (c *Ctx) passed() bool { return !c.deadline.IsZero() && !time.Now().Before(c.deadline) }

func (c *Ctx) Value(key any) any {
	if key == (ctxKey{}) {
		return c
	}
	if inner := c.made.Load(); inner != nil {
		return (*inner).Value(key)
	}
	return c.parent.Value(key)
}

// End cancels c, as context.WithDeadline's CancelFunc does (the first
// end, or the deadline, wins). A waiter that Lazy let wait without Done
// is not woken by it: End is for the owner, once the call made with c
// returned (as mesh.Client.Call does); to cancel a call in flight,
// cancel c's parent, or make c shared (Init).
func (c *Ctx) End() {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.inner != nil:
		c.cancel()
	case c.err != nil:
	case c.passed():
		c.err = context.DeadlineExceeded
	default:
		c.err = context.Canceled
	}
}

// Lazy reports whether a waiter may wait for ctx's deadline on a timer
// of its own instead of on ctx.Done: ctx's deadline is that of a Ctx
// (not shared) whose Done was never asked for, so that nothing derived
// from it can be cancelled on its own. Then ctx ends only at the
// deadline or with the Ctx's parent, whose Done is returned to wait on
// (nil when it never ends).
func Lazy(ctx context.Context) (deadline time.Time, parentDone <-chan struct{}, ok bool) {
	dc, _ := ctx.Value(ctxKey{}).(*Ctx)
	if dc == nil || dc.shared || dc.deadline.IsZero() {
		return time.Time{}, nil, false
	}
	if d, has := ctx.Deadline(); !has || !d.Equal(dc.deadline) {
		return time.Time{}, nil, false
	}
	dc.mu.Lock()
	made := dc.inner != nil || dc.err != nil
	dc.mu.Unlock()
	if made {
		return time.Time{}, nil, false
	}
	return dc.deadline, dc.parent.Done(), true
}
