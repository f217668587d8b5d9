package reliability

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/attemptinfo"
)

// Tried is the set of instances a call has tried; the router wraps its
// instance choice around it so that a retry prefers an instance not yet
// tried. Safe for concurrent use (hedged attempts share it).
type Tried struct {
	mu    sync.Mutex
	ids   []string
	first [2]string // ids' room for the usual one or two attempts, with no allocation
}

type triedKey struct{}

// triedCtx carries a call's Tried set: one allocation for both, where a
// context.WithValue and a Tried were two. Its parent's cancellation
// reaches the context package's children of it directly (Value passes
// the package's own lookups through).
type triedCtx struct {
	context.Context
	tried Tried
}

func (c *triedCtx) Value(key any) any {
	if _, ok := key.(triedKey); ok {
		return &c.tried
	}
	return c.Context.Value(key)
}

// WithTried returns ctx with a Tried set holding ids: for a retry loop
// resumed (RetryOptions.Resume) after attempts made outside any context.
func WithTried(ctx context.Context, ids ...string) context.Context {
	c := &triedCtx{Context: ctx}
	for _, id := range ids {
		c.tried.Add(id)
	}
	return c
}

// TriedFrom returns the call's Tried set, or nil outside a retry loop.
func TriedFrom(ctx context.Context) *Tried {
	t, _ := ctx.Value(triedKey{}).(*Tried)
	return t
}

// Has reports whether id was tried.
func (t *Tried) Has(id string) bool {
	if t == nil {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return slices.Contains(t.ids, id)
}

// Add records that id is being tried.
func (t *Tried) Add(id string) {
	if t == nil {
		return
	}
	t.mu.Lock()
	if t.ids == nil {
		t.ids = t.first[:0]
	}
	t.ids = append(t.ids, id)
	t.mu.Unlock()
}

// RetryOptions are the shared helpers of a retry loop.
type RetryOptions struct {
	Budget  *Budget  // nil: no budget
	Latency *Latency // nil: no deadline-aware skipping
	// OnRetry, if set, is told of every attempt sent beyond a call's
	// first, as it is sent, with its reason: the failed attempt's code in
	// snake case ("unavailable", "timeout", ...), "not_sent", or "hedge".
	// For metrics (agentmesh_client_retries_total).
	OnRetry func(method, reason string)
	// OnSkip, if set, is told of every failed call that could have been
	// retried and was not ("attempts_exhausted", "deadline", "budget",
	// "not_idempotent"): not of a code no retry helps (INVALID_PARAMS,
	// METHOD_NOT_FOUND), a cancelled call, or an error a loop downstream
	// already settled. For metrics (agentmesh_client_retries_skipped_total).
	OnSkip func(method, reason string)
	// UseTried puts a Tried set in the context for the invoker to use.
	UseTried bool
}

// decide is the retry decision, in order: attempts left; an error a retry
// loop downstream already gave up on is final; a request that provably
// never reached a handler is safe to retry; otherwise only idempotent
// methods are retried, and only on the policy's retryable codes. A
// decision not to retry says why when a retry was otherwise possible
// (a Skip reason), and "" when none could help.
func decide(p *Policy, e *envelope.Error, attempt int) (bool, string) {
	retryable := e.NotSent() || (p.retryableCode(e.Code) && e.Code != envelope.CodeCancelled && e.Attempts() == 0)
	switch {
	case attempt >= p.Retries:
		if attempt > 0 && retryable && (e.NotSent() || p.Idempotent) {
			return false, skipAttempts
		}
		return false, ""
	case e.Code == envelope.CodeCancelled, e.Attempts() > 0:
		return false, ""
	case e.NotSent():
		return true, retryNotSent
	case !p.retryableCode(e.Code):
		return false, ""
	case !p.Idempotent:
		return false, skipNotIdempotent
	}
	return true, strings.ToLower(e.Code.String())
}

// The reasons OnRetry and OnSkip are given (telemetry names them too).
const (
	retryHedge        = "hedge"
	retryNotSent      = "not_sent"
	skipAttempts      = "attempts_exhausted"
	skipDeadline      = "deadline"
	skipBudget        = "budget"
	skipNotIdempotent = "not_idempotent"
)

// Retry is the retry middleware: it bounds the call by the policy's
// timeout, runs attempts under its per-try timeout, retries by decide
// within the budget and the time left, waits the backoff between
// attempts, and hedges idempotent calls when the policy says so. The
// error it returns records its attempts, so that no loop upstream retries
// the call again; a deadline that ends a backoff wait gives TIMEOUT with
// the last attempt's code in its message. The response's metrics report
// the retries.
func Retry(ps *PolicySet, o RetryOptions) envelope.Middleware {
	return func(next envelope.Invoker) envelope.Invoker {
		return func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
			p := ps.For(req.Method)
			now := time.Now() // read the clock once: it is not cheap on every host
			o.Budget.RequestAt(req.Method, now)
			// A stream is bounded by its own ttl, and never hedged: the
			// policy's timeouts are for calls, and two attempts would
			// feed one consumer.
			if p.Timeout > 0 && !req.Stream {
				if d, ok := ctx.Deadline(); !ok || d.Sub(now) > p.Timeout {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, p.Timeout)
					defer cancel()
				}
			}
			if o.UseTried && (p.Retries > 0 || p.HedgeAfter > 0) {
				ctx = &triedCtx{Context: ctx}
			}
			if p.HedgeAfter > 0 && p.Idempotent && p.Retries > 0 && !req.Stream {
				return hedge(ctx, req, p, next, &o)
			}
			return retryLoop(ctx, req, p, next, &o, now, nil)
		}
	}
}

