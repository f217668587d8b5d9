package e2e_test

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestSDKCrossLanguage: agents and clients of the three SDKs through one
// hub, each language calling the others. A Go, a TypeScript and a Python
// conformance agent register with one meshd; then
//   - the Go client calls the TypeScript and Python agents (echo, trace
//     context, a throw);
//   - the TypeScript client (sdk/typescript/examples/client.mjs, a process)
//     calls the Go and Python agents, with its caller's traceparent;
//   - the Python client (sdk/python/examples/client.py) calls the Go and
//     TypeScript agents;
//
// each answer is its own params back, the handler sees the caller's trace
// id, and a throw in any agent reaches
// every client as INTERNAL_ERROR with its message.
func TestSDKCrossLanguage(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	goAgent := goConformanceAgent(t, root)
	tsAgent := tsConformanceAgent(t, root)
	pyAgent := pyConformanceAgent(t, root)
	h := hubAt(t, freeAddr(t))
	c := confClient(t, h.ws)
	agents := map[string]*proc{
		"x-go": startConfAgent(t, root, goAgent, "x-go", h.ws),
		"x-ts": startConfAgent(t, root, tsAgent, "x-ts", h.ws),
		"x-py": startConfAgent(t, root, pyAgent, "x-py", h.ws),
	}
	for name, p := range agents {
		if _, ok := pollAgent(c, p, name, 15*time.Second, true); !ok {
			t.Fatalf("agent %s not registered within 15s:\n%s", name, p.stderr.String())
		}
	}

	// Values every language must carry unchanged (as JSON values: the
	// TypeScript and Python agents decode and re-encode what they echo).
	payloads := []string{
		`{"from":"%s","n":42,"f":-1.5e-7,"ok":true,"none":null,"list":[1,"two",{"three":3}]}`,
		`"héllo, 世界 — %s 🚀"`,
	}

	clients := []struct {
		lang string
		argv []string // the client's command before its flags
	}{
		{"typescript", []string{tsAgent[0], filepath.Join(root, "sdk", "typescript", "examples", "client.mjs")}},
		{"python", []string{pyAgent[0], filepath.Join(root, "sdk", "python", "examples", "client.py")}},
	}
	targets := map[string][]string{"typescript": {"x-go", "x-py"}, "python": {"x-go", "x-ts"}}

	t.Run("go-client", func(t *testing.T) {
		for _, name := range []string{"x-ts", "x-py"} {
			for _, p := range payloads {
				checkEcho(t, c, name, strings.Replace(p, "%s", "go", 1))
			}
			checkTrace(t, c, name)
			checkThrow(t, c, name)
		}
	})
	for _, cl := range clients {
		t.Run(cl.lang+"-client", func(t *testing.T) {
			for _, name := range targets[cl.lang] {
				for _, p := range payloads {
					params := strings.Replace(p, "%s", cl.lang, 1)
					out, code := runClient(t, root, cl.argv, h.ws, name+".echo", params)
					if code != 0 || !jsonEq(out, params) {
						t.Errorf("%s client → %s.echo %s: exit %d, printed %s; want exit 0 and its params", cl.lang, name, params, code, out)
					}
				}
				traceID := randHex(16)
				out, code := runClient(t, root, cl.argv, h.ws, name+".trace", `{}`, "--traceparent", "00-"+traceID+"-"+randHex(8)+"-01")
				var tr struct{ Traceparent string }
				if err := json.Unmarshal([]byte(out), &tr); code != 0 || err != nil || !strings.Contains(tr.Traceparent, "-"+traceID+"-") {
					t.Errorf("%s client → %s.trace with trace id %s: exit %d, printed %s; want the handler to see that trace id", cl.lang, name, traceID, code, out)
				}
				msg := "boom-" + randHex(6)
				out, code = runClient(t, root, cl.argv, h.ws, name+".fail", `{"message":"`+msg+`"}`)
				var e struct {
					Error struct{ Code, Message string }
				}
				if err := json.Unmarshal([]byte(out), &e); code != 1 || err != nil || e.Error.Code != "INTERNAL_ERROR" || !strings.Contains(e.Error.Message, msg) {
					t.Errorf("%s client → %s.fail: exit %d, printed %s; want exit 1 and INTERNAL_ERROR with %q", cl.lang, name, code, out, msg)
				}
			}
		})
	}
}

// runClient runs an SDK's example client once against hub and returns
// what it printed on stdout (trimmed) and its exit code.
func runClient(t *testing.T, root string, argv []string, hub, method, params string, flags ...string) (string, int) {
	t.Helper()
	args := slices.Concat(argv[1:], []string{"--hub", hub, "--timeout", "5s"}, flags, []string{method, params})
	cmd := exec.CommandContext(t.Context(), argv[0], args...)
	cmd.Dir = root
	cmd.Env = env()
	cmd.WaitDelay = 5 * time.Second
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			t.Fatalf("%s: %v", strings.Join(args, " "), err)
		}
		code = ee.ExitCode()
	}
	if code != 0 && code != 1 {
		t.Logf("%s %s: exit %d, stderr:\n%s", filepath.Base(argv[1]), strings.Join(args[1:], " "), code, stderr.String())
	}
	return strings.TrimSpace(string(out)), code
}
