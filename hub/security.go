package hub

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/ratelimit"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/telemetry"
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

// Principal is who is calling, as their token says (auth.Principal).
type Principal = auth.Principal

func hasRole(roles []string, r string) bool { return slices.Contains(roles, r) }

type principalKey struct{}

// PrincipalOf returns the caller of a request being handled by the hub
// (nil when the hub authenticates nobody).
func PrincipalOf(ctx context.Context) *Principal {
	if p, ok := ctx.Value(principalKey{}).(*Principal); ok {
		return p
	}
	if l := linkFrom(ctx); l != nil {
		return linkPrincipal(l)
	}
	return nil
}

// adminMethods need RoleAdmin whatever the role table says: they show the
// mesh's inside.
var adminMethods = map[string]bool{"mesh.agents": true, "mesh.breakers": true}

// guard is a Hub's compiled Security.
type guard struct {
	self     string      // the hub's id: the audience of the tokens it accepts
	peers    *auth.Peers // the peer handshake (nil: the hub authenticates nobody)
	verifier *auth.Verifier
	key      atomic.Pointer[auth.Key] // signs the hub's peer tokens
	roles    auth.RoleTable
	origins  *auth.Origins
	limiter  *ratelimit.Limiter
	failures *ratelimit.Limiter // failed authentications per source address
}

