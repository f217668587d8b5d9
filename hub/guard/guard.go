// Package guard is a hub's compiled Security: who a request or a link
// authenticates as (tokens, peer tokens, audiences, the failed-attempt
// budget), what a principal may call or serve (the role table, the
// hub's reserved namespaces), and each identity's rate limit.
package guard

import (
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/ratelimit"
)

// Security is the hub's authentication and authorisation. The zero value
// (or a nil *Security) authenticates nobody and guards nothing, as for a
// hub on loopback for one developer; meshd refuses to listen beyond
// loopback without a key.
type Security struct {
	// Key signs and checks tokens (auth.LoadKey). Set: every surface
	// (/rpc, /ws, peer links) requires a valid token, agents may register
	// only what their token's serve patterns allow, and peer links
	// authenticate both ends (peerauth.go): the hub dials its peers with a
	// token of role "hub" it mints per dial, bound to the hub and address
	// dialled, and accepts the link only once the peer proved it holds
	// the key too.
	Key []byte
	// Keys, when set, replaces Key with a key set (rotation): every key
	// verifies tokens (by their kid, or each in turn for a token without
	// one); the first signs the hub's own peer tokens. Hub.SetAuthKeys
	// replaces the set while the hub runs.
	Keys []auth.Key
	// Roles maps method patterns (exact, "prefix.*", "*"; exact beats the
	// longest prefix) to the roles that may call them; any one suffices.
	// Methods it does not cover need no role. The hub's admin built-ins
	// (mesh.agents, mesh.breakers) need RoleAdmin in any case.
	Roles map[string][]string
	// Origins lists the browser origins allowed to open a WebSocket
	// ("https://console.example", "https://*.example.com"). A request
	// without Origin (agents, CLIs) is not a browser and passes; a browser
	// from any origin not listed gets 403 before the upgrade.
	Origins []string
	// RatePerToken and BurstPerToken bound the calls each identity (the
	// token's subject, so every token issued to one name shares it; its
	// id when it has no subject) may make; past them a call gets
	// OVERLOADED with a retry-after hint. 0: no limit.
	RatePerToken  float64
	BurstPerToken int
	// FailedAuthRate and FailedAuthBurst budget failed authentications per
	// source address (default 20/s, burst 100; negative: no budget).
	FailedAuthRate  float64
	FailedAuthBurst int
}

func HasRole(roles []string, r string) bool { return slices.Contains(roles, r) }

// AdminMethods need RoleAdmin whatever the role table says: they show the
// mesh's inside.
var AdminMethods = map[string]bool{"mesh.agents": true, "mesh.breakers": true}

// Guard is a hub's compiled Security. A nil *Guard guards nothing.
type Guard struct {
	Self     string      // the hub's id: the audience of the tokens it accepts
	Peers    *auth.Peers // the peer handshake (nil: the hub authenticates nobody)
	Verifier *auth.Verifier
	Key      atomic.Pointer[auth.Key] // signs the hub's peer tokens
	Roles    auth.RoleTable
	Origins  *auth.Origins
	limiter  *ratelimit.Limiter
	failures *ratelimit.Limiter // failed authentications per source address
}

func New(s *Security) (*Guard, error) {
	g := &Guard{}
	origins := []string(nil)
	if s != nil {
		origins = s.Origins
	}
	o, err := auth.NewOrigins(origins)
	if err != nil {
		return nil, fmt.Errorf("mesh: allowed origins: %w", err)
	}
	g.Origins = o
	keys := []auth.Key(nil)
	if s != nil {
		keys = s.Keys
		if len(keys) == 0 && len(s.Key) > 0 {
			keys = []auth.Key{{Secret: s.Key}}
		}
	}
	if len(keys) == 0 {
		return g, nil
	}
	if g.Verifier, err = auth.NewKeySetVerifier(keys); err != nil {
		return nil, fmt.Errorf("mesh: auth key: %w", err)
	}
	g.Key.Store(&keys[0])
	fr, fb := s.FailedAuthRate, s.FailedAuthBurst
	if fr == 0 {
		fr, fb = 20, 100
	}
	if fr > 0 {
		if g.failures, err = ratelimit.New(ratelimit.Config{Rate: fr, Burst: max(fb, 1)}); err != nil {
			return nil, fmt.Errorf("mesh: failed-authentication limit: %w", err)
		}
	}
	if g.Roles, err = auth.NewRoleTable(s.Roles); err != nil {
		return nil, fmt.Errorf("mesh: %w", err)
	}
	if s.RatePerToken > 0 {
		if g.limiter, err = ratelimit.New(ratelimit.Config{Rate: s.RatePerToken, Burst: max(s.BurstPerToken, 1)}); err != nil {
			return nil, fmt.Errorf("mesh: rate limit: %w", err)
		}
	}
	return g, nil
}

