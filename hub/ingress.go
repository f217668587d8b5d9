package hub

import (
	"context"
	"log/slog"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub/guard"
	"github.com/agentmesh/agentmesh/link"
)

// The ingress: every call from a caller (a client's or an agent's link,
// /rpc, a JSON-RPC WebSocket, a protocol surface through Host.Invoke)
// passes the same chain of stages, built once by New, in this order:
//
//	identify      a request id for a call that has none
//	telemetry     the server span and rpc.server metrics: refusals too
//	log           a failed call is logged with its request and trace ids
//	drain         refused while the hub drains (goaway first); counted in flight
//	authenticate  a per-call token checked, the credential dropped; the role table
//	limit         the per-connection and the hub's rate limits
//	deadline      the hub's default timeout for a call without a ttl
//	idempotency   a keyed call's answer replayed within the window
//	dispatch      a built-in, or routed to an agent (route.go)
//
// ExampleHub_IngressOrder shows it. A stage refuses by returning an
// error without calling the next; every stage outside it still sees the
// refusal (its span, metric and log line).

// stage is one named stage of the ingress.
type stage struct {
	name string
	mw   envelope.Middleware
}

// ingressStages are the ingress's stages, outermost first.
func (h *Hub) ingressStages() []stage {
	return []stage{
		{"identify", identify},
		{"telemetry", h.traceServer},
		{"log", h.logFailures},
		{"watch", h.watchCalls},
		{"drain", h.drainGate},
		{"authenticate", h.authenticateCall},
		{"limit", h.rateLimit},
		{"deadline", h.deadline},
		{"idempotency", h.idempotent},
	}
}

// traceServer is the telemetry stage: the call's SERVER span (naming the
// caller's end of the connection) and the server duration histogram.
func (h *Hub) traceServer(next envelope.Invoker) envelope.Invoker {
	if h.tel == nil {
		return next
	}
	return func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
		ctx, sc := h.tel.StartServer(ctx, req)
		if sc.Recording() {
			sc.SetPeer(connOf(ctx))
		}
		res, err := next(ctx, req)
		sc.End(err)
		return res, err
	}
}

// buildIngress chains the stages around the dispatcher.
func (h *Hub) buildIngress() envelope.Invoker {
	inv := envelope.Invoker(h.dispatch)
	st := h.ingressStages()
	for i := len(st) - 1; i >= 0; i-- {
		inv = st[i].mw(inv)
	}
	return inv
}

// IngressOrder names the stages every call passes, outermost first,
// ending with the dispatcher.
func (h *Hub) IngressOrder() []string {
	var out []string
	for _, s := range h.ingressStages() {
		out = append(out, s.name)
	}
	return append(out, "dispatch")
}

// ingress runs one call through the chain.
func (h *Hub) ingress(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
	return h.in(ctx, req)
}

// identify gives a call without a request id one.
func identify(next envelope.Invoker) envelope.Invoker {
	return func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
		if req.ID == "" {
			req.ID = envelope.NewID()
		}
		return next(ctx, req)
	}
}

// logFailures logs every failed call with its request id (and, through
// the logger's handler, the trace and span ids of the server span).
func (h *Hub) logFailures(next envelope.Invoker) envelope.Invoker {
	return func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
		res, err := next(ctx, req)
		if err != nil {
			h.logFailure(ctx, req, err)
		}
		return res, err
	}
}

func (h *Hub) logFailure(ctx context.Context, req *envelope.Request, err error) {
	e := envelope.AsError(err)
	level := slog.LevelDebug
	if e.Code == envelope.CodeInternal {
		level = slog.LevelError
	}
	h.log.LogAttrs(ctx, level, "call failed", slog.String("method", req.Method),
		slog.String("request_id", req.ID), slog.String("code", e.Code.String()), slog.String("error", e.Message))
}

