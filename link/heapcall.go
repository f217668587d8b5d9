package link

import (
	"context"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
)

// resultChan is a blocking Call's answer channel as the Completion of
// the entry its deadline keeps in the async table (callInHeap). The
// response is the reader's: it is copied.
type resultChan chan linkResult

func (ch resultChan) Complete(res *envelope.Response, err *envelope.Error) {
	if err != nil {
		ch <- linkResult{err: err}
		return
	}
	r := *res
	ch <- linkResult{res: &r}
}

// callInHeap is Call for a ctx that deadline.Lazy let wait in the deadline
// heap: the call is an async entry whose completion is the answer
// channel, so that its deadline shares the link's one timer, and the
// caller waits on the channel and the parent's Done only.
func (l *Link) callInHeap(ctx context.Context, req *envelope.Request, at time.Time, parentDone <-chan struct{}) (*envelope.Response, error) {
	left := time.Until(at)
	if left <= 0 {
		return nil, envelope.AsError(context.DeadlineExceeded).MarkNotSent()
	}
	seq := l.seq.Add(1)
	r := *req
	r.Headers.TTL = max(left.Milliseconds(), 1)
	b := GetBuf()
	*b = l.appendRequest(*b, seq, &r)
	ch := l.results.Get().(chan linkResult)
	a := l.addAsync(seq, at, resultChan(ch))
	if a == nil {
		PutBuf(b)
		l.results.Put(ch)
		return nil, UnavailableNotSent("link closed")
	}
	if !l.c.SendCtx(ctx, b) { // a full queue is waited on, within the call's deadline
		if l.takeAsync(seq) == nil {
			<-ch // the link closed and completed it (as lost): it was not sent
		}
		l.results.Put(ch)
		if ctx.Err() == nil || l.Err() != nil {
			return nil, UnavailableNotSent("link closed")
		}
		return nil, envelope.AsError(ctx.Err()).MarkNotSent()
	}
	l.armAsync(seq, a)
	select {
	case res := <-ch:
		l.results.Put(ch)
		if res.err != nil {
			return nil, res.err
		}
		if e := l.CheckBody("result", res.res.Result); e != nil {
			return nil, l.undecodable(e)
		}
		return res.res, nil
	case <-parentDone:
		if l.takeAsync(seq) == nil {
			// Completed as the call gave up: drop it. An answer (a result,
			// or an error before the deadline on a live link: the peer's)
			// is counted late, as Call counts one.
			if res := <-ch; res.res != nil || (time.Now().Before(at) && l.Err() == nil) {
				l.lateResponse()
			}
		} else {
			cb := GetBuf()
			*cb = l.appendCancel(*cb, seq)
			l.c.TrySend(cb)
		}
		l.results.Put(ch)
		return nil, envelope.AsError(ctx.Err())
	}
}
