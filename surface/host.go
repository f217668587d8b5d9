// Package surface is what a protocol surface sees of the hub: the Host
// interface the hub implements, and nothing of the hub's inside. A
// surface (surface/agentick, surface/openai, surface/multica,
// surface/nexus3, surface/mcp) speaks one foreign protocol at the edge
// and turns its requests into calls through Host.Invoke; the binary
// mounts it on a hub (internal/cli), and the hub imports no surface.
//
// The split follows connect-go's protocol interface and caddy's handler
// modules: the protocol-specific code sits behind a narrow interface, the
// protocol-agnostic plumbing (admission, routing, limits, drain) stays in
// the hub, and a surface can be read, tested and changed alone.
package surface

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/registry"
	"github.com/agentmesh/agentmesh/telemetry"
)

// Host is the hub as its surfaces see it. *hub.Hub implements it.
type Host interface {
	// ID is the hub's id; Logger its logger; Metrics its collectors (nil
	// when the hub has none); ConnConfig the bounds every connection of
	// the hub takes (read limits, queue, timeouts), defaults applied.
	ID() string
	Logger() *slog.Logger
	Metrics() *telemetry.Metrics
	ConnConfig() link.Config

	// Handle mounts h on the hub's HTTP handler at pattern (net/http
	// ServeMux syntax). Mount before Serve.
	Handle(pattern string, h http.Handler)

	// InterceptRPC lets the surface answer single calls on the hub's
	// JSON-RPC endpoint (/rpc) that match and that neither a built-in nor
	// an agent serves (NEXUS3's global methods): serve answers w.
	InterceptRPC(match func(method string) bool, serve func(w http.ResponseWriter, ctx context.Context, c *envelope.RPCCall, hdr http.Header))

	// Invoke runs one call through the hub's ingress, as every call from
	// a caller does: drain, authorisation, rate limits, deadline,
	// idempotency, then a built-in or a routed agent. The caller is the
	// one ctx names (WithCaller, or the HTTP request's context).
	Invoke(ctx context.Context, req *envelope.Request) (*envelope.Response, error)
	// WithCaller returns ctx naming the caller: who authenticated (nil:
	// nobody) and the connection it came over (its remote address: the
	// key of the per-connection limits; "" keeps ctx's).
	WithCaller(ctx context.Context, who *auth.Principal, conn string) context.Context
	// Caller returns what WithCaller (or the hub's HTTP handler) put in
	// ctx.
	Caller(ctx context.Context) (who *auth.Principal, conn string)

	// Admit runs the checks every WebSocket upgrade and edge request
	// passes first, in the hub's order: the Origin, then the drain, then
	// the credential. On refusal it has answered w and returns false.
	Admit(w http.ResponseWriter, r *http.Request) (*auth.Principal, bool)
	// AuthRequest authenticates an edge HTTP request and returns its
	// context naming the caller; on refusal (401/429) it has answered w
	// and returns false.
	AuthRequest(w http.ResponseWriter, r *http.Request) (context.Context, bool)
	// Authenticate checks r's credential only (nil, nil when the hub
	// authenticates nobody); AuthOn reports whether it authenticates.
	Authenticate(r *http.Request) (*auth.Principal, *envelope.Error)
	AuthOn() bool
	// CheckOrigin applies the hub's allowed origins to r.
	CheckOrigin(r *http.Request) bool
	// MayCall reports whether who may call method under the hub's role
	// table; RequiredRoles is the table's entry for method.
	MayCall(who *auth.Principal, method string) bool
	RequiredRoles(method string) (roles []string, ok bool)
	// Refuse answers a refused edge request with e's HTTP status and a
	// JSON error body, and counts it.
	Refuse(w http.ResponseWriter, e *envelope.Error)
	// Upgrade upgrades r to a WebSocket under the hub's origin policy.
	Upgrade(w http.ResponseWriter, r *http.Request, hdr http.Header) (*websocket.Conn, error)

	// Schema is the mesh's contract now (built-ins and agents' methods);
	// IsBuiltin tells the hub's own methods; KnownMethod whether a
	// built-in or an agent serves method; Registry the hub's registry.
	Schema() control.SchemaPayload
	IsBuiltin(method string) bool
	KnownMethod(method string) bool
	// Streaming reports whether an agent declared method a streaming
	// one: a surface calls it as a stream (stream.Relay through Invoke)
	// and relays its chunks in its own protocol's events.
	Streaming(method string) bool
	Registry() registry.Registry

	// Track registers c to be closed when the hub shuts down; false: the
	// hub is shutting down, close c now. Untrack forgets it.
	Track(c interface{ Close() }) bool
	Untrack(c interface{ Close() })
	// Draining reports whether the hub drains (BeginDrain): a surface
	// ends its long-lived connections and refuses new ones.
	Draining() bool

	// WatchCalls calls fn with each user call the hub serves that fails
	// or takes slow or longer, until stop (the console's live tail). fn
	// must not block.
	WatchCalls(slow time.Duration, fn func(telemetry.CallRecord)) (stop func())
	// Cluster is the hub's view of its cluster (registry, peer links).
	Cluster() control.ClusterInfo
}
