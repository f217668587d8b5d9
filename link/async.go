package link

import (
	"container/heap"
	"context"
	"sync"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
)

// Completion receives the outcome of a call made with Link.Go: exactly
// one of res and err is non-nil. It runs on a goroutine of the link (its
// reader, its deadline timer's, or the one that closed it) and must not
// block: it hands the outcome on (queues a frame, arms a retry) and
// returns. A response may be the link reader's own, valid until Complete
// returns: what outlives it is copied out. An interface, so that a pooled
// or per-call struct completes the call without a closure made for it.
// On a binary link (Binary) the result is as it came, not yet checked as
// JSON (see FastHandler).
type Completion interface {
	Complete(res *envelope.Response, err *envelope.Error)
}

// CompletionFunc is a function as a Completion.
type CompletionFunc func(res *envelope.Response, err *envelope.Error)

// Complete calls f.
func (f CompletionFunc) Complete(res *envelope.Response, err *envelope.Error) { f(res, err) }

// asyncCall is a call made with Go, waiting in the link's async table.
type asyncCall struct {
	seq      uint64
	deadline time.Time // zero: none
	idx      int       // in the link's asyncHeap; -1 when not there
	done     Completion
}

var asyncPool = sync.Pool{New: func() any { return new(asyncCall) }}

// Go sends req over the link and returns without waiting for the answer
// (which may come, and done run, before Go returns): done runs exactly
// once, with the answer when it comes, with TIMEOUT at
// deadline (zero: none; the peer is then told to cancel), or with
// UNAVAILABLE when the link is lost. The time left until deadline travels
// in the ttl header, as with Call.
//
// It is the forward path's primitive: no goroutine waits on the call, no
// context or timer is made for it (the deadlines of a link's calls share
// one timer), and the pending entry is pooled.
//
// The error is returned (and done never runs) when the call could not be
// sent: its deadline passed, the link is closed or its send queue full
// (all not sent). seq names the call for CancelGo.
func (l *Link) Go(req *envelope.Request, deadline time.Time, done Completion) (seq uint64, _ *envelope.Error) {
	if !deadline.IsZero() && time.Until(deadline) <= 0 {
		return 0, envelope.NewError(envelope.CodeTimeout, "the deadline passed before the call was sent").MarkNotSent()
	}
	seq = l.seq.Add(1)
	// Encoded before the call is registered: once it is, it may complete
	// (the link lost) and its owner may reuse req.
	r := *req
	if !deadline.IsZero() {
		r.Headers.TTL = max(time.Until(deadline).Milliseconds(), 1)
	}
	b := GetBuf()
	*b = l.appendRequest(*b, seq, &r)
	a := l.addAsync(seq, deadline, done)
	if a == nil {
		PutBuf(b)
		return 0, UnavailableNotSent("link closed")
	}

	if !l.c.TrySend(b) {
		if l.takeAsync(seq) == nil {
			// Already completed (the link closed, and connClosed ran
			// done): report nothing more.
			return seq, nil
		}
		if l.Err() != nil {
			return 0, UnavailableNotSent("link closed")
		}
		return 0, envelope.NewError(envelope.CodeOverloaded, "link send queue is full").MarkNotSent()
	}
	if !deadline.IsZero() {
		l.armAsync(seq, a)
	}
	return seq, nil
}

// addAsync enters the call seq in the async table, to complete with
// done (nil: the link is closed).
func (l *Link) addAsync(seq uint64, deadline time.Time, done Completion) *asyncCall {
	a := asyncPool.Get().(*asyncCall)
	*a = asyncCall{seq: seq, deadline: deadline, idx: -1, done: done}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		putAsync(a)
		return nil
	}
	if l.async == nil {
		l.async = map[uint64]*asyncCall{}
	}
	l.async[seq] = a
	return a
}

// armAsync puts a, the async call seq, in the deadline heap. It is
// armed once the request is queued, so that the cancel frame a timeout
// sends follows it; unless it completed meanwhile (a is back in the
// pool, maybe another call's: its seq is no longer in the table).
func (l *Link) armAsync(seq uint64, a *asyncCall) {
	l.mu.Lock()
	if l.async[seq] == a {
		l.asyncDeadlines.push(l, a)
	}
	l.mu.Unlock()
}

// CancelGo ends the call seq made with Go, if it still waits: its
// completion runs with err, and the peer is told to cancel it.
func (l *Link) CancelGo(seq uint64, err *envelope.Error) {
	done := l.takeAsync(seq)
	if done == nil {
		return
	}
	cb := GetBuf()
	*cb = l.appendCancel(*cb, seq)
	l.c.TrySend(cb)
	done.Complete(nil, err)
}