// The retry loop in parts, for a caller that runs a call's first attempt
// itself, completion-style, and a retry loop only when it failed and may
// be retried (the hub's forward path): Begin, then Retries (or, on a
// success, Observe); Settle for an error not worth a retry; Resume to go
// on from the failed first attempt exactly as Retry would have.

// Begin counts the call for the budget, as Retry does on entry.
func (o *RetryOptions) Begin(method string, now time.Time) { o.Budget.RequestAt(method, now) }

// Observe records the latency of a successful first attempt.
func (o *RetryOptions) Observe(method string, d time.Duration) { o.Latency.Observe(method, d) }

// Retries reports whether the loop would consider retrying a first
// attempt that failed with e (decide: attempts, code, idempotence; the
// deadline, the budget and the backoff are Resume's).
func Retries(p *Policy, e *envelope.Error) bool {
	ok, _ := decide(p, e, 0)
	return ok
}

// Settle is the loop's answer to a first attempt that failed with e and
// is not retried (Retries false): e with its attempts mark.
func (o *RetryOptions) Settle(p *Policy, method string, e *envelope.Error) *envelope.Error {
	if _, reason := decide(p, e, 0); reason != "" {
		o.skipped(method, reason)
	}
	return e.WithAttempts(1)
}

// Resume goes on with a call whose first attempt failed with first, as
// Retry's loop would have from there: ctx carries the call's deadline
// (the policy's timeout applied) and, for next, the Tried set
// (WithTried); start is when the first attempt began. A nil first runs
// the first attempt too (Begin was called).
func (o *RetryOptions) Resume(ctx context.Context, req *envelope.Request, p *Policy, next envelope.Invoker, start time.Time, first error) (*envelope.Response, error) {
	return retryLoop(ctx, req, p, next, o, start, first)
}

func attempt(ctx context.Context, req *envelope.Request, p *Policy, next envelope.Invoker, o *RetryOptions, start time.Time) (*envelope.Response, error) {
	if p.PerTryTimeout > 0 && !req.Stream {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, p.PerTryTimeout)
		defer cancel()
	}
	res, err := next(ctx, req)
	if err == nil {
		o.Latency.Observe(req.Method, time.Since(start))
	}
	return res, err
}

