package guard

import (
	"testing"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
)

// TestAuthorize: the role table, the admin built-ins, the hub token's
// reach and each identity's rate limit, decided on a request alone.
func TestAuthorize(t *testing.T) {
	g, err := New(&Security{Key: []byte("0123456789abcdef0123456789abcdef"), Roles: map[string][]string{"billing.*": {"finance"}},
		RatePerToken: 1, BurstPerToken: 2})
	if err != nil {
		t.Fatal(err)
	}
	who := func(sub string, roles ...string) *auth.Principal {
		return auth.NewPrincipal(&auth.Claims{Subject: sub, Roles: roles}, "", false)
	}
	peerLink := auth.NewPrincipal(&auth.Claims{Subject: "hub-B", Roles: []string{auth.RolePeer}}, "", true)
	for _, tc := range []struct {
		name string
		p    *auth.Principal
		req  envelope.Request
		want envelope.Code
	}{
		{"no principal", nil, envelope.Request{Method: "echo.echo"}, envelope.CodeUnauthenticated},
		{"a method no role guards", who("ann"), envelope.Request{Method: "echo.echo"}, envelope.CodeOK},
		{"a guarded method without the role", who("bob", "reader"), envelope.Request{Method: "billing.pay"}, envelope.CodePermissionDenied},
		{"a guarded method with the role", who("cy", "finance"), envelope.Request{Method: "billing.pay"}, envelope.CodeOK},
		{"an admin built-in without admin", who("dee", "finance"), envelope.Request{Method: "mesh.agents"}, envelope.CodePermissionDenied},
		{"an admin built-in as admin", who("eve", auth.RoleAdmin), envelope.Request{Method: "mesh.agents"}, envelope.CodeOK},
		{"a forwarded call over a peer link", peerLink, envelope.Request{Method: "echo.echo", Headers: envelope.Headers{Hops: 1}}, envelope.CodeOK},
		{"a peer link's own call", peerLink, envelope.Request{Method: "echo.echo"}, envelope.CodePermissionDenied},
		{"a peer link calling the hub", peerLink, envelope.Request{Method: "mesh.agents", Headers: envelope.Headers{Hops: 1}}, envelope.CodePermissionDenied},
	} {
		if got := envelope.CodeOf(g.Authorize(tc.p, &tc.req)); got != tc.want {
			t.Errorf("%s: %s; want %s", tc.name, got, tc.want)
		}
	}
	// The rate limit is the identity's: a burst of 2, then OVERLOADED,
	// not sent; agent control passes.
	fay := who("fay")
	for i, want := range []envelope.Code{envelope.CodeOK, envelope.CodeOK, envelope.CodeOverloaded} {
		err := g.Authorize(fay, &envelope.Request{Method: "echo.echo"})
		if got := envelope.CodeOf(err); got != want {
			t.Fatalf("call %d of fay: %s; want %s", i, got, want)
		}
		if want == envelope.CodeOverloaded && !envelope.AsError(err).NotSent() {
			t.Error("a rate-limited call is not marked not sent")
		}
	}
	if err := g.Authorize(fay, &envelope.Request{Method: "agent.heartbeat"}); err != nil {
		t.Errorf("agent control past the identity's limit: %v", err)
	}
}

// TestMayServe: an agent registers only what its token's serve patterns
// allow, never the hub's own namespaces.
func TestMayServe(t *testing.T) {
	g, err := New(&Security{Key: []byte("0123456789abcdef0123456789abcdef")})
	if err != nil {
		t.Fatal(err)
	}
	p := auth.NewPrincipal(&auth.Claims{Subject: "echo", Serve: []string{"echo.*"}}, "", false)
	for caps, want := range map[string]envelope.Code{
		"echo.echo": envelope.CodeOK, "kv.get": envelope.CodePermissionDenied,
		"mesh.agents": envelope.CodePermissionDenied, "agent.*": envelope.CodePermissionDenied, "*": envelope.CodePermissionDenied,
	} {
		if got := envelope.CodeOf(g.MayServe(p, []string{caps})); got != want {
			t.Errorf("serving %q: %s; want %s", caps, got, want)
		}
	}
	var off *Guard
	if off.On() || off.Authorize(nil, &envelope.Request{Method: "mesh.agents"}) != nil {
		t.Error("a nil guard guards something")
	}
}
