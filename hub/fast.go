package hub

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub/guard"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/registry"
	"github.com/agentmesh/agentmesh/reliability"
	"github.com/agentmesh/agentmesh/stream"
	"github.com/agentmesh/agentmesh/telemetry"
)

// The forward path, completion-style. A routed call from a native link
// (a client's or an agent's) is taken on the link's reader: the ingress
// stages run inline (none of them blocks), the call's first attempt is
// queued on the agent's link with Link.Go, and the agent link's reader
// completes it onto the caller's link. No goroutine, context or timer is
// made for it; the agent link's deadline heap times it out.
//
// It is the ingress and routed chains, step for step, with their helpers:
// a call gets the answer, spans, metrics, log line, retry accounting,
// breakers and bulkhead the chains would have given it (TestFastPath-
// MatchesChain). What must wait goes to the blocking chain, on a
// goroutine of its own, at the step it reached:
//   - before anything ran: a call the chain treats apart (a built-in,
//     agent control, an idempotency key, a peer's forwarded call, a
//     hedged policy, a draining hub) is not taken at all;
//   - after the ingress stages: a call whose instance is not attached
//     here (a peer hub's) runs the routed chain from the bulkhead on.
//     One whose bulkhead is full waits in its queue with no goroutine
//     (Bulkhead.Enqueue): the call that frees a slot admits it, and its
//     first attempt goes out from there (Admitted);
//   - after its first attempt: a failure the policy may retry resumes the
//     retry loop (RetryOptions.Resume) as if the loop had made it.

// fastOrigin is where a call on the forward path came from, and goes back
// to: a native link, or a plain JSON-RPC WebSocket (rpcConn).
type fastOrigin interface {
	// track holds fc until answer, so that the caller's cancel or loss
	// cancels it; false: the caller is gone.
	track(fc *fastCall) bool
	// answerFast answers fc, without blocking, and forgets it.
	answerFast(fc *fastCall, res *envelope.Response, err error)
}

// linkOrigin is a native link as a fastOrigin.
type linkOrigin struct{ l *link.Link }

func (o linkOrigin) track(fc *fastCall) bool { return o.l.Track(fc.seq, fc) }
func (o linkOrigin) answerFast(fc *fastCall, res *envelope.Response, err error) {
	o.l.Answer(fc.seq, fc.req.ID, fc.start, res, err, fc.held)
}

// fastCall is one call on the forward path, from its taking to its
// answer. Its origin holds it (track) until then, to cancel it.
type fastCall struct {
	h         *Hub
	origin    fastOrigin
	seq       uint64          // the caller's on a native link
	rpcID     json.RawMessage // the caller's on a JSON-RPC WebSocket
	rpcNotify bool            // a JSON-RPC notification: nothing to answer
	req       envelope.Request
	held      int // what the origin counted for it
	start     time.Time
	ctx       context.Context // the server span's (and the link's values)
	sc        telemetry.ServerCall
	pol       *reliability.Policy
	end       time.Time  // the call's deadline; zero: none
	raw       *link.Link // a binary origin, while req.Params are unchecked (checkParams before they go anywhere but a binary agent)
	binary    bool       // the origin takes a binary agent's result unchecked

	// The first attempt, until it completes.
	attempt  telemetry.AttemptCall
	instance *registry.Instance // held (Hold) once sent
	breaker  reliability.Ticket
	bulkhead func()

	mu        sync.Mutex
	agent     *link.Link // the first attempt's link, and its seq there
	aseq      uint64
	cancel    context.CancelFunc // the blocking chain's, once it runs the call
	queued    bool               // waiter is in its bulkhead's queue
	waiter    reliability.Waiter
	cancelled bool
}

// serveFast is the link.FastHandler of callers' links.
func (h *Hub) serveFast(l *link.Link, seq uint64, req *envelope.Request) bool {
	pol := h.fastPolicy(req)
	if pol == nil {
		return false
	}
	fc := &fastCall{seq: seq, held: link.RequestBytes(req)}
	if l.Binary() {
		fc.raw, fc.binary = l, true
	}
	return h.takeFast(linkOrigin{l}, l.Base(), fc, req, pol)
}

