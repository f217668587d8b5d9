package link

import (
	"context"
	"time"

	"github.com/agentmesh/agentmesh/internal/deadline"
)

// callCtx is a served request's context: the link's base context (its
// values; it is never done), the request's deadline (its ttl), and the
// cancel the link gives it (the caller's cancel frame, the link's close,
// the answer sent). context.WithTimeout made a context, a timer and its
// heap entry under the runtime's timer lock for every request; most
// handlers answer without ever waiting on their context, so the context
// and its timer are made by the first Done (a deadline.Ctx), and a
// request whose handler never asks costs this struct alone. It is
// shared: the peer's cancel may end it while a call the handler makes
// with it waits, so such a call watches its Done.
type callCtx struct{ deadline.Ctx }

func newCallCtx(base context.Context, ttl time.Duration) *callCtx {
	c := new(callCtx)
	var d time.Time
	if ttl > 0 {
		d = time.Now().Add(ttl)
	}
	c.Init(base, d, true)
	return c
}

// CancelServed implements Canceler: the caller cancelled, or the link
// closed.
func (c *callCtx) CancelServed() { c.End() }
