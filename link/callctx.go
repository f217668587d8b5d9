package link

import (
	"context"
	"sync"
	"time"
)

// callCtx is a served request's context: the link's base context (its
// values; it is never done), the request's deadline (its ttl), and the
// cancel the link gives it (the caller's cancel frame, the link's close,
// the answer sent). context.WithTimeout made a timer, a heap entry under
// the runtime's timer lock and four allocations for every request; most
// handlers answer without ever waiting on their context, so here the
// Done channel and the deadline's timer are made by the first Done (or a
// context derived from this one), and a request whose handler never asks
// costs this struct alone. Err reads the clock against the deadline, so
// a handler that polls Err sees DEADLINE_EXCEEDED on time without a timer.
type callCtx struct {
	context.Context // the link's base: values only

	deadline time.Time // zero: none

	mu     sync.Mutex
	err    error
	done   chan struct{}        // made by the first Done
	timer  *time.Timer          // the deadline's, armed by the first Done
	afters map[*func()]struct{} // AfterFunc's, run once when it ends
}

func newCallCtx(base context.Context, ttl time.Duration) *callCtx {
	c := &callCtx{Context: base}
	if ttl > 0 {
		c.deadline = time.Now().Add(ttl)
	}
	return c
}

func (c *callCtx) Deadline() (time.Time, bool) { return c.deadline, !c.deadline.IsZero() }

func (c *callCtx) Err() error {
	c.mu.Lock()
	if c.err == nil && !c.deadline.IsZero() && !time.Now().Before(c.deadline) {
		afters := c.endLocked(context.DeadlineExceeded)
		c.mu.Unlock()
		runAfters(afters)
		return context.DeadlineExceeded
	}
	err := c.err
	c.mu.Unlock()
	return err
}

func (c *callCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armLocked()
	return c.done
}

// armLocked makes the Done channel and arms the deadline's timer, once.
func (c *callCtx) armLocked() {
	if c.done != nil {
		return
	}
	c.done = make(chan struct{})
	if c.err != nil {
		close(c.done)
		return
	}
	if !c.deadline.IsZero() {
		c.timer = time.AfterFunc(time.Until(c.deadline), func() { c.end(context.DeadlineExceeded) })
	}
}

// AfterFunc runs f on its own goroutine once c ends (context.AfterFunc
// and propagateCancel use it, so that a context derived from c needs no
// goroutine to watch it); stop takes f back if it has not run.
func (c *callCtx) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	c.armLocked()
	if c.err != nil {
		c.mu.Unlock()
		go f()
		return func() bool { return false }
	}
	key := &f
	if c.afters == nil {
		c.afters = map[*func()]struct{}{}
	}
	c.afters[key] = struct{}{}
	c.mu.Unlock()
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		_, ok := c.afters[key]
		delete(c.afters, key)
		return ok
	}
}

// CancelServed implements Canceler: the caller cancelled, or the link
// closed.
func (c *callCtx) CancelServed() { c.end(context.Canceled) }

// end ends c with err, once: the first end (cancel, deadline, answer)
// wins.
func (c *callCtx) end(err error) {
	c.mu.Lock()
	afters := c.endLocked(err)
	c.mu.Unlock()
	runAfters(afters)
}

func (c *callCtx) endLocked(err error) map[*func()]struct{} {
	if c.err != nil {
		return nil
	}
	c.err = err
	if c.done != nil {
		close(c.done)
	}
	if c.timer != nil {
		c.timer.Stop()
	}
	afters := c.afters
	c.afters = nil
	return afters
}

func runAfters(afters map[*func()]struct{}) {
	for f := range afters {
		go (*f)()
	}
}