func retryLoop(ctx context.Context, req *envelope.Request, p *Policy, next envelope.Invoker, o *RetryOptions, start time.Time, first error) (*envelope.Response, error) {
	var delays interface{ NextBackOff() time.Duration }
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	sent := false            // an attempt may have reached a handler
	var why attemptinfo.Info // why the next attempt is sent
	for n := 0; ; n++ {
		req.Headers.RetryCount = n
		if n > 0 {
			start = time.Now()
		}
		var res *envelope.Response
		var err error
		if n == 0 && first != nil {
			err = first // the first attempt ran elsewhere (Resume)
		} else if n > 0 {
			res, err = attempt(attemptinfo.With(ctx, why), req, p, next, o, start)
		} else {
			res, err = attempt(ctx, req, p, next, o, start)
		}
		if err == nil {
			res.Metrics.Retries = n
			return res, nil
		}
		e := envelope.AsError(err)
		if !e.NotSent() {
			sent = true
		}
		ok, reason := decide(p, e, n)
		if ok {
			if delays == nil {
				delays = p.Backoff.NewBackOff()
			}
			wait := max(delays.NextBackOff(), e.RetryAfter()) // the callee's pushback wins if longer
			if e.Code == envelope.CodeCircuitOpen && e.NotSent() && e.RetryAfter() > 0 {
				// Every instance is behind an open breaker and one admits
				// a probe then (CircuitOpen): that moment, not a backoff,
				// is when another try can help. Nothing was sent, and the
				// breaker itself bounds the probes.
				wait = e.RetryAfter()
			}
			if left, has := timeLeft(ctx); has {
				if p90, known := o.Latency.P90(req.Method); left <= wait || (known && left < wait+p90) {
					ok, reason = false, skipDeadline
				}
			}
			if ok && !o.Budget.TryRetry(req.Method) {
				ok, reason = false, skipBudget
			}
			if ok {
				if wait > 0 {
					if timer == nil {
						timer = time.NewTimer(wait)
					} else {
						timer.Reset(wait)
					}
					select {
					case <-timer.C:
					case <-ctx.Done():
						c := envelope.CodeOf(ctx.Err())
						return nil, envelope.Errorf(c, "%s while waiting to retry after %s: %s",
							envelope.AsError(ctx.Err()).Message, e.Code, e.Message).WithAttempts(n + 1)
					}
				}
				o.report(req.Method, reason) // the retry is sent now
				why = attemptinfo.Info{Reason: reason, Backoff: wait}
				continue
			}
		}
		if reason != "" {
			o.skipped(req.Method, reason)
		}
		out := e.WithAttempts(n + 1)
		if sent && out.NotSent() {
			out = out.WithMaybeSent() // the last attempt was not sent, an earlier one may have run
		}
		return nil, out
	}
}

func (o *RetryOptions) report(method, reason string) {
	if o.OnRetry != nil {
		o.OnRetry(method, reason)
	}
}

func (o *RetryOptions) skipped(method, reason string) {
	if o.OnSkip != nil {
		o.OnSkip(method, reason)
	}
}

func timeLeft(ctx context.Context) (time.Duration, bool) {
	d, ok := ctx.Deadline()
	if !ok {
		return 0, false
	}
	return time.Until(d), true
}

type hedgeResult struct {
	res *envelope.Response
	err error
	n   int
}

// hedge runs a first attempt and, if it has not answered after
// HedgeAfter (or failed retryably before), a second one, which the
// invoker sends to another instance; the first success wins and the other
// attempt is cancelled and awaited. A hedge counts as the policy's first
// retry.
func hedge(ctx context.Context, req *envelope.Request, p *Policy, next envelope.Invoker, o *RetryOptions) (*envelope.Response, error) {
	ctx, cancel := context.WithCancel(ctx)
	results := make(chan hedgeResult, 2)
	outstanding := 0
	sent := false // an attempt may have reached a handler
	launch := func(n int, why attemptinfo.Info) {
		r := *req
		r.Headers.RetryCount = n
		outstanding++
		actx := ctx
		if n > 0 {
			actx = attemptinfo.With(ctx, why)
		}
		go func() {
			res, err := attempt(actx, &r, p, next, o, time.Now())
			results <- hedgeResult{res, err, n}
		}()
	}
	defer func() {
		cancel()
		for ; outstanding > 0; outstanding-- {
			<-results
		}
	}()
	launch(0, attemptinfo.Info{})
	t := time.NewTimer(p.HedgeAfter)
	defer t.Stop()
	hedged := false
	var last *envelope.Error
	for {
		select {
		case <-t.C:
			if !hedged && o.Budget.TryRetry(req.Method) {
				hedged = true
				o.report(req.Method, retryHedge)
				launch(1, attemptinfo.Info{Reason: retryHedge, Backoff: p.HedgeAfter})
			}
		case r := <-results:
			outstanding--
			if r.err == nil {
				r.res.Metrics.Retries = r.n
				return r.res, nil
			}
			last = envelope.AsError(r.err)
			if !last.NotSent() {
				sent = true
			}
			if outstanding > 0 {
				continue // the other attempt may still win
			}
			if ok, reason := decide(p, last, r.n); ok && !hedged && o.Budget.TryRetry(req.Method) {
				hedged = true
				o.report(req.Method, reason)
				launch(1, attemptinfo.Info{Reason: reason})
				continue
			}
			out := last.WithAttempts(r.n + 1)
			if sent && out.NotSent() {
				out = out.WithMaybeSent() // the other attempt may have run
			}
			return nil, out
		case <-ctx.Done():
			e := envelope.AsError(ctx.Err())
			if last != nil {
				e = envelope.Errorf(e.Code, "%s after %s: %s", e.Message, last.Code, last.Message)
			}
			return nil, e.WithAttempts(1)
		}
	}
}
