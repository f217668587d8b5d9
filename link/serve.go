package link

import (
	"context"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/stream"
)

// Serving the peer's requests: admission, the kept workers that run the
// handler, the fast handler that may take a request on the reader, and
// the answers.

// credit is a streaming call's initial credit (req.Stream).
func (l *Link) startServing(seq uint64, req *envelope.Request, credit stream.Credit) {
	if l.serve == nil {
		l.reply(seq, nil, envelope.NewError(envelope.CodeMethodNotFound, "this peer serves no methods"))
		return
	}
	if l.nserving.Add(1) > int64(l.maxServing) {
		l.nserving.Add(-1)
		l.reply(seq, nil, envelope.Errorf(envelope.CodeOverloaded, "more than %d requests in flight on this link", l.maxServing))
		return
	}
	if l.fast != nil && !req.Stream {
		if !l.admit(seq, req) {
			return
		}
		if l.fast(l, seq, req) {
			return // it answers with Answer
		}
		l.c.Release(1, requestBytes(req))
	}
	if l.v2 { // the handler gets params checked as JSON (a FastHandler takes them as they came)
		if e := l.CheckBody("params", req.Params); e != nil {
			l.nserving.Add(-1)
			l.reply(seq, nil, e)
			return
		}
	}
	cc := newCallCtx(l.base, time.Duration(req.Headers.TTL)*time.Millisecond)
	if l.inline != nil && !req.Stream && l.inline(req.Method) {
		l.serveInline(seq, req, cc)
		return
	}
	var ctx context.Context = cc
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		l.nserving.Add(-1)
		return
	}
	if !l.c.TryAdmit(1, requestBytes(req)) {
		l.mu.Unlock()
		l.refuse(seq)
		return
	}
	var ss *servedStream
	if req.Stream {
		ss = newServedStream(l, seq, credit, cc.CancelServed)
		ctx = stream.With(ctx, ss)
		l.serving[seq] = ss
	} else {
		l.serving[seq] = cc
	}
	r := new(envelope.Request)
	*r = *req
	t := task{ctx, cc, seq, r, ss}
	select {
	case l.work <- t: // an idle worker takes it
		l.mu.Unlock()
	default:
		l.wg.Add(1)
		l.mu.Unlock()
		go l.worker(t)
	}
}

// task is one incoming request for a worker.
type task struct {
	ctx context.Context
	cc  *callCtx // ctx, or what ctx derives from
	seq uint64
	r   *envelope.Request
	ss  *servedStream // a streaming call's; nil otherwise
}

// WorkerIdle is how long a kept worker (a link's, or Workers') waits for
// another task before it exits. Workers are kept because a new goroutine
// starts with a small stack that the deep call chain of a request grows
// by copying (15 % of the hub's CPU under load when every request had its
// own goroutine).
const WorkerIdle = 500 * time.Millisecond

// worker serves t, then whatever requests come while it is idle for less
// than WorkerIdle; it exits when the link closes.
func (l *Link) worker(t task) {
	defer l.wg.Done()
	idle := time.NewTimer(WorkerIdle)
	defer idle.Stop()
	for {
		l.serveOne(t)
		idle.Reset(WorkerIdle)
		select {
		case t = <-l.work:
		case <-idle.C:
			return
		case <-l.ctx.Done():
			return
		}
	}
}

// admit counts req (the request seq) against the connection's bounds,
// or refuses it (refuse): false.
func (l *Link) admit(seq uint64, req *envelope.Request) bool {
	if l.c.TryAdmit(1, requestBytes(req)) {
		return true
	}
	l.refuse(seq)
	return false
}

// refuse answers the request seq, over the connection's bounds,
// OVERLOADED (not sent), and frees its WithMaxServing slot.
func (l *Link) refuse(seq uint64) {
	l.nserving.Add(-1)
	l.reply(seq, nil, envelope.NewError(envelope.CodeOverloaded, "too many bytes or calls in flight on this link").MarkNotSent())
}

// serveInline serves req on the reader (WithInline): the handler runs
// before the reader reads on, so req, the reader's, is not copied, and
// no cancel frame (nor the link's close) can reach it while it runs: it
// is not in the serving map, but counted in inlineN (Serving). Its
// context still carries the request's deadline.
func (l *Link) serveInline(seq uint64, req *envelope.Request, cc *callCtx) {
	if !l.admit(seq, req) {
		return
	}
	l.inlineN.Add(1)
	start := time.Now()
	res, err := l.serve(cc, l, req)
	// As a FastHandler's answer: never waiting on the reader for room
	// in a full send queue (that waits on a goroutine of its own).
	l.Answer(seq, req.ID, start, res, err, requestBytes(req))
	l.inlineN.Add(-1)
	cc.End()
}

// serveOne runs the handler for one incoming request and answers it.
func (l *Link) serveOne(t task) {
	start := time.Now()
	held := requestBytes(t.r) // as startServing admitted it, before serve can touch r
	res, err := l.serve(t.ctx, l, t.r)
	// The slot is free before the answer can reach the peer, which may
	// send its next call at once; the serving map is left after the
	// answer is queued: Serving() == 0 means every answer is queued (a
	// draining hub waits for that before closing).
	l.nserving.Add(-1)
	if t.ss != nil {
		n := t.ss.end() // no more chunks: the end follows the last
		l.c.Send(l.encodeEnd(t.seq, n, t.r.ID, start, res, err))
	} else {
		l.answer(t.seq, t.r.ID, start, res, err)
	}
	l.endServing(t.seq, held)
	t.cc.End()
}

