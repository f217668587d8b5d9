package hub

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub/guard"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/telemetry"
)

// Security is the hub's authentication and authorisation (guard.Security).
type Security = guard.Security

// Principal is who is calling, as their token says (auth.Principal).
type Principal = auth.Principal

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
	if !g.On() {
		return 0, errors.New("mesh: the hub was started without auth keys")
	}
	if err := g.Verifier.SetKeys(keys); err != nil {
		return 0, err
	}
	k := keys[0]
	g.Key.Store(&k)
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
			verr = g.Verifier.CheckKey(who.Token())
		} else {
			_, verr = g.Verifier.Verify(who.Token())
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
	who, aerr := h.guard.Authenticate(r)
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