func newGuard(s *Security) (*guard, error) {
	g := &guard{}
	origins := []string(nil)
	if s != nil {
		origins = s.Origins
	}
	o, err := auth.NewOrigins(origins)
	if err != nil {
		return nil, fmt.Errorf("mesh: allowed origins: %w", err)
	}
	g.origins = o
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
	if g.verifier, err = auth.NewKeySetVerifier(keys); err != nil {
		return nil, fmt.Errorf("mesh: auth key: %w", err)
	}
	g.key.Store(&keys[0])
	fr, fb := s.FailedAuthRate, s.FailedAuthBurst
	if fr == 0 {
		fr, fb = 20, 100
	}
	if fr > 0 {
		if g.failures, err = ratelimit.New(ratelimit.Config{Rate: fr, Burst: max(fb, 1)}); err != nil {
			return nil, fmt.Errorf("mesh: failed-authentication limit: %w", err)
		}
	}
	if g.roles, err = auth.NewRoleTable(s.Roles); err != nil {
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
func (g *guard) on() bool { return g != nil && g.verifier != nil }

// authenticate checks an HTTP request's credential (Authorization: Bearer,
// or a "bearer.<token>" WebSocket subprotocol). Cookies never count. A
// token of role "hub" is refused: it opens a peer link only (serveWS,
// through authenticateAs).
func (g *guard) authenticate(r *http.Request) (*Principal, *envelope.Error) {
	return g.authenticateAs(r, false)
}

// authenticateAs is authenticate; with peerOK (a native /ws upgrade) it
// accepts a hub token that passes checkPeer, as a peer principal.
func (g *guard) authenticateAs(r *http.Request, peerOK bool) (*Principal, *envelope.Error) {
	if !g.on() {
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
			ms := max(after.Milliseconds(), 1)
			return nil, envelope.Errorf(envelope.CodeOverloaded, "too many failed authentications from this address; retry in %d ms", ms).
				WithData(map[string]int64{"retryAfterMs": ms})
		}
	}
	return p, e
}

func (g *guard) authenticate1(r *http.Request, peerOK bool) (*Principal, *envelope.Error) {
	tok, err := auth.BearerToken(r)
	if err != nil {
		return nil, envelope.AsError(err)
	}
	if tok == "" {
		return nil, envelope.NewError(envelope.CodeUnauthenticated, "missing token: send Authorization: Bearer <token>")
	}
	c, err := g.verifier.Verify(tok)
	if err != nil {
		return nil, envelope.AsError(err)
	}
	if e := g.checkAudience(c); e != nil {
		return nil, e
	}
	if hasRole(c.Roles, auth.RolePeer) {
		if !peerOK {
			return nil, errHubTokenElsewhere
		}
		if e := g.peers.Check(c); e != nil {
			return nil, e
		}
		return auth.NewPrincipal(c, tok, true), nil
	}
	return auth.NewPrincipal(c, tok, false), nil
}

// errHubTokenElsewhere refuses a token of role "hub" anywhere but on the
// upgrade of a peer link.
var errHubTokenElsewhere = envelope.NewError(envelope.CodeUnauthenticated,
	"a token of role hub only opens a peer link (a hub's native /ws dial, bound to this hub); it authenticates nothing else")

// checkAudience refuses a token meant for another party ("aud").
func (g *guard) checkAudience(c *auth.Claims) *envelope.Error {
	if c.Audience != "" && c.Audience != g.self {
		return envelope.Errorf(envelope.CodeUnauthenticated, "this token is for %q, not for this hub", c.Audience)
	}
	return nil
}

// authorize decides whether p may call req.Method, before any routing.
func (g *guard) authorize(p *Principal, req *envelope.Request) error {
	if !g.on() {
		return nil
	}
	if p == nil || p.Claims == nil {
		return envelope.NewError(envelope.CodeUnauthenticated, "missing token")
	}
	if hasRole(p.Roles, auth.RolePeer) {
		return authorizePeer(p, req)
	}
	m := req.Method
	if adminMethods[m] && !hasRole(p.Roles, auth.RoleAdmin) {
		return envelope.Errorf(envelope.CodePermissionDenied, "%s needs the %s role", m, auth.RoleAdmin)
	}
	if need, ok := g.roles.Lookup(m); ok && !auth.Allowed(p.Roles, need) {
		return envelope.Errorf(envelope.CodePermissionDenied, "%s needs one of the roles %s", m, strings.Join(need, ", "))
	}
	if g.limiter != nil && !isAgentControl(m) {
		key := "sub:" + p.Subject
		if p.Subject == "" {
			key = "jti:" + p.ID
		}
		if ok, after := g.limiter.Allow(key); !ok {
			ms := max(after.Milliseconds(), 1)
			return envelope.Errorf(envelope.CodeOverloaded, "rate limit of this identity exceeded; retry in %d ms", ms).
				WithData(map[string]int64{"retryAfterMs": ms}).MarkNotSent()
		}
	}
	return nil
}

// authorizePeer: a hub may send calls over the peer link it opened to
// this hub, calls it forwards (Hops > 0) for agents' methods; the hub
// that forwarded a call authorised it, and counted it against its limits.
// Nothing else: no built-in (mesh.agents, agent.register...), no call of
// its own, no hub token on any other link.
func authorizePeer(p *Principal, req *envelope.Request) error {
	switch {
	case !p.Peer():
		return envelope.NewError(envelope.CodePermissionDenied, "the hub role only forwards calls over a peer link")
	case req.Headers.Hops <= 0:
		return envelope.Errorf(envelope.CodePermissionDenied, "%s: a peer link carries forwarded calls only (hops > 0)", req.Method)
	case reservedCapability(req.Method):
		return envelope.Errorf(envelope.CodePermissionDenied, "%s: a peer link carries calls for agents only, not for the hub's own methods", req.Method)
	}
	return nil
}

// mayServe decides whether p may register the capabilities: each must be
// covered by the token's serve patterns, and none may claim the hub's own
// namespaces.
func (g *guard) mayServe(p *Principal, caps []string) error {
	if !g.on() {
		return nil // the built-in shadowing check still applies (INVALID_PARAMS)
	}
	for _, c := range caps {
		if reservedCapability(c) {
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
func reservedCapability(c string) bool {
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

func sameSubject(a, b *Principal) bool {
	return a != nil && b != nil && a.Claims != nil && b.Claims != nil && a.Subject == b.Subject
}

// SetAuthKeys replaces the hub's token keys while it runs (key rotation;
// meshd reloads its --auth-key files on SIGHUP): from then on tokens are
// checked against keys only, and the first signs the hub's peer tokens.
// Every open link and WebSocket is checked again: those whose token no
// longer verifies (its key was dropped) are closed with UNAUTHENTICATED;
// the others go on untouched. A peer link, which outlives the short token
// it was opened with, is checked for its key only. It returns how many
// were closed. It fails, changing nothing, for a hub that authenticates
// nobody (authentication is not switched on at run time) or an invalid
// key set.
func (h *Hub) SetAuthKeys(keys []auth.Key) (closed int, err error) {
	g := h.guard
	if !g.on() {
		return 0, errors.New("mesh: the hub was started without auth keys")
	}
	if err := g.verifier.SetKeys(keys); err != nil {
		return 0, err
	}
	k := keys[0]
	g.key.Store(&k)
	h.mu.Lock()
	conns := make([]closer, 0, len(h.conns))
	for c := range h.conns {
		conns = append(conns, c)
	}
	h.mu.Unlock()
	for _, c := range conns {
		var who *Principal
		var cut func(error)
		switch c := c.(type) {
		case *link.Link:
			who, cut = linkPrincipal(c), c.Shutdown
		case *rpcConn:
			who, cut = c.who, c.c.Shutdown
		}
		if who == nil || who.Token() == "" {
			continue
		}
		verr := error(nil)
		if who.Peer() {
			verr = g.verifier.CheckKey(who.Token())
		} else {
			_, verr = g.verifier.Verify(who.Token())
		}
		if verr != nil {
			e := envelope.AsError(verr)
			h.log.Info("closing a connection: its token is no longer valid under the hub's keys", "subject", who.Subject, "jti", who.ID, "error", e.Message)
			cut(envelope.Errorf(envelope.CodeUnauthenticated, "the hub's keys changed: %s; reconnect with a fresh token", e.Message))
			closed++
		}
	}
	return closed, nil
}

// expireLink closes l when its token expires (S24 e): a token is checked
// once per link, so the link must not outlive it. A peer link is the
// exception: its token is minted for the dial (peerTokenTTL), the link
// lives on its heartbeat, and a key rotation checks it (SetAuthKeys).
func expireLink(l *link.Link, p *Principal) {
	if p == nil || p.Claims == nil || p.ExpiresAt.IsZero() || p.Peer() {
		return
	}
	t := time.AfterFunc(time.Until(p.ExpiresAt), func() {
		l.Shutdown(envelope.NewError(envelope.CodeUnauthenticated, "token expired; reconnect with a fresh one"))
	})
	context.AfterFunc(l.Context(), func() { t.Stop() })
}

// refusal names the reason of a refused call for agentmesh_security_refused_total.
func refusal(err error) string { return telemetry.RefusalReason(err) }

// authRequest authenticates an HTTP request and returns its context
// carrying the caller; when it refuses it has answered (401/429) and
// counted the refusal, and ok is false.
func (h *Hub) authRequest(w http.ResponseWriter, r *http.Request) (ctx context.Context, ok bool) {
	who, aerr := h.guard.authenticate(r)
	if aerr != nil {
		h.metrics().Refused(refusal(aerr))
		httpRefuse(w, aerr)
		return nil, false
	}
	ctx = r.Context()
	if who != nil {
		ctx = context.WithValue(ctx, principalKey{}, who)
	}
	return ctx, true
}

// httpRefuse answers an HTTP request refused before any work.
func httpRefuse(w http.ResponseWriter, e *envelope.Error) {
	w.Header().Set("Content-Type", "application/json")
	status := e.Code.HTTPStatus()
	if ra := e.RetryAfter(); ra > 0 {
		status = http.StatusTooManyRequests
		w.Header().Set("Retry-After", strconv.FormatInt(int64(max(ra.Round(time.Second)/time.Second, 1)), 10))
	}
	if e.Code == envelope.CodeUnauthenticated {
		w.Header().Set("WWW-Authenticate", `Bearer realm="agentmesh"`)
	}
	writeRPCError(w, status, e)
}

// mayCall reports whether p's roles let it call m (the role checks of
// guard.authorize, without its rate limit).
func (g *guard) mayCall(p *Principal, m string) bool {
	if !g.on() {
		return true
	}
	if p == nil || p.Claims == nil {
		return false
	}
	if hasRole(p.Roles, auth.RolePeer) {
		return false // a hub token opens a peer link, nothing else
	}
	if adminMethods[m] && !hasRole(p.Roles, auth.RoleAdmin) {
		return false
	}
	need, ok := g.roles.Lookup(m)
	return !ok || auth.Allowed(p.Roles, need)
}
