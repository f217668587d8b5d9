package hub

import (
	"context"
	"net/http"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub/guard"
)

// Per-connection rate limits (Config.ConnRate). A connection is known
// by its remote address (ip:port), which names one TCP connection at a
// time: a link by Link.Remote, any HTTP request by r.RemoteAddr (set in
// its context by Hub.Handler), a Multica device or an agentick socket by
// the address of the request that upgraded it (which a surface reads
// with Host.Caller and gives its socket's context with Host.WithCaller). The limit holds with
// authentication off, and beside the per-token limit with it on: one
// token spread over many connections is bounded by the token's limit,
// one connection carrying many tokens by the connection's.

type connKey struct{}

// withConn marks ctx as a call arriving on the connection from remote.
func withConn(ctx context.Context, remote string) context.Context {
	return context.WithValue(ctx, connKey{}, remote)
}

// connOf returns the connection a call came in on ("" if none is known).
func connOf(ctx context.Context) string {
	if s, ok := ctx.Value(connKey{}).(string); ok {
		return s
	}
	if l := linkFrom(ctx); l != nil {
		return l.Remote
	}
	return ""
}

// limitConn answers OVERLOADED, with a retry-after hint, to a call over
// its connection's rate. Agent control (register, heartbeat) and calls a
// peer hub forwards (many callers share a peer link) are not counted.
func (h *Hub) limitConn(ctx context.Context, req *envelope.Request) error {
	if h.connLimit == nil || h.exemptFromLimits(ctx, req) {
		return nil
	}
	key := connOf(ctx)
	if key == "" {
		return nil
	}
	if ok, after := h.connLimit.Allow(key); !ok {
		h.metrics().Refused("rate_limited_conn")
		return guard.RateLimited("rate limit of this connection exceeded;", after)
	}
	return nil
}

// connContext puts each HTTP request's connection in its context when a
// per-connection limit is set (a request copy per request otherwise).
func (h *Hub) connContext(next http.Handler) http.Handler {
	if h.connLimit == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(withConn(r.Context(), r.RemoteAddr)))
	})
}

// limitGlobal answers OVERLOADED, with a retry-after hint, to a call over
// the hub's total rate (Config.GlobalRate). Agent control and calls a
// peer hub forwards (the first hub counted them) are not counted.
func (h *Hub) limitGlobal(ctx context.Context, req *envelope.Request) error {
	if h.global == nil || h.exemptFromLimits(ctx, req) {
		return nil
	}
	if ok, after := h.global.Allow(""); !ok {
		h.metrics().Refused("rate_limited_global")
		return guard.RateLimited("the hub's rate limit is exceeded;", after)
	}
	return nil
}

// exemptFromLimits reports whether the per-connection and global limits
// pass req: agent control, and calls a peer hub forwards (many callers
// share a peer link, and the hub they entered counted them). With
// authentication on, only a call over the peer link a hub opened to this
// one (both ends authenticated, peerauth.go) is forwarded: a client's
// hops header proves nothing, nor does a hub token on any other link.
// Without it, the header is all there is to go by, so a client that sets
// it escapes these limits (at the price of one attempt and local
// instances only); hubs that must hold their limits against their
// clients run with --auth-key.
func (h *Hub) exemptFromLimits(ctx context.Context, req *envelope.Request) bool {
	if guard.IsAgentControl(req.Method) {
		return true
	}
	if h.guard.On() {
		// Peer() only on the peer link a hub opened (peerauth.go).
		return PrincipalOf(ctx).Peer() && req.Headers.Hops > 0
	}
	return req.Headers.Hops > 0
}