func putAsync(a *asyncCall) {
	*a = asyncCall{}
	asyncPool.Put(a)
}

// takeAsync removes the async call seq from the table and the deadline
// heap, and returns its completion (nil when it is not there: answered,
// timed out or failed already). The entry goes back to the pool.
func (l *Link) takeAsync(seq uint64) Completion {
	l.mu.Lock()
	done := l.takeAsyncLocked(seq)
	l.mu.Unlock()
	return done
}

// takeAsyncLocked is takeAsync with l.mu held.
func (l *Link) takeAsyncLocked(seq uint64) Completion {
	a := l.async[seq]
	if a == nil {
		return nil
	}
	delete(l.async, seq)
	if a.idx >= 0 {
		heap.Remove(&l.asyncDeadlines.h, a.idx)
	}
	done := a.done
	putAsync(a)
	return done
}

// deliverAsync completes the async call seq with r, if it waits; it
// reports whether it did.
func (l *Link) deliverAsync(seq uint64, r linkResult) bool {
	done := l.takeAsync(seq)
	if done == nil {
		return false
	}
	if r.err != nil {
		done.Complete(nil, r.err)
	} else {
		done.Complete(r.res, nil)
	}
	return true
}

// failAsync completes every async call with an error of its own from
// errf (the link closed).
func (l *Link) failAsync(errf func() *envelope.Error) {
	l.mu.Lock()
	calls := l.async
	l.async = nil
	l.asyncDeadlines.stop()
	l.mu.Unlock()
	for _, a := range calls {
		done := a.done
		putAsync(a)
		done.Complete(nil, errf())
	}
}

// asyncHeap is a link's async calls by deadline, the earliest first,
// behind one timer armed for the earliest. It is guarded by the link's
// mutex (push, and takeAsync's removal), except the timer's callback,
// which takes it.
type asyncHeap struct {
	h     asyncCalls
	t     *time.Timer
	armed time.Time // when t fires; zero when it is stopped
	done  bool      // the link closed: arm no more
}

// push adds a (l.mu held) and arms the timer if a is now the earliest.
func (ah *asyncHeap) push(l *Link, a *asyncCall) {
	heap.Push(&ah.h, a)
	if ah.done || (!ah.armed.IsZero() && !a.deadline.Before(ah.armed)) {
		return
	}
	ah.armed = a.deadline
	if ah.t == nil {
		ah.t = time.AfterFunc(time.Until(a.deadline), l.asyncTimeouts)
	} else {
		ah.t.Reset(time.Until(a.deadline))
	}
}

// stop stops the timer for good (the link's mu held).
func (ah *asyncHeap) stop() {
	ah.done = true
	if ah.t != nil {
		ah.t.Stop()
	}
	ah.h = nil
}

// asyncTimeouts runs on the timer: every async call past its deadline
// ends with TIMEOUT, the peer is told to cancel it, and the timer is
// armed for the next deadline.
func (l *Link) asyncTimeouts() {
	var due []*asyncCall
	l.mu.Lock()
	ah := &l.asyncDeadlines
	now := time.Now()
	for len(ah.h) > 0 && !ah.h[0].deadline.After(now) {
		a := heap.Pop(&ah.h).(*asyncCall)
		delete(l.async, a.seq)
		due = append(due, a)
	}
	ah.armed = time.Time{}
	if len(ah.h) > 0 && !ah.done {
		ah.armed = ah.h[0].deadline
		ah.t.Reset(time.Until(ah.armed))
	}
	l.mu.Unlock()
	for _, a := range due {
		cb := GetBuf()
		*cb = l.appendCancel(*cb, a.seq)
		l.c.TrySend(cb)
		done := a.done
		putAsync(a)
		done.Complete(nil, envelope.AsError(context.DeadlineExceeded))
	}
}

// asyncCalls is a container/heap of async calls by deadline.
type asyncCalls []*asyncCall

func (h asyncCalls) Len() int           { return len(h) }
func (h asyncCalls) Less(i, j int) bool { return h[i].deadline.Before(h[j].deadline) }
func (h asyncCalls) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *asyncCalls) Push(x any) {
	a := x.(*asyncCall)
	a.idx = len(*h)
	*h = append(*h, a)
}
func (h *asyncCalls) Pop() any {
	old := *h
	a := old[len(old)-1]
	old[len(old)-1] = nil
	a.idx = -1
	*h = old[:len(old)-1]
	return a
}
