package cli_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/cli"
)

const secRolesPolicy = `
policies:
  "memory.*": { timeout: 5s, retries: 0 }
roles:
  memory.get: [reader, writer]
  "memory.*": [writer]
  "echo.*": [caller]
`

// TestMeshdPolicyFileRoles is S24 (d) the way an operator sets it up: the
// roles section of a real YAML policy file, read by meshd --config (the
// path meshd takes, config.Load into hub.Security.Roles) on a hub started
// with --auth-key. A caller without a role the table asks is refused
// PERMISSION_DENIED before routing (the agent's count does not move),
// over WebSocket, /rpc and meshctl alike; with the role the call passes;
// the exact entry beats the prefix; methods the table does not name stay
// open to any authenticated caller; the built-in admin methods need admin
// whatever the table says. meshd --check refuses a roles table it could
// not enforce, and a roles table without --auth-key, which would guard
// nothing.
func TestMeshdPolicyFileRoles(t *testing.T) {
	keyFile, key := secKey(t)
	policy := filepath.Join(t.TempDir(), "mesh.yaml")
	if err := os.WriteFile(policy, []byte(secRolesPolicy), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := secFreeAddr(t)
	secMeshd(t, addr, secPlainReady, "--config", policy, "--auth-key", keyFile)
	ws, rpc := "ws://"+addr+"/ws", "http://"+addr

	var executed atomic.Int64
	mem := agents.New("memory", agents.WithToken(secToken(t, key, auth.Claims{Subject: "memory-agent", Serve: []string{"memory.*", "echo.*", "misc.*"}})))
	for _, m := range []string{"memory.get", "memory.set", "echo.echo", "misc.open"} {
		mem.Handle(m, func(ctx context.Context, p json.RawMessage) (any, error) {
			executed.Add(1)
			return map[string]string{"method": m}, nil
		})
	}
	secAgent(t, ws, mem)

	tok := func(sub string, roles ...string) string {
		return secToken(t, key, auth.Claims{Subject: sub, Roles: roles})
	}
	callers := map[string]string{
		"reader": tok("r", "reader"),
		"writer": tok("w", "writer"),
		"caller": tok("c", "caller"),
		"admin":  tok("ops", "admin"),
		"none":   tok("n"),
	}
	cases := []struct {
		who, method string
		ok          bool
	}{
		{"reader", "memory.get", true}, // the exact entry: reader or writer
		{"writer", "memory.get", true},
		{"reader", "memory.set", false}, // the prefix entry: writer only
		{"writer", "memory.set", true},
		{"none", "memory.get", false},
		{"admin", "memory.set", false}, // admin implies no other role
		{"caller", "echo.echo", true},
		{"reader", "echo.echo", false},
		{"none", "misc.open", true}, // not in the table: any authenticated caller
		{"admin", "mesh.agents", true},
		{"admin", "mesh.breakers", true},
		{"writer", "mesh.agents", false}, // admin built-ins need admin
		{"caller", "mesh.breakers", false},
		{"none", "mesh.methods", true},
	}
	allowedAgentCalls := int64(0)
	for _, transport := range []string{ws, rpc} {
		for _, tc := range cases {
			c := secClient(t, transport, callers[tc.who])
			before := executed.Load()
			var params any = map[string]string{"k": "v"}
			if strings.HasPrefix(tc.method, "mesh.") {
				params = nil // the built-ins take none
			}
			err := c.Call(t.Context(), tc.method, params, nil)
			name := tc.who + " calls " + tc.method + " over " + transport[:strings.Index(transport, ":")]
			switch {
			case tc.ok && err != nil:
				t.Errorf("%s: %v; want success", name, err)
			case !tc.ok && envelope.CodeOf(err) != envelope.CodePermissionDenied:
				t.Errorf("%s: %v; want PERMISSION_DENIED", name, err)
			}
			routed := !strings.HasPrefix(tc.method, "mesh.")
			if tc.ok && routed {
				allowedAgentCalls++
				if executed.Load() != before+1 {
					t.Errorf("%s: the agent executed %d calls; want 1", name, executed.Load()-before)
				}
			}
			if !tc.ok && executed.Load() != before {
				t.Errorf("%s: refused, yet the agent executed %d calls", name, executed.Load()-before)
			}
		}
	}
	if executed.Load() != allowedAgentCalls {
		t.Errorf("the agent executed %d calls; want %d (the allowed ones only)", executed.Load(), allowedAgentCalls)
	}

	// meshctl call, as an operator would: refused without the role.
	r := meshctl(t, "", "call", "memory.set", `{"k":"v"}`, "--hub", ws, "--token", callers["reader"])
	if r.code != cli.ExitError || !strings.HasPrefix(r.stderr, "PERMISSION_DENIED: ") {
		t.Errorf("meshctl call memory.set as reader: exit %d, stderr %q; want %d and PERMISSION_DENIED", r.code, r.stderr, cli.ExitError)
	}
	r = meshctl(t, "", "call", "memory.set", `{"k":"v"}`, "--hub", ws, "--token", callers["writer"], "-o", "json")
	if r.code != 0 || !strings.Contains(r.stdout, `"memory.set"`) {
		t.Errorf("meshctl call memory.set as writer: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}

	// --check reads the policy file as a start would: a table it could
	// not enforce as written is refused, naming the entry.
	check := func(body string, withKey bool) result {
		p := filepath.Join(t.TempDir(), "mesh.yaml")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		args := []string{"--check", "--config", p, "--listen", "127.0.0.1:0"}
		if withKey {
			args = append(args, "--auth-key", keyFile)
		}
		return secMeshdRun(t, args...)
	}
	if r := check(secRolesPolicy, true); r.code != 0 {
		t.Errorf("meshd --check with the policy: exit %d, %s", r.code, r.stderr)
	}
	for _, bad := range []struct{ body, want string }{
		{`roles: { "memory.get.": [reader] }`, "roles[memory.get.]"},
		{`roles: { "memory.*": [] }`, "roles[memory.*]: lists no role"},
		{`roles: { "memory.*": ["read er"] }`, `role "read er"`},
	} {
		if r := check(bad.body, true); r.code != cli.ExitUsage || !strings.Contains(r.stderr, bad.want) {
			t.Errorf("meshd --check with %s: exit %d, stderr %q; want %d naming %q", bad.body, r.code, r.stderr, cli.ExitUsage, bad.want)
		}
	}
	if r := check(secRolesPolicy, false); r.code != cli.ExitUsage || !strings.Contains(r.stderr, "enforced only with --auth-key") {
		t.Errorf("meshd --check with roles and no --auth-key: exit %d, stderr %q; want %d", r.code, r.stderr, cli.ExitUsage)
	}
}