// fastPolicy is req's policy if the forward path may take it; nil for a
// call the chain treats apart.
func (h *Hub) fastPolicy(req *envelope.Request) *reliability.Policy {
	if req.Stream || req.Headers.Hops > 0 || req.Headers.IdempotencyKey != "" || h.draining.Load() || guard.IsAgentControl(req.Method) {
		return nil
	}
	if _, ok := h.builtins[req.Method]; ok {
		return nil
	}
	pol := h.policies.For(req.Method)
	if pol.HedgeAfter > 0 && pol.Idempotent && pol.Retries > 0 {
		return nil
	}
	return pol
}

// takeFast takes req (fastPolicy gave pol) from origin onto the forward
// path, with fc's origin-specific fields set and base the origin's
// context values; false: not taken (the origin is gone), nothing done.
func (h *Hub) takeFast(origin fastOrigin, base context.Context, fc *fastCall, req *envelope.Request, pol *reliability.Policy) bool {
	// One clock reading starts the call and its server span.
	fc.h, fc.origin, fc.req, fc.start, fc.pol = h, origin, *req, time.Now(), pol
	if !origin.track(fc) {
		return false // closed: the chain drops it
	}
	h.fastTaken.Add(1)
	r := &fc.req
	// identify, telemetry, (log: finish), drain
	if r.ID == "" {
		r.ID = envelope.NewIDAt(fc.start)
	}
	fc.ctx, fc.sc = h.tel.StartServerAt(base, r, fc.start)
	if fc.sc.Recording() { // connOf costs allocations: only for a span that records
		fc.sc.SetPeer(connOf(base))
	}
	h.inflight.Add(1)
	// authenticate, limit
	var err error
	if fc.ctx, err = h.authenticate(fc.ctx, r); err != nil {
		fc.finish(nil, err)
		return true
	}
	if err := h.limit(fc.ctx, r); err != nil {
		fc.finish(nil, err)
		return true
	}
	// deadline (the stage's, then the retry loop's policy timeout)
	if r.Headers.TTL > 0 {
		fc.end = fc.start.Add(time.Duration(r.Headers.TTL) * time.Millisecond)
	} else if d := h.defaultTimeout(r); d > 0 {
		fc.end = fc.start.Add(d)
	}
	if t := pol.Timeout; t > 0 && (fc.end.IsZero() || fc.end.Sub(fc.start) > t) {
		fc.end = fc.start.Add(t)
	}
	// dispatch → route: the bulkhead, then the retry loop's first attempt
	in, b, perr, ok := fc.pick(h.routed)
	if !ok {
		return true
	}
	pool := h.bulkheads.Pool(r.Method)
	release, ok := pool.TryAcquire()
	if !ok {
		fc.enqueue(pool)
		return true
	}
	fc.bulkhead = release
	// The attempt starts now, after authentication, limits and the
	// pick, as the chain's attempt does: its duration is the agent's.
	fc.first(in, b, perr, time.Now())
	return true
}

// pick picks the instance of fc's first attempt as the retry loop's
// first attempt would (in, bound here by b; or the error perr, which
// first fails it with); false: fc went on (to the blocking chain inv,
// for a peer hub's instance) or was answered.
func (fc *fastCall) pick(inv envelope.Invoker) (in *registry.Instance, b *binding, perr error, ok bool) {
	in, _, perr = fc.h.pick(&fc.req, nil)
	if perr == nil {
		if b = fc.h.localBinding(in); b == nil {
			fc.blocking(inv) // forward() waits
			return nil, nil, nil, false
		}
	}
	if fc.raw != nil && (b == nil || !b.link.Binary()) && !fc.checkParams() {
		return nil, nil, nil, false
	}
	return in, b, perr, true
}

// enqueue queues fc in its method's full bulkhead, to be admitted
// (Admitted) when a call frees a slot.
func (fc *fastCall) enqueue(pool *reliability.Bulkhead) {
	w := &fc.waiter
	w.Init(pool, reliability.ParsePriority(fc.req.Headers.Priority), fc)
	fc.mu.Lock()
	fc.queued = true
	fc.mu.Unlock()
	release, err := pool.Enqueue(w, fc.end)
	if release != nil || err != nil { // a slot freed meanwhile, or refused at once
		fc.Admitted(release, err)
		return
	}
	fc.mu.Lock()
	cancelled := fc.cancelled
	fc.mu.Unlock()
	if cancelled && w.Withdraw() { // cancelled before it was queued
		fc.Admitted(nil, envelope.AsError(context.Canceled))
	}
}

