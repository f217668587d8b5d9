package link

import (
	"context"
	"sync"
	"time"
)

// callCtx is a served request's context: the link's base context (its
// values; it is never done), the request's deadline (its ttl), and the
// cancel the link gives it (the caller's cancel frame, the link's close,
// the answer sent). context.WithTimeout made a context, a timer and its
// heap entry under the runtime's timer lock for every request; most
// handlers answer without ever waiting on their context, so here that
// context is made by the first Done (context.WithDeadline, exactly what
// every request had before), and a request whose handler never asks
// costs this struct alone. Until then Err reads the clock against the
// deadline, so a handler that polls Err sees DEADLINE_EXCEEDED on time.
//
// Once made, the inner context answers Done, Err and Value: a context
// derived from this one, directly or through value contexts (a span, the
// agent's request), finds the inner one as its parent and registers with
// it, as it did with WithTimeout's, with no goroutine to watch it.
type callCtx struct {
	base     context.Context // the link's base: values only
	deadline time.Time       // zero: none

	mu     sync.Mutex
	err    error              // the end before inner was made
	inner  context.Context    // made by the first Done
	cancel context.CancelFunc // inner's
}

func newCallCtx(base context.Context, ttl time.Duration) *callCtx {
	c := &callCtx{base: base}
	if ttl > 0 {
		c.deadline = time.Now().Add(ttl)
	}
	return c
}

func (c *callCtx) Deadline() (time.Time, bool) { return c.deadline, !c.deadline.IsZero() }

func (c *callCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inner == nil {
		if c.deadline.IsZero() {
			c.inner, c.cancel = context.WithCancel(c.base)
		} else {
			c.inner, c.cancel = context.WithDeadline(c.base, c.deadline)
		}
		if c.err != nil {
			c.cancel() // ended before: Canceled (a past deadline made it DeadlineExceeded already)
		}
	}
	return c.inner.Done()
}

func (c *callCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inner != nil {
		return c.inner.Err()
	}
	if c.err == nil && !c.deadline.IsZero() && !time.Now().Before(c.deadline) {
		c.err = context.DeadlineExceeded
	}
	return c.err
}

func (c *callCtx) Value(key any) any {
	c.mu.Lock()
	inner := c.inner
	c.mu.Unlock()
	if inner != nil {
		return inner.Value(key)
	}
	return c.base.Value(key)
}

// CancelServed implements Canceler: the caller cancelled, or the link
// closed.
func (c *callCtx) CancelServed() { c.end() }

// end cancels c (the first end, or the deadline, wins).
func (c *callCtx) end() {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.inner != nil:
		c.cancel()
	case c.err != nil:
	case !c.deadline.IsZero() && time.Until(c.deadline) <= 0:
		c.err = context.DeadlineExceeded
	default:
		c.err = context.Canceled
	}
}
