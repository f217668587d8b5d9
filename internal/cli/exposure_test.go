package cli_test

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/internal/cli"
)

// TestMeshdExposure: meshd listens beyond loopback only when told to
// (--allow-remote) and then only with authentication; the admin port,
// which serves /metrics and /debug/pprof without a token, leaves
// loopback only with --allow-remote. meshd --check validates a command
// line without listening (so 0.0.0.0 is never bound here).
func TestMeshdExposure(t *testing.T) {
	key := filepath.Join(t.TempDir(), "hub.key")
	if _, err := auth.NewKeyFile(key); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		args    []string
		code    int
		stderr  string // a part of it, when the command is refused
		summary string // a part of --check's line, when accepted
	}{
		{args: []string{"--listen", "0.0.0.0:7700"}, code: cli.ExitUsage, stderr: "pass --allow-remote"},
		{args: []string{"--listen", "[::]:7700"}, code: cli.ExitUsage, stderr: "pass --allow-remote"},
		{args: []string{"--listen", ":7700"}, code: cli.ExitUsage, stderr: "pass --allow-remote"},
		{args: []string{"--listen", "192.0.2.1:7700", "--allow-remote"}, code: cli.ExitUsage, stderr: "--allow-remote needs --auth-key"},
		{args: []string{"--listen", "0.0.0.0:7700", "--allow-remote", "--auth-key", key}, summary: "auth true"},
		{args: []string{"--listen", "127.0.0.1:7700"}, summary: "listen 127.0.0.1:7700"},
		{args: []string{"--listen", "localhost:7700"}, summary: "auth false"},
		{args: []string{"--listen", "[::1]:7700"}, summary: "registry memory"},
		{args: []string{"--listen", "127.0.0.1:7700", "--admin-addr", "0.0.0.0:9464"}, code: cli.ExitUsage, stderr: "--admin-addr 0.0.0.0:9464 is not a loopback address"},
		{args: []string{"--listen", "127.0.0.1:7700", "--admin-addr", ":9464"}, code: cli.ExitUsage, stderr: "without a token"},
		{args: []string{"--listen", "127.0.0.1:7700", "--admin-addr", "127.0.0.1:9464"}, summary: `admin "127.0.0.1:9464"`},
		{args: []string{"--listen", "0.0.0.0:7700", "--allow-remote", "--auth-key", key, "--admin-addr", "0.0.0.0:9464"}, summary: `admin "0.0.0.0:9464"`},
		{args: []string{"--listen", "127.0.0.1:7700", "--registry", "consul"}, code: cli.ExitUsage, stderr: "--registry must be memory or etcd"},
		{args: []string{"--listen", "127.0.0.1:7700", "--auth-key", filepath.Join(t.TempDir(), "none.key")}, code: cli.ExitUsage, stderr: "--auth-key"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			code := cli.Run(t.Context(), cli.NewMeshd(&out, &errb), append(tc.args, "--check", "--log-level", "error"), &errb)
			if code != tc.code {
				t.Fatalf("exit %d; want %d\nstdout %s\nstderr %s", code, tc.code, out.String(), errb.String())
			}
			if tc.stderr != "" && !strings.Contains(errb.String(), tc.stderr) {
				t.Errorf("stderr %q; want it to say %q", errb.String(), tc.stderr)
			}
			if tc.summary != "" && (!strings.Contains(out.String(), "meshd: configuration OK") || !strings.Contains(out.String(), tc.summary)) {
				t.Errorf("stdout %q; want the --check summary with %q", out.String(), tc.summary)
			}
		})
	}
}