// on reports whether the hub authenticates.
func (g *Guard) On() bool { return g != nil && g.Verifier != nil }

// RolesOf returns the roles a call to m needs, as the mesh's schema
// says: the hub's when it authenticates, else those the agent declared.
func (g *Guard) RolesOf(m string, declared []string) []string {
	if !g.On() {
		return declared
	}
	if AdminMethods[m] {
		return []string{auth.RoleAdmin}
	}
	if r, ok := g.Roles.Lookup(m); ok {
		return r
	}
	return nil
}

// authenticate checks an HTTP request's credential (Authorization: Bearer,
// or a "bearer.<token>" WebSocket subprotocol). Cookies never count. A
// token of role "hub" is refused: it opens a peer link only (serveWS,
// through authenticateAs).
func (g *Guard) Authenticate(r *http.Request) (*auth.Principal, *envelope.Error) {
	return g.AuthenticateAs(r, false)
}

// authenticateAs is authenticate; with peerOK (a native /ws upgrade) it
// accepts a hub token that passes checkPeer, as a peer principal.
func (g *Guard) AuthenticateAs(r *http.Request, peerOK bool) (*auth.Principal, *envelope.Error) {
	if !g.On() {
		return nil, nil
	}
	p, e := g.authenticate1(r, peerOK)
	if e != nil && g.failures != nil {
		// Failed attempts are budgeted per source address (S24 f): past
		// the budget the source is told to back off (OVERLOADED, HTTP
		// 429 with Retry-After) instead of being told why, and its
		// refusals are counted apart. A valid token still passes.
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		if ok, after := g.failures.Allow(host); !ok {
			e := RateLimited("too many failed authentications from this address;", after)
			return nil, e.WithMaybeSent()
		}
	}
	return p, e
}

func (g *Guard) authenticate1(r *http.Request, peerOK bool) (*auth.Principal, *envelope.Error) {
	tok, err := auth.BearerToken(r)
	if err != nil {
		return nil, envelope.AsError(err)
	}
	if tok == "" {
		return nil, envelope.NewError(envelope.CodeUnauthenticated, "missing token: send Authorization: Bearer <token>")
	}
	c, err := g.Verifier.Verify(tok)
	if err != nil {
		return nil, envelope.AsError(err)
	}
	if e := g.CheckAudience(c); e != nil {
		return nil, e
	}
	if HasRole(c.Roles, auth.RolePeer) {
		if !peerOK {
			return nil, ErrHubTokenElsewhere
		}
		if e := g.Peers.Check(c); e != nil {
			return nil, e
		}
		return auth.NewPrincipal(c, tok, true), nil
	}
	return auth.NewPrincipal(c, tok, false), nil
}

// ErrHubTokenElsewhere refuses a token of role "hub" anywhere but on the
// upgrade of a peer link.
var ErrHubTokenElsewhere = envelope.NewError(envelope.CodeUnauthenticated,
	"a token of role hub only opens a peer link (a hub's native /ws dial, bound to this hub); it authenticates nothing else")

// checkAudience refuses a token meant for another party ("aud").
func (g *Guard) CheckAudience(c *auth.Claims) *envelope.Error {
	if c.Audience != "" && c.Audience != g.Self {
		return envelope.Errorf(envelope.CodeUnauthenticated, "this token is for %q, not for this hub", c.Audience)
	}
	return nil
}

// authorize decides whether p may call req.Method, before any routing.
func (g *Guard) Authorize(p *auth.Principal, req *envelope.Request) error {
	if !g.On() {
		return nil
	}
	if p == nil || p.Claims == nil {
		return envelope.NewError(envelope.CodeUnauthenticated, "missing token")
	}
	if HasRole(p.Roles, auth.RolePeer) {
		return authorizePeer(p, req)
	}
	m := req.Method
	if AdminMethods[m] && !HasRole(p.Roles, auth.RoleAdmin) {
		return envelope.Errorf(envelope.CodePermissionDenied, "%s needs the %s role", m, auth.RoleAdmin)
	}
	if need, ok := g.Roles.Lookup(m); ok && !auth.Allowed(p.Roles, need) {
		return envelope.Errorf(envelope.CodePermissionDenied, "%s needs one of the roles %s", m, strings.Join(need, ", "))
	}
	if g.limiter != nil && !IsAgentControl(m) {
		key := "sub:" + p.Subject
		if p.Subject == "" {
			key = "jti:" + p.ID
		}
		if ok, after := g.limiter.Allow(key); !ok {
			return RateLimited("rate limit of this identity exceeded;", after)
		}
	}
	return nil
}

