package cli_test

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/internal/cli"
)

func TestMeshctlToken(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "auth.key")
	other := filepath.Join(dir, "other.key")
	for _, k := range []string{key, other} {
		if r := meshctl(t, "", "token", "keygen", "--out", k); r.code != 0 {
			t.Fatalf("keygen: exit %d, %s", r.code, r.stderr)
		}
	}
	st, err := os.Stat(key)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, mode %v; want 0600", err, st.Mode())
	}
	if r := meshctl(t, "", "token", "keygen", "--out", key); r.code != cli.ExitError || !strings.Contains(r.stderr, "not overwriting") {
		t.Errorf("keygen over an existing key: exit %d, %q", r.code, r.stderr)
	}
	if r := meshctl(t, "", "token", "keygen"); r.code != cli.ExitUsage {
		t.Errorf("keygen without --out: exit %d", r.code)
	}

	r := meshctl(t, "", "token", "issue", "--key", key, "--sub", "memory-agent", "--role", "agent", "--role", "reader", "--serve", "memory.*", "--serve", "echo.echo", "--ttl", "1h")
	if r.code != 0 {
		t.Fatalf("issue: exit %d, %s", r.code, r.stderr)
	}
	tok := strings.TrimSpace(r.stdout)
	if strings.Count(tok, ".") != 2 || r.stdout != tok+"\n" {
		t.Fatalf("issue printed %q; want one JWT line", r.stdout)
	}

	var claims struct {
		Sub   string    `json:"sub"`
		Roles []string  `json:"roles"`
		Serve []string  `json:"serve"`
		Iat   time.Time `json:"iat"`
		Exp   time.Time `json:"exp"`
		Jti   string    `json:"jti"`
	}
	check := func(r result) {
		t.Helper()
		if r.code != 0 {
			t.Fatalf("inspect: exit %d, %s", r.code, r.stderr)
		}
		if err := json.Unmarshal([]byte(r.stdout), &claims); err != nil {
			t.Fatalf("inspect output %q: %v", r.stdout, err)
		}
		if claims.Sub != "memory-agent" || strings.Join(claims.Roles, ",") != "agent,reader" || strings.Join(claims.Serve, ",") != "memory.*,echo.echo" || claims.Jti == "" {
			t.Errorf("claims %+v", claims)
		}
		if d := claims.Exp.Sub(claims.Iat); d != time.Hour {
			t.Errorf("exp - iat = %v; want 1h", d)
		}
	}
	check(meshctl(t, "", "token", "inspect", tok, "--key", key))
	check(meshctl(t, tok+"\n", "token", "inspect", "-", "--key", key))
	t.Setenv("MESH_TOKEN", tok)
	check(meshctl(t, "", "token", "inspect", "--key", key))

	// --kid labels the token's key; inspect (like meshd) knows a key by
	// its label given as LABEL=FILE, and by its own id in any case.
	r = meshctl(t, "", "token", "issue", "--key", key, "--sub", "memory-agent", "--role", "agent", "--role", "reader", "--serve", "memory.*", "--serve", "echo.echo", "--ttl", "1h", "--kid", "next")
	if r.code != 0 || kidOf(t, strings.TrimSpace(r.stdout)) != "next" {
		t.Fatalf("issue --kid next: exit %d, %s, kid %q", r.code, r.stderr, kidOf(t, strings.TrimSpace(r.stdout)))
	}
	labelled := strings.TrimSpace(r.stdout)
	check(meshctl(t, "", "token", "inspect", labelled, "--key", "next="+key))
	check(meshctl(t, "", "token", "inspect", labelled, "--key", other+",next="+key))
	if r := meshctl(t, "", "token", "inspect", labelled, "--key", key); r.code != cli.ExitError || !strings.Contains(r.stderr, "unknown token key") {
		t.Errorf("a token of kid next, key not labelled: exit %d, %q; want unknown token key", r.code, r.stderr)
	}
	if k := kidOf(t, tok); len(k) != 8 {
		t.Errorf("default kid %q; want the key's 8-hex-digit id", k)
	}

	i := strings.LastIndexByte(tok, '.') + 1
	flip := byte('A')
	if tok[i] == 'A' {
		flip = 'B'
	}
	tampered := tok[:i] + string(flip) + tok[i+1:]
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"wrong key", []string{"token", "inspect", tok, "--key", other}, cli.ExitError, "UNAUTHENTICATED: unknown token key"},
		{"wrong key labelled with the token's kid", []string{"token", "inspect", tok, "--key", kidOf(t, tok) + "=" + other}, cli.ExitError, "UNAUTHENTICATED: bad token signature"},
		{"issue bad kid", []string{"token", "issue", "--key", key, "--sub", "y", "--kid", "a b"}, cli.ExitUsage, `key id "a b"`},
		{"garbage", []string{"token", "inspect", "abc", "--key", key}, cli.ExitError, "UNAUTHENTICATED: malformed token"},
		{"tampered", []string{"token", "inspect", tampered, "--key", key}, cli.ExitError, "UNAUTHENTICATED: bad token signature"},
		{"inspect without key", []string{"token", "inspect", tok}, cli.ExitUsage, "--key FILE is required"},
		{"issue without sub", []string{"token", "issue", "--key", key}, cli.ExitUsage, "--sub NAME"},
		{"issue alias pattern", []string{"token", "issue", "--key", key, "--sub", "y", "--serve", "memory.get."}, cli.ExitUsage, `serve pattern "memory.get."`},
		{"issue a hub token", []string{"token", "issue", "--key", key, "--sub", "hub.hub-b", "--role", "reader", "--role", "hub"}, cli.ExitUsage, "--role hub: peer tokens are minted by the hubs themselves"},
		{"issue zero ttl", []string{"token", "issue", "--key", key, "--sub", "y", "--ttl", "0s"}, cli.ExitUsage, "ttl"},
		{"issue missing key file", []string{"token", "issue", "--key", filepath.Join(dir, "nope"), "--sub", "y"}, cli.ExitUsage, "key file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := meshctl(t, "", tc.args...)
			if r.code != tc.code || !strings.Contains(r.stderr, tc.stderr) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", r.code, r.stderr, tc.code, tc.stderr)
			}
		})
	}

	// A world-readable key file is refused with a hint.
	if err := os.Chmod(key, 0o644); err != nil {
		t.Fatal(err)
	}
	if r := meshctl(t, "", "token", "issue", "--key", key, "--sub", "y"); r.code != cli.ExitUsage || !strings.Contains(r.stderr, "chmod 600") {
		t.Errorf("world-readable key: exit %d, %q", r.code, r.stderr)
	}
}

// kidOf returns the "kid" header of a JWT.
func kidOf(t *testing.T, tok string) string {
	t.Helper()
	h, err := base64.RawURLEncoding.DecodeString(strings.SplitN(tok, ".", 2)[0])
	if err != nil {
		t.Fatalf("token header: %v", err)
	}
	var hdr struct {
		Kid string `json:"kid"`
	}
	if err := json.Unmarshal(h, &hdr); err != nil {
		t.Fatalf("token header %s: %v", h, err)
	}
	return hdr.Kid
}