// drainGate refuses new calls while the hub drains (an agent's
// heartbeats and deregistration still pass) and counts the calls in
// flight, which the drain waits for.
func (h *Hub) drainGate(next envelope.Invoker) envelope.Invoker {
	return func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
		if h.draining.Load() && !guard.IsAgentControl(req.Method) {
			if l := linkFrom(ctx); l != nil && l.IsAccepted() {
				// BeginDrain may not have reached this link yet: the
				// goaway goes out before the refusal, so the peer learns
				// why and where to go (the link's frames are written in
				// order).
				l.SendGoAway()
			}
			return nil, link.UnavailableNotSent("hub is draining")
		}
		h.inflight.Add(1)
		defer h.inflight.Add(-1)
		return next(ctx, req)
	}
}

// authenticateCall checks a call's own token (a JSON-RPC call's
// meta.authToken, when the connection did not authenticate), drops the
// credential from the call and applies the role table.
func (h *Hub) authenticateCall(next envelope.Invoker) envelope.Invoker {
	return func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
		ctx, err := h.authenticate(ctx, req)
		if err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

// authenticate is authenticateCall's check; ctx gains the principal a
// per-call token proved.
func (h *Hub) authenticate(ctx context.Context, req *envelope.Request) (context.Context, error) {
	if tok := req.Headers.AuthToken; tok != "" || h.guard.On() {
		// A credential never goes further than this: not to logs,
		// spans, peers or agents.
		req.Headers.AuthToken = ""
		p := PrincipalOf(ctx)
		if p == nil && tok != "" && h.guard.On() {
			c, err := h.guard.Verifier.Verify(tok)
			if err == nil && guard.HasRole(c.Roles, auth.RolePeer) {
				err = guard.ErrHubTokenElsewhere
			} else if err == nil {
				err = h.guard.CheckAudience(c)
			}
			if err != nil {
				h.metrics().Refused("unauthenticated")
				return ctx, err
			}
			p = auth.NewPrincipal(c, "", false)
			ctx = context.WithValue(ctx, principalKey{}, p)
		}
		if err := h.guard.Authorize(p, req); err != nil {
			h.metrics().Refused(refusal(err))
			return ctx, err
		}
	}
	return ctx, nil
}

// rateLimit applies the per-connection, then the hub's, rate limit.
func (h *Hub) rateLimit(next envelope.Invoker) envelope.Invoker {
	return func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
		if err := h.limit(ctx, req); err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (h *Hub) limit(ctx context.Context, req *envelope.Request) error {
	if err := h.limitConn(ctx, req); err != nil {
		return err
	}
	return h.limitGlobal(ctx, req)
}

// deadline runs a call without a deadline under the hub's default
// timeout, or under its method's policy timeout when that is shorter and
// the call is routed from here (not a built-in, not forwarded by a peer
// hub): the retry stage would narrow it to that anyway, with a second
// context and timer of its own (a plain JSON-RPC call carries no ttl: it
// paid for both). The policy's time then runs from here, before the
// idempotency stage and the bulkhead, as it does for a call whose caller
// sent the ttl.
func (h *Hub) deadline(next envelope.Invoker) envelope.Invoker {
	return func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
		if _, ok := ctx.Deadline(); !ok {
			ctx, cancel := req.WithTTL(ctx, h.defaultTimeout(req))
			defer cancel()
			return next(ctx, req)
		}
		return next(ctx, req)
	}
}

// idempotent answers a call with an idempotency key from the window's
// record when the same caller sent the same call (hop 0, not an agent's
// control call).
func (h *Hub) idempotent(next envelope.Invoker) envelope.Invoker {
	return func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
		if req.Headers.IdempotencyKey != "" && req.Headers.Hops == 0 && !req.Stream && !guard.IsAgentControl(req.Method) {
			caller := ""
			if p := PrincipalOf(ctx); p != nil && p.Claims != nil {
				caller = p.Subject
			}
			return h.idem.Do(ctx, caller, req, func() (*envelope.Response, error) { return next(ctx, req) })
		}
		return next(ctx, req)
	}
}