// authorizePeer: a hub may send calls over the peer link it opened to
// this hub, calls it forwards (Hops > 0) for agents' methods; the hub
// that forwarded a call authorised it, and counted it against its limits.
// Nothing else: no built-in (mesh.agents, agent.register...), no call of
// its own, no hub token on any other link.
func authorizePeer(p *auth.Principal, req *envelope.Request) error {
	switch {
	case !p.Peer():
		return envelope.NewError(envelope.CodePermissionDenied, "the hub role only forwards calls over a peer link")
	case req.Headers.Hops <= 0:
		return envelope.Errorf(envelope.CodePermissionDenied, "%s: a peer link carries forwarded calls only (hops > 0)", req.Method)
	case ReservedCapability(req.Method):
		return envelope.Errorf(envelope.CodePermissionDenied, "%s: a peer link carries calls for agents only, not for the hub's own methods", req.Method)
	}
	return nil
}

// mayServe decides whether p may register the capabilities: each must be
// covered by the token's serve patterns, and none may claim the hub's own
// namespaces.
func (g *Guard) MayServe(p *auth.Principal, caps []string) error {
	if !g.On() {
		return nil // the built-in shadowing check still applies (INVALID_PARAMS)
	}
	for _, c := range caps {
		if ReservedCapability(c) {
			return envelope.Errorf(envelope.CodePermissionDenied, "agent.register: %q is the hub's own namespace", c)
		}
	}
	if p == nil || p.Claims == nil {
		return envelope.NewError(envelope.CodeUnauthenticated, "missing token")
	}
	for _, c := range caps {
		if !auth.MayServe(p.Claims, c) {
			return envelope.Errorf(envelope.CodePermissionDenied, "agent.register: this token may not serve %q", c)
		}
	}
	return nil
}

// reservedCapability: the hub's built-in namespaces cannot be claimed.
func ReservedCapability(c string) bool {
	if c == "*" {
		return true
	}
	for _, ns := range []string{"agent.", "mesh.", "rpc."} {
		if strings.HasPrefix(c, ns) || c == strings.TrimSuffix(ns, ".")+".*" {
			return true
		}
	}
	return false
}

func SameSubject(a, b *auth.Principal) bool {
	return a != nil && b != nil && a.Claims != nil && b.Claims != nil && a.Subject == b.Subject
}

// mayCall reports whether p's roles let it call m (the role checks of
// guard.authorize, without its rate limit).
func (g *Guard) MayCall(p *auth.Principal, m string) bool {
	if !g.On() {
		return true
	}
	if p == nil || p.Claims == nil {
		return false
	}
	if HasRole(p.Roles, auth.RolePeer) {
		return false // a hub token opens a peer link, nothing else
	}
	if AdminMethods[m] && !HasRole(p.Roles, auth.RoleAdmin) {
		return false
	}
	need, ok := g.Roles.Lookup(m)
	return !ok || auth.Allowed(p.Roles, need)
}

// IsAgentControl: an agent's heartbeat and deregistration, which no rate
// limit or drain refuses.
func IsAgentControl(m string) bool {
	return m == "agent.heartbeat" || m == "agent.deregister"
}

// RateLimited is the OVERLOADED refusal of a call past a rate limit:
// what, then when to retry ("retry in N ms", and retryAfterMs in its
// data); not sent.
func RateLimited(what string, after time.Duration) *envelope.Error {
	ms := max(after.Milliseconds(), 1)
	return envelope.Errorf(envelope.CodeOverloaded, "%s retry in %d ms", what, ms).
		WithData(map[string]int64{"retryAfterMs": ms}).MarkNotSent()
}

// NewRateLimiter returns a limiter of rate calls per second per key
// (burst: 2 × rate by default) for at most maxKeys keys, or nil when rate
// is not positive.
func NewRateLimiter(rate float64, burst, maxKeys int) (*ratelimit.Limiter, error) {
	if rate <= 0 {
		return nil, nil
	}
	if burst <= 0 {
		burst = max(int(2*rate), 1)
	}
	return ratelimit.New(ratelimit.Config{Rate: rate, Burst: burst, MaxKeys: maxKeys})
}
