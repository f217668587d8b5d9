package e2e_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// interopSuite returns the node binary and the interop/ directory, after
// checking that `npm ci --prefix interop` has installed its npm clients.
// Without them the test fails in CI (where .ci/run installs them) and is
// skipped elsewhere, saying what to run, as the etcd tests do.
func interopSuite(t *testing.T) (node, dir string) {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "interop")) // the test runs in e2e/
	if err != nil {
		t.Fatal(err)
	}
	missing := t.Fatalf
	if os.Getenv("CI") == "" {
		missing = t.Skipf
	}
	for _, pkg := range []string{"@modelcontextprotocol/sdk", "openai", "json-rpc-2.0", "ws", "socket.io-client", "eventsource"} {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", pkg, "package.json")); err != nil {
			missing("the npm package %s is not installed in %s (%v): run `npm ci --prefix interop` at the repository's root (CI does)", pkg, dir, err)
		}
	}
	node, err = exec.LookPath("node")
	if err != nil {
		missing("node (Node.js 20 or later) is not on PATH: %v; install it, then run `npm ci --prefix interop` (CI does)", err)
	}
	return node, dir
}

var tapCount = regexp.MustCompile(`(?m)^# (pass|fail) (\d+)$`)

// TestInteropNode: the clients users already have, unchanged, against a
// real meshd --demo: the interop/ suite (node --test) drives the official
// MCP TypeScript SDK (tools listed with schemas, a call, a failing call
// as the isError result with the coded message, an unknown tool as the
// protocol error, chat.getAgentMessages against its outputSchema), the
// openai SDK (models, chat/demo, a completion, a stream, a stream the
// caller aborts), the json-rpc-2.0 client over /rpc and over /ws (ws):
// a request, a notification, a batch, a coded error, and the eventsource
// client over agentick's /events (a stream cut mid-turn resumed with
// Last-Event-ID, a second stream for a live clientId refused). It prints "N passed, N failed"; any failure
// fails the test. Needs `npm ci --prefix interop` (.ci/run does it).
func TestInteropNode(t *testing.T) {
	t.Parallel()
	node, dir := interopSuite(t)
	h := startHub(t, "--demo")
	waitMethods(t, h.ws, "echo.echo", "memory.get", "chat.send")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--test", "--test-reporter=tap")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "MESH_URL="+h.base)
	out, err := cmd.CombinedOutput()
	counts := map[string]int{}
	for _, m := range tapCount.FindAllStringSubmatch(string(out), -1) {
		counts[m[1]], _ = strconv.Atoi(m[2])
	}
	t.Logf("interop (node --test in interop/ against meshd --demo): %d passed, %d failed", counts["pass"], counts["fail"])
	if err != nil || counts["fail"] > 0 || counts["pass"] == 0 {
		t.Errorf("node --test: %v, %d passed, %d failed; its output:\n%s", err, counts["pass"], counts["fail"], out)
	}
}