// answer queues the answer to the served request seq (request id id,
// served since start).
func (l *Link) answer(seq uint64, id string, start time.Time, res *envelope.Response, err error) {
	l.c.Send(l.encodeAnswer(seq, id, start, res, err))
}

// encodeAnswer encodes answer's frame.
func (l *Link) encodeAnswer(seq uint64, id string, start time.Time, res *envelope.Response, err error) *[]byte {
	b := GetBuf()
	if err != nil {
		*b = l.appendResponse(*b, seq, &envelope.Response{ID: id, Timestamp: time.Now().UnixMilli(),
			Metrics: envelope.Metrics{LatencyMs: ms(time.Since(start)), Backend: l.backend}}, envelope.AsError(err))
		return b
	}
	if res.ID == "" {
		res.ID = id
	}
	*b = l.appendResponse(*b, seq, res, nil)
	return b
}

// encodeEnd encodes the end of the stream seq after n chunks, as
// encodeAnswer encodes an answer.
func (l *Link) encodeEnd(seq, n uint64, id string, start time.Time, res *envelope.Response, err error) *[]byte {
	b := GetBuf()
	if err != nil {
		*b = l.appendEnd(*b, seq, n, &envelope.Response{ID: id, Timestamp: time.Now().UnixMilli(),
			Metrics: envelope.Metrics{LatencyMs: ms(time.Since(start)), Backend: l.backend}}, envelope.AsError(err))
		return b
	}
	if res.ID == "" {
		res.ID = id
	}
	*b = l.appendEnd(*b, seq, n, res, nil)
	return b
}

// endServing ends what startServing counted for the request seq (held
// bytes), once its answer is queued.
// (WithMaxServing's slot was freed before the answer was encoded.)
func (l *Link) endServing(seq uint64, held int) {
	l.c.Release(1, held)
	l.mu.Lock()
	delete(l.serving, seq)
	l.mu.Unlock()
}

// requestBytes is what a served request holds of the message it came in
// (its params, the bulk of it), for the connection's bounds.
func requestBytes(r *envelope.Request) int { return len(r.Params) + 256 }

// Canceler is a request this side serves, as the link cancels it: when
// the peer sends a cancel frame for it, or the link closes.
type Canceler interface{ CancelServed() }

// FastHandler serves a request from the link's reader goroutine, without
// a worker: it reports whether it took the request. One that takes it
// calls Track before it sends anything on, must not block, and answers
// with Answer exactly once (from any goroutine). One that does not take
// it leaves req as it was, and the link's handler (WithHandler) serves it.
// req is the reader's: what outlives the call is copied out of it. On a
// binary link (Binary) req.Params are as they came, not yet checked as
// JSON: one that decodes them, or sends them where JSON is expected (a
// JSON link, a handler), checks them first (CheckBody); one that forwards
// them to another binary link need not.
type FastHandler func(l *Link, seq uint64, req *envelope.Request) bool

// WithFast sets a FastHandler, tried before the handler for each request
// from the peer (after the link's own admission: WithMaxServing, the
// connection's bounds).
func WithFast(f FastHandler) Option { return func(l *Link) { l.fast = f } }

// WithInline names the requests the handler serves on the link's reader
// goroutine instead of a worker: inline(method) true for a method whose
// handler answers from memory without blocking (no I/O, no lock held
// for long, no wait on its context). It saves the hand-off to a worker
// and the worker's wake-up, a third of an echo agent's CPU per call; in
// exchange, while the handler runs the link reads nothing else: a
// handler that blocks stalls every call on the link, and its cancel
// frame cannot reach it (its deadline still bounds its context). A
// streaming request always goes to a worker.
func WithInline(inline func(method string) bool) Option {
	return func(l *Link) { l.inline = inline }
}

// Base is the parent the link gives its served requests' contexts (the
// values of WithContext, no cancellation): for a FastHandler, which makes
// no context of its own.
func (l *Link) Base() context.Context { return l.base }

// Track registers c for the request seq a FastHandler took: a cancel
// frame for seq, or the link's loss, calls c.CancelServed. false: the
// link is closed (nothing is to be sent for the request; Answer it).
func (l *Link) Track(seq uint64, c Canceler) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.serving[seq] = c
	return true
}

// Answer answers the request seq a FastHandler took, as a worker answers
// the handler's (an error's response carries the request id id and the
// latency since start), and ends what the link counted for it. held is
// the request's size as the link admitted it: RequestBytes of it.
//
// It never blocks: it runs on another link's reader (the one the answer
// came in on). When the peer's send queue is full, the answer waits for
// room on a goroutine of its own, as a worker would have (Conn.Send).
func (l *Link) Answer(seq uint64, id string, start time.Time, res *envelope.Response, err error, held int) {
	l.nserving.Add(-1) // free before the peer can see the answer (serveOne)
	wait := l.c.TrySendOwed(l.encodeAnswer(seq, id, start, res, err))
	if wait == nil {
		l.endServing(seq, held)
		return
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		wait() // returns at once: the connection is closed
		l.endServing(seq, held)
		return
	}
	l.wg.Add(1) // under mu, before closed is set: Close's Wait sees it
	l.mu.Unlock()
	go func() {
		defer l.wg.Done()
		wait()
		l.endServing(seq, held)
	}()
}

// RequestBytes is what the link counts for a served request (Answer's
// held).
func RequestBytes(r *envelope.Request) int { return requestBytes(r) }
