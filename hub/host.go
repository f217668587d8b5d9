package hub

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strings"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/telemetry"
)

// What the protocol surfaces see of the hub (package surface's Host; the
// hub does not import it: the binary hands the hub to each surface).

// route is an HTTP handler a surface mounted (Handle).
type route struct {
	pattern string
	h       http.Handler
}

// rpcHook is a surface's claim on single calls of /rpc (InterceptRPC).
type rpcHook struct {
	match func(method string) bool
	serve func(w http.ResponseWriter, ctx context.Context, c *envelope.RPCCall, hdr http.Header)
}

// Logger returns the hub's logger.
func (h *Hub) Logger() *slog.Logger { return h.log }

// Metrics returns the hub's collectors (nil when it has none).
func (h *Hub) Metrics() *telemetry.Metrics { return h.metrics() }

// ConnConfig returns the bounds of the hub's connections, defaults applied.
func (h *Hub) ConnConfig() link.Config { return h.cfg.Conn }

// Handle mounts a surface's handler at pattern on the hub's HTTP
// handler. Mount before Serve (or Handler).
func (h *Hub) Handle(pattern string, hd http.Handler) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.routes = append(h.routes, route{pattern, hd})
}

// InterceptRPC lets a surface answer single calls of /rpc that match
// and that neither a built-in nor an agent serves.
func (h *Hub) InterceptRPC(match func(method string) bool, serve func(w http.ResponseWriter, ctx context.Context, c *envelope.RPCCall, hdr http.Header)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.rpcHooks = append(h.rpcHooks, rpcHook{match, serve})
}

// intercepted returns the surface hook that answers calls, if any.
func (h *Hub) intercepted(calls []envelope.RPCCall, batch bool) *rpcHook {
	if batch || len(calls) != 1 || calls[0].Err != nil {
		return nil
	}
	m := calls[0].Request.Method
	h.mu.Lock()
	hooks := h.rpcHooks
	h.mu.Unlock()
	for i := range hooks {
		if hooks[i].match(m) && !h.IsBuiltin(m) && len(h.reg.Snapshot().Lookup(m)) == 0 {
			return &hooks[i]
		}
	}
	return nil
}

// Invoke runs one call through the hub's ingress.
func (h *Hub) Invoke(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
	return h.ingress(ctx, req)
}

// WithCaller returns ctx naming the caller and the connection it came
// over ("" keeps ctx's).
func (h *Hub) WithCaller(ctx context.Context, who *auth.Principal, conn string) context.Context {
	if conn != "" {
		ctx = withConn(ctx, conn)
	}
	if who != nil {
		ctx = context.WithValue(ctx, principalKey{}, who)
	}
	return ctx
}

// Caller returns who ctx names as the caller and its connection.
func (h *Hub) Caller(ctx context.Context) (*auth.Principal, string) {
	return PrincipalOf(ctx), connOf(ctx)
}

// Admit runs the edge checks (origin, drain, credential); on refusal it
// has answered w.
func (h *Hub) Admit(w http.ResponseWriter, r *http.Request) (*auth.Principal, bool) {
	return h.admit(w, r)
}

// AuthRequest authenticates an edge HTTP request; on refusal it has
// answered w.
func (h *Hub) AuthRequest(w http.ResponseWriter, r *http.Request) (context.Context, bool) {
	return h.authRequest(w, r)
}

// Authenticate checks r's credential only.
func (h *Hub) Authenticate(r *http.Request) (*auth.Principal, *envelope.Error) {
	return h.guard.Authenticate(r)
}

// AuthOn reports whether the hub authenticates its callers.
func (h *Hub) AuthOn() bool { return h.guard.On() }

// CheckOrigin applies the hub's allowed origins to r.
func (h *Hub) CheckOrigin(r *http.Request) bool { return h.guard.Origins.Check(r) }

// MayCall reports whether who may call method.
func (h *Hub) MayCall(who *auth.Principal, method string) bool { return h.guard.MayCall(who, method) }

// RequiredRoles returns the role table's entry for method.
func (h *Hub) RequiredRoles(method string) ([]string, bool) {
	if !h.guard.On() {
		return nil, false
	}
	return h.guard.Roles.Lookup(method)
}

// Refuse answers a refused edge request and counts the refusal.
func (h *Hub) Refuse(w http.ResponseWriter, e *envelope.Error) {
	h.metrics().Refused(refusal(e))
	httpRefuse(w, e)
}

// Upgrade upgrades r to a WebSocket under the hub's origin policy.
func (h *Hub) Upgrade(w http.ResponseWriter, r *http.Request, hdr http.Header) (*websocket.Conn, error) {
	return h.upgrader.Upgrade(w, r, hdr)
}

// IsBuiltin reports whether method is one of the hub's own.
func (h *Hub) IsBuiltin(method string) bool {
	_, ok := h.builtins[method]
	return ok
}

// Track registers c to be closed at shutdown (false: shutting down).
func (h *Hub) Track(c interface{ Close() }) bool { return h.track(c) }

// Untrack forgets c.
func (h *Hub) Untrack(c interface{ Close() }) { h.untrack(c) }

// Draining reports whether the hub drains.
func (h *Hub) Draining() bool { return h.draining.Load() }

// Cluster is the hub's view of its cluster: its registry's backend and
// health, its drain, the peer hubs it links to.
func (h *Hub) Cluster() control.ClusterInfo {
	kind := strings.TrimPrefix(fmt.Sprintf("%T", h.reg), "*")
	kind, _, _ = strings.Cut(kind, ".")
	synced := true
	if s, ok := h.reg.(interface{ Synced() bool }); ok {
		synced = s.Synced()
	}
	var peers []control.PeerInfo
	for _, p := range h.peers.Status() {
		pi := control.PeerInfo{Hub: p.Hub, Addr: p.Addr, Up: p.Up}
		if p.Err != nil {
			pi.Error = p.Err.Error()
		}
		peers = append(peers, pi)
	}
	sort.Slice(peers, func(i, j int) bool { return peers[i].Hub < peers[j].Hub })
	return control.ClusterInfo{Hub: h.cfg.ID, Registry: kind, RegistrySynced: synced, Draining: h.draining.Load(), Peers: peers}
}