// Admitted is fc's bulkhead verdict (reliability.Admitter): a slot,
// taken on the goroutine of the call that freed it, or the refusal.
func (fc *fastCall) Admitted(release func(), err *envelope.Error) {
	fc.mu.Lock()
	fc.queued = false
	fc.mu.Unlock()
	if err != nil {
		if on := fc.h.bulkheads.OnReject; on != nil && err.Code == envelope.CodeOverloaded {
			on(fc.req.Method)
		}
		fc.finish(nil, err)
		return
	}
	fc.bulkhead = release
	if in, b, perr, ok := fc.pick(fc.h.retried); ok {
		fc.first(in, b, perr, time.Now()) // after its wait in the queue
	}
}

// first makes fc's first attempt, begun at now, on in (bound here by b)
// or failing with the pick's error perr, fc holding its bulkhead slot.
func (fc *fastCall) first(in *registry.Instance, b *binding, perr error, now time.Time) {
	h, r := fc.h, &fc.req
	h.retry.Begin(r.Method, fc.start)
	r.Headers.RetryCount = 0
	_, fc.attempt = h.tel.StartAttemptAt(fc.ctx, r, now)
	if perr != nil {
		e := envelope.AsError(perr)
		fc.attempt.End(e)
		fc.failed(e)
		return
	}
	if fc.attempt.Recording() {
		fc.attempt.Span.SetAttributes(telemetry.InstanceAttr(in.InstanceID))
		fc.attempt.SetServer(b.link.Remote)
	}
	fc.instance = in // tried, as the chain's attempt adds it before the breaker's verdict
	ticket, err := h.breakers.Allow(reliability.BreakerKey{Method: r.Method, Instance: in.InstanceID})
	if err != nil {
		e := envelope.AsError(err)
		fc.attempt.End(e)
		fc.failed(e)
		return
	}
	fc.breaker = ticket
	in.Hold()
	deadline := fc.end
	if t := fc.pol.PerTryTimeout; t > 0 && (deadline.IsZero() || deadline.Sub(fc.start) > t) {
		deadline = fc.start.Add(t)
	}
	fc.mu.Lock()
	cancelled := fc.cancelled
	fc.agent = b.link
	fc.mu.Unlock()
	if cancelled { // the caller's link closed meanwhile
		fc.Complete(nil, envelope.AsError(context.Canceled))
		return
	}
	aseq, e := b.link.Go(r, deadline, fc)
	if e != nil {
		fc.Complete(nil, e)
		return
	}
	fc.mu.Lock()
	fc.aseq = aseq
	cancelled = fc.cancelled
	fc.mu.Unlock()
	if cancelled {
		b.link.CancelGo(aseq, envelope.AsError(context.Canceled))
	}
	return
}

// defaultTimeout is the deadline stage's bound for a call without a ttl.
func (h *Hub) defaultTimeout(req *envelope.Request) time.Duration {
	if req.Stream {
		return stream.DefaultTimeout // a stream's ttl, not a call's (the policy's timeouts bound calls)
	}
	d := h.cfg.DefaultTimeout
	if _, builtin := h.builtins[req.Method]; !builtin && req.Headers.Hops == 0 && h.policies != nil {
		if p := h.policies.For(req.Method); p.Timeout > 0 && p.Timeout < d {
			d = p.Timeout
		}
	}
	return d
}

