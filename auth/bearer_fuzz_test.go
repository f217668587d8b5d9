package auth_test

import (
	"errors"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
)

// token68RE is RFC 7235's token68, written apart from the parser's loop.
var token68RE = regexp.MustCompile(`^[A-Za-z0-9._~+/-]+=*$`)

// FuzzBearerToken feeds arbitrary Authorization and Sec-WebSocket-Protocol
// header values (several of each, split on "\n"; shape says which headers
// are present) to auth.BearerToken, and what it returns to the Verifier,
// as the hub does. It must never panic; every refusal is a coded
// UNAUTHENTICATED with no token; a token it returns is a token68 of at
// most MaxTokenLen bytes, taken verbatim from exactly one place (one
// Authorization header "Bearer <token>", any case of the scheme, spaces
// around it; or one "bearer.<token>" subprotocol entry, with no
// Authorization header), and no credential at all is reported as "" only
// when the request carries neither; and a token the Verifier accepts is
// really HS256-signed with the hub's key (checked without the jwt
// library): no spelling of the headers gets a token past the verifier
// that it would refuse on its own.
func FuzzBearerToken(f *testing.F) {
	now := t0.Add(time.Minute)
	good := issue(f, testKey, auth.Claims{Subject: "agent-x", Roles: []string{"reader"}, Serve: []string{"memory.*"}}, time.Hour)
	wrong := issue(f, otherKey, auth.Claims{Subject: "mallory"}, time.Hour)
	expired := issue(f, testKey, auth.Claims{Subject: "late", IssuedAt: t0.Add(-2 * time.Hour)}, time.Hour)
	const (
		hasAuth  = 1
		hasProto = 2
	)
	seeds := []struct {
		authz, proto string
		shape        uint8
	}{
		{"", "", 0},
		{"Bearer " + good, "", hasAuth},
		{"bearer " + good, "", hasAuth},
		{"BEARER   " + good + "  ", "", hasAuth},
		{"Bearer\t" + good, "", hasAuth},
		{"Bearer  \t" + good, "", hasAuth},
		{"Bearer " + good + "\nBearer " + good, "", hasAuth},
		{"Bearer " + good + "=", "", hasAuth},
		{"Bearer " + good + "=.", "", hasAuth},
		{"Bearer =" + good, "", hasAuth},
		{"Bearer " + good[:len(good)-1], "", hasAuth},
		{"Bearer " + wrong, "", hasAuth},
		{"Bearer " + expired, "", hasAuth},
		{"Bearer " + good + "\x00", "", hasAuth},
		{"Bearer " + good + ",Bearer " + wrong, "", hasAuth},
		{"Bearer " + strings.Repeat("a", auth.MaxTokenLen), "", hasAuth},
		{"Bearer " + strings.Repeat("a", auth.MaxTokenLen+1), "", hasAuth},
		{"Basic dXNlcjpwYXNz", "", hasAuth},
		{"Bearer", "", hasAuth},
		{"", "", hasAuth},
		{"Bearerx " + good, "", hasAuth},
		{"Bеarer " + good, "", hasAuth}, // Cyrillic е
		{"", "agentmesh.v1, bearer." + good, hasProto},
		{"", "agentmesh.v1\nbearer." + good, hasProto},
		{"", "bearer." + good + ", bearer." + good, hasProto},
		{"", "bearer.", hasProto},
		{"", "Bearer." + good, hasProto},
		{"", "bearer. " + good, hasProto},
		{"", " \tbearer." + good + "\t ", hasProto},
		{"", "bearer." + good + ";q=1", hasProto},
		{"", "agentmesh.v1, jsonrpc", hasProto},
		{"Bearer " + good, "bearer." + good, hasAuth | hasProto},
		{"Bearer " + good, "agentmesh.v1", hasAuth | hasProto},
		{"Basic x", "bearer." + good, hasAuth | hasProto},
	}
	for _, s := range seeds {
		f.Add(s.authz, s.proto, s.shape)
	}
	v := verifier(f, now)
	f.Fuzz(func(t *testing.T, authz, proto string, shape uint8) {
		r := &http.Request{Header: http.Header{}}
		var auths, protos []string
		if shape&hasAuth != 0 {
			auths = strings.Split(authz, "\n")
			for _, a := range auths {
				r.Header.Add("Authorization", a)
			}
		}
		if shape&hasProto != 0 {
			protos = strings.Split(proto, "\n")
			for _, p := range protos {
				r.Header.Add("Sec-WebSocket-Protocol", p)
			}
		}
		// The subprotocol entries that offer a bearer token.
		var offered []string
		for _, p := range protos {
			for e := range strings.SplitSeq(p, ",") {
				if t, ok := strings.CutPrefix(strings.TrimSpace(e), auth.ProtocolPrefix); ok {
					offered = append(offered, t)
				}
			}
		}

		tok, err := auth.BearerToken(r)
		if err != nil {
			var e *envelope.Error
			if !errors.As(err, &e) || e.Code != envelope.CodeUnauthenticated || e.Message == "" {
				t.Fatalf("refusal %v (%T) is not a coded UNAUTHENTICATED", err, err)
			}
			if tok != "" {
				t.Fatalf("token %q returned with the error %v", tok, err)
			}
			return
		}
		if tok == "" {
			if len(auths) != 0 || len(offered) != 0 {
				t.Fatalf("no token reported for Authorization %q, subprotocols %q", auths, protos)
			}
			return
		}
		if len(tok) > auth.MaxTokenLen || !token68RE.MatchString(tok) {
			t.Fatalf("returned %q: not a token68 of at most %d bytes", tok, auth.MaxTokenLen)
		}
		switch {
		case len(auths) == 1 && len(offered) == 0:
			scheme, rest, _ := strings.Cut(auths[0], " ")
			if !strings.EqualFold(scheme, "bearer") || strings.Trim(rest, " ") != tok {
				t.Fatalf("returned %q from Authorization %q", tok, auths[0])
			}
		case len(auths) == 0 && len(offered) == 1:
			if offered[0] != tok {
				t.Fatalf("returned %q from the subprotocol entry %q", tok, auth.ProtocolPrefix+offered[0])
			}
		default:
			t.Fatalf("returned %q from %d Authorization headers and %d bearer subprotocols; want exactly one credential", tok, len(auths), len(offered))
		}

		c, verr := v.Verify(tok)
		if verr != nil {
			if c != nil || envelope.CodeOf(verr) != envelope.CodeUnauthenticated {
				t.Fatalf("Verify(%q) = %v, %v", tok, c, verr)
			}
			return
		}
		if !checkSigned(tok, testKey) {
			t.Fatalf("accepted %q, which is not HS256-signed with the key", tok)
		}
		if c.ExpiresAt.Add(auth.DefaultLeeway).Before(now) {
			t.Fatalf("accepted an expired token: %+v", c)
		}
	})
}
