package cli_test

import (
	"strings"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/internal/cli"
)

// TestMeshctlCallToken: against meshd started with --auth-key, meshctl
// call (and agents, methods) without a token fails UNAUTHENTICATED, over
// ws:// and http:// alike; with --token or $MESH_TOKEN it succeeds; the
// flag wins over the environment (also an explicit empty --token); a
// wrongly signed or expired token is UNAUTHENTICATED; and no token is ever
// echoed in meshctl's output.
func TestMeshctlCallToken(t *testing.T) {
	keyFile, key := secKey(t)
	addr := secFreeAddr(t)
	secMeshd(t, addr, secPlainReady, "--auth-key", keyFile)
	ws, rpc := "ws://"+addr+"/ws", "http://"+addr+"/rpc"
	secAgent(t, ws, agents.NewEcho(agents.WithToken(secToken(t, key, auth.Claims{Subject: "echo-agent", Serve: []string{"echo.*"}}))))

	good := secToken(t, key, auth.Claims{Subject: "alice"})
	admin := secToken(t, key, auth.Claims{Subject: "ops", Roles: []string{auth.RoleAdmin}})
	otherKey := []byte("some-other-key-some-other-key-some-other-key")
	wrong, err := auth.Issue(otherKey, auth.Claims{Subject: "mallory"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	expired, err := auth.Issue(key, auth.Claims{Subject: "late", IssuedAt: time.Now().Add(-2 * time.Hour)}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}

	ok := func(r result) bool { return r.code == 0 && r.stdout == "{\"a\":1}\n" }
	unauth := func(r result) bool {
		return r.code == cli.ExitError && strings.HasPrefix(r.stderr, "UNAUTHENTICATED: ")
	}
	cases := []struct {
		name string
		env  string   // $MESH_TOKEN ("" unset)
		args []string // after the hub
		want func(result) bool
	}{
		{"no token", "", nil, unauth},
		{"--token", "", []string{"--token", good}, ok},
		{"--token=", "", []string{"--token=" + good}, ok},
		{"MESH_TOKEN", good, nil, ok},
		{"--token over a bad MESH_TOKEN", wrong, []string{"--token", good}, ok},
		{"a bad --token over MESH_TOKEN", good, []string{"--token", wrong}, unauth},
		{"an empty --token over MESH_TOKEN", good, []string{"--token="}, unauth},
		{"wrongly signed", "", []string{"--token", wrong}, unauth},
		{"expired", expired, nil, unauth},
		{"garbage", "", []string{"--token", "not-a-token"}, unauth},
	}
	for _, hub := range []string{ws, rpc} {
		for _, tc := range cases {
			name := tc.name + " over " + hub[:strings.Index(hub, ":")]
			t.Run(name, func(t *testing.T) {
				t.Setenv("MESH_TOKEN", tc.env)
				args := append([]string{"call", "echo.echo", `{"a":1}`, "--hub", hub, "-o", "json"}, tc.args...)
				r := meshctl(t, "", args...)
				if !tc.want(r) {
					t.Errorf("meshctl %s: exit %d, stdout %q, stderr %q", name, r.code, r.stdout, r.stderr)
				}
				for _, tok := range []string{good, wrong, expired} {
					if strings.Contains(r.stdout+r.stderr, tok) {
						t.Errorf("meshctl %s printed a token", name)
					}
				}
			})
		}
	}

	// The other commands that reach the hub take the token the same way.
	t.Setenv("MESH_TOKEN", "")
	for _, cmd := range [][]string{{"methods"}, {"agents"}} {
		if r := meshctl(t, "", append(cmd, "--hub", ws)...); !unauth(r) {
			t.Errorf("meshctl %s without a token: exit %d, stderr %q; want UNAUTHENTICATED", cmd[0], r.code, r.stderr)
		}
	}
	if r := meshctl(t, "", "methods", "--hub", ws, "--token", good); r.code != 0 || !strings.Contains(r.stdout, "echo.echo") {
		t.Errorf("meshctl methods --token: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	t.Setenv("MESH_TOKEN", admin)
	if r := meshctl(t, "", "agents", "--hub", ws); r.code != 0 || !strings.Contains(r.stdout, "echo") {
		t.Errorf("meshctl agents with an admin $MESH_TOKEN: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}