// Complete ends the first attempt (link.Completion): on the agent link's
// reader, its deadline timer, or whoever closed it.
func (fc *fastCall) Complete(res *envelope.Response, e *envelope.Error) {
	fc.instance.Release()
	if e == nil && !fc.binary {
		if ce := fc.agent.CheckBody("result", res.Result); ce != nil { // a binary agent's, for a JSON origin
			e = envelope.Errorf(envelope.CodeInternal, "undecodable response from peer: %s", ce.Message)
		}
	}
	if e != nil { // (a nil *envelope.Error is not a nil error)
		fc.breaker.Done(e)
		fc.attempt.End(e)
		fc.failed(e)
		return
	}
	fc.breaker.Done(nil)
	now := time.Now() // the attempt's end, the call's and the server span's
	fc.attempt.EndAt(nil, now)
	fc.h.retry.Observe(fc.req.Method, now.Sub(fc.start))
	res.Metrics.Retries = 0
	fc.finishAt(res, nil, now)
}

// failed settles a failed first attempt: the answer, or the rest of the
// retry loop on a goroutine.
func (fc *fastCall) failed(e *envelope.Error) {
	if !reliability.Retries(fc.pol, e) {
		fc.finish(nil, fc.h.retry.Settle(fc.pol, fc.req.Method, e))
		return
	}
	var tried []string
	if fc.instance != nil {
		tried = []string{fc.instance.InstanceID}
	}
	fc.blocking(func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
		if fc.pol.Retries > 0 || fc.pol.HedgeAfter > 0 {
			ctx = reliability.WithTried(ctx, tried...)
		}
		return fc.h.retry.Resume(ctx, req, fc.pol, fc.h.attempts, fc.start, e)
	})
}

// blocking runs the rest of the call on the blocking chain inv, on a
// goroutine, under the call's deadline; the caller's cancel reaches it.
func (fc *fastCall) blocking(inv envelope.Invoker) {
	if fc.raw != nil && !fc.checkParams() {
		return
	}
	var ctx context.Context
	var cancel context.CancelFunc
	if fc.end.IsZero() {
		ctx, cancel = context.WithCancel(fc.ctx)
	} else {
		ctx, cancel = context.WithDeadline(fc.ctx, fc.end)
	}
	fc.mu.Lock()
	fc.cancel = cancel
	if fc.cancelled {
		cancel()
	}
	fc.mu.Unlock()
	go func() {
		res, err := inv(ctx, &fc.req)
		cancel()
		fc.finish(res, err)
	}()
}

// checkParams checks a binary origin's params as JSON before they go
// where JSON is expected; false: they are not, and the call is answered.
func (fc *fastCall) checkParams() bool {
	if e := fc.raw.CheckBody("params", fc.req.Params); e != nil {
		fc.finish(nil, e)
		return false
	}
	fc.raw = nil
	return true
}

// CancelServed cancels the call (link.Canceler): the caller sent a cancel
// frame, or its link closed.
func (fc *fastCall) CancelServed() {
	fc.mu.Lock()
	fc.cancelled = true
	agent, aseq, cancel, queued := fc.agent, fc.aseq, fc.cancel, fc.queued
	fc.mu.Unlock()
	if queued && fc.waiter.Withdraw() {
		fc.Admitted(nil, envelope.AsError(context.Canceled))
	} else if cancel != nil {
		cancel()
	} else if aseq != 0 {
		agent.CancelGo(aseq, envelope.AsError(context.Canceled))
	}
}

// finish answers the call and ends what the stages began, innermost
// first.
func (fc *fastCall) finish(res *envelope.Response, err error) { fc.finishAt(res, err, time.Now()) }

// finishAt is finish at now, a clock reading the caller already took.
func (fc *fastCall) finishAt(res *envelope.Response, err error, now time.Time) {
	h := fc.h
	if fc.bulkhead != nil {
		fc.bulkhead()
	}
	if (res == nil) == (err == nil) {
		h.log.Error("invoker broke its contract", "method", fc.req.Method, "response", res != nil, "error", err)
		res, err = nil, envelope.NewError(envelope.CodeInternal, "internal error")
	}
	h.inflight.Add(-1)
	if err != nil {
		h.logFailure(fc.ctx, &fc.req, err)
	}
	if h.watches.Active() {
		var inst string
		if fc.instance != nil {
			inst = fc.instance.InstanceID
		}
		h.noteCall(&fc.req, fc.start, inst, err)
	}
	fc.sc.EndAt(err, now)
	fc.origin.answerFast(fc, res, err)
}
