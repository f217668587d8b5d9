package auth

import (
	"net/http"
	"strings"
)

// ProtocolPrefix marks a bearer token carried as a WebSocket subprotocol:
// a browser, which cannot set an Authorization header on a WebSocket,
// offers the subprotocols ["agentmesh.v1", "bearer.<token>"]. The server
// never selects (echoes) that entry: it is not in the upgrader's list.
const ProtocolPrefix = "bearer."

// BearerToken returns the bearer token of an HTTP request or WebSocket
// upgrade, from exactly one of:
//
//   - the Authorization header, "Bearer <token>" (scheme case-insensitive,
//     RFC 6750 §2.1); the way for agents, CLIs, peer hubs and HTTP callers;
//   - one Sec-WebSocket-Protocol entry "bearer.<token>"; the way for
//     browsers. (A JWT is base64url and dots, valid in a subprotocol token.)
//
// It returns "", nil when the request carries neither; the hub then refuses
// /rpc with UNAUTHENTICATED, and for a WebSocket may wait (up to its auth
// deadline) for the first frame's headers.authToken, which it checks with
// the same Verifier. Cookies and query parameters are never read: a cookie
// is sent by the browser to any page's cross-site request, and a query
// string ends up in access logs.
//
// A malformed Authorization header, a scheme other than Bearer, two
// Authorization headers, two bearer subprotocols or a token in both places
// is an UNAUTHENTICATED error: ambiguous credentials are refused, never
// resolved.
func BearerToken(r *http.Request) (string, error) {
	var tok string
	found := 0
	switch vs := r.Header.Values("Authorization"); len(vs) {
	case 0:
	case 1:
		scheme, rest, _ := strings.Cut(vs[0], " ")
		if !strings.EqualFold(scheme, "Bearer") {
			return "", unauthenticated("unsupported authorization scheme; want Bearer", nil)
		}
		tok = strings.Trim(rest, " ")
		if !token68(tok) {
			return "", unauthenticated("malformed bearer token", nil)
		}
		found++
	default:
		return "", unauthenticated("more than one Authorization header", nil)
	}
	for _, v := range r.Header.Values("Sec-WebSocket-Protocol") {
		for p := range strings.SplitSeq(v, ",") {
			p = strings.TrimSpace(p)
			t, ok := strings.CutPrefix(p, ProtocolPrefix)
			if !ok {
				continue
			}
			if !token68(t) {
				return "", unauthenticated("malformed bearer subprotocol", nil)
			}
			tok = t
			found++
		}
	}
	if found > 1 {
		return "", unauthenticated("more than one bearer token", nil)
	}
	return tok, nil
}

// token68 reports whether s is a non-empty RFC 7235 token68:
// 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"=".
func token68(s string) bool {
	if s == "" || len(s) > MaxTokenLen {
		return false
	}
	i := 0
	for ; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			c == '-' || c == '.' || c == '_' || c == '~' || c == '+' || c == '/') {
			break
		}
	}
	if i == 0 {
		return false
	}
	for ; i < len(s); i++ {
		if s[i] != '=' {
			return false
		}
	}
	return true
}
