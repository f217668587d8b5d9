package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// binDir holds the meshd and meshctl binaries built once by TestMain.
var binDir string

func TestMain(m *testing.M) { os.Exit(runTests(m)) }

func runTests(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: go list -m:", err)
		return 1
	}
	root := strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0]) // the main module comes first in a workspace
	dir, err := os.MkdirTemp("", "agentmesh-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	build := exec.CommandContext(ctx, "go", "build", "-o", dir, "./cmd/meshd", "./cmd/meshctl")
	build.Dir = root
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: building meshd and meshctl:", err)
		return 1
	}
	binDir = dir
	return m.Run()
}

// env is the environment of every process the tests start: the test's own
// without the MESH_* and OTEL_* variables, so that a developer's settings
// (a MESH_HUB, a text log format, a trace exporter) cannot leak in.
func env(extra ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "MESH_") || strings.HasPrefix(kv, "OTEL_") {
			continue
		}
		out = append(out, kv)
	}
	return append(out, extra...)
}

// syncBuf is a bytes.Buffer safe for a process's copier goroutine and the
// test reading it at once.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// proc is a background process (meshd, or a meshctl agent) whose output is
// kept.
type proc struct {
	name           string
	cmd            *exec.Cmd
	stdout, stderr *syncBuf
	done           chan struct{} // closed once the process has exited
	err            error         // Wait's error, once done is closed
	exited         time.Time     // once done is closed
}

// procLimit is the safety net on every process's life (see startWithEnv);
// the long full variants of the scenarios raise it for their duration.
var procLimit = 2 * time.Minute

// start runs a binary of binDir in the background. When the test ends it is
// stopped: SIGTERM, then SIGKILL if it has not exited within 5 s.
func start(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	return startWithEnv(t, nil, name, args...)
}

// startWithEnv is start with extra environment variables.
func startWithEnv(t *testing.T, extraEnv []string, name string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, stdout: &syncBuf{}, stderr: &syncBuf{}, done: make(chan struct{})}
	// A safety net far beyond any test's length: no process outlives a
	// hung test run by long.
	ctx, cancel := context.WithTimeout(t.Context(), procLimit)
	p.cmd = exec.CommandContext(ctx, filepath.Join(binDir, name), args...)
	p.cmd.Env = env(extraEnv...)
	launch(t, p, cancel, name+" "+strings.Join(args, " "))
	return p
}

// launch starts p.cmd (made with a context that cancel ends) and stops it
// when the test ends: SIGTERM when its context ends (t.Context ends just
// before the cleanups run), SIGKILL 5 s later; label names it in the log
// of a failed test, with its stderr.
func launch(t *testing.T, p *proc, cancel context.CancelFunc, label string) {
	t.Helper()
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	p.cmd.Cancel = func() error { return p.cmd.Process.Signal(syscall.SIGTERM) }
	p.cmd.WaitDelay = 5 * time.Second
	if err := p.cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start %s: %v", label, err)
	}
	go func() {
		defer cancel()
		err := p.cmd.Wait()
		p.err, p.exited = err, time.Now()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop(5 * time.Second)
		if t.Failed() {
			t.Logf("%s stderr:\n%s", label, p.stderr.String())
		}
	})
}

// stop sends SIGTERM and waits for the exit, sending SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
	if p.exitedYet() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *proc) exitedYet() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// result is a finished meshctl invocation.
type result struct {
	args           []string
	code           int // exit code; -1 if it could not run or was killed
	stdout, stderr string
	start, end     time.Time
	err            error // set when the process could not run or did not exit by itself
}

func (r result) took() time.Duration { return r.end.Sub(r.start) }

func (r result) String() string {
	return fmt.Sprintf("meshctl %s: exit %d after %v, stdout %q, stderr %q (err %v)",
		strings.Join(r.args, " "), r.code, r.took().Round(time.Millisecond), r.stdout, r.stderr, r.err)
}

// runCtl runs meshctl to completion with the extra environment variables,
// killing it after 20 s. It never fails the test itself, so that it can run
// on any goroutine.
func runCtl(ctx context.Context, extraEnv []string, args ...string) result {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "meshctl"), args...)
	cmd.Env = env(extraEnv...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	r := result{args: args, start: time.Now()}
	err := cmd.Run()
	r.end = time.Now()
	r.stdout, r.stderr, r.code = out.String(), errb.String(), 0
	var ee *exec.ExitError
	switch {
	case ctx.Err() != nil:
		r.code, r.err = -1, fmt.Errorf("killed: %w (%v)", ctx.Err(), err)
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		r.code, r.err = -1, err
	}
	return r
}

func meshctl(t *testing.T, args ...string) result {
	return runCtl(t.Context(), nil, args...)
}

// want checks a meshctl result's exit code and the start of its stderr.
func want(t *testing.T, r result, code int, stderrPrefix string) {
	t.Helper()
	if r.code != code || !strings.HasPrefix(r.stderr, stderrPrefix) {
		t.Errorf("%v; want exit %d and stderr starting with %q", r, code, stderrPrefix)
	}
}

// waitFor polls cond until it holds, failing the test after d.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// hub is a running meshd.
type hub struct {
	*proc
	addr string // host:port it listens on
	ws   string // ws://addr/ws
	base string // http://addr
}

// noHeapFloor is meshd's flag for a test that bounds, by the hub's RSS,
// what a client makes the hub hold (a slow consumer, a stalled stream):
// the heap floor lets up to 64 MiB of garbage wait for the next
// collection whatever the load (--gc-min-heap), which would hide the
// bound, so these hubs collect at GOGC alone. The floor is tested in
// internal/gcfloor.
const noHeapFloor = "--gc-min-heap=0"

// startHub runs meshd on a port of the kernel's choosing on loopback, reads
// the address back from its "hub listening" log line and waits until
// /readyz answers 200. The hub has no warm-up (--warm-up 0) unless extra
// sets one: it is new, no agent reconnects to it, and the tests want a
// method nobody serves answered METHOD_NOT_FOUND at once.
func startHub(t *testing.T, extra ...string) *hub {
	t.Helper()
	return startHubEnv(t, nil, extra...)
}

// startHubEnv is startHub with extra environment variables for meshd.
func startHubEnv(t *testing.T, extraEnv []string, extra ...string) *hub {
	t.Helper()
	p := startWithEnv(t, extraEnv, "meshd", append([]string{"--listen", "127.0.0.1:0", "--heartbeat", "200ms", "--warm-up", "0"}, extra...)...)
	h := &hub{proc: p}
	waitFor(t, `meshd logging "hub listening"`, 10*time.Second, func() bool {
		if p.exitedYet() {
			t.Fatalf("meshd exited early (%v):\n%s", p.err, p.stderr.String())
		}
		h.addr = listeningAddr(p.stderr.String())
		return h.addr != ""
	})
	if host, _, err := net.SplitHostPort(h.addr); err != nil || host != "127.0.0.1" {
		t.Fatalf("meshd listens on %q; want 127.0.0.1:PORT", h.addr)
	}
	h.ws, h.base = "ws://"+h.addr+"/ws", "http://"+h.addr
	client := &http.Client{Timeout: time.Second}
	waitFor(t, "meshd /readyz 200", 10*time.Second, func() bool {
		return httpStatus(client, h.base+"/readyz") == http.StatusOK
	})
	return h
}

// listeningAddr finds the addr of meshd's JSON "hub listening" line.
func listeningAddr(log string) string {
	sc := bufio.NewScanner(strings.NewReader(log))
	for sc.Scan() {
		var line struct{ Msg, Addr string }
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "hub listening" {
			return line.Addr
		}
	}
	return ""
}

// httpStatus GETs url and returns the status, or 0 when there is no answer.
func httpStatus(c *http.Client, url string) int {
	res, err := c.Get(url)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

type methodInfo struct {
	Method string   `json:"method"`
	Agents []string `json:"agents"`
	Ready  int      `json:"ready"`
}

type agentInfo struct {
	AgentID  string   `json:"agentId"`
	Name     string   `json:"name"`
	Status   string   `json:"status"`
	InFlight int64    `json:"inflight"`
	Methods  []string `json:"methods"`
}

// listAgents is `meshctl agents -o json`, decoded.
func listAgents(t *testing.T, ws string) ([]agentInfo, result) {
	t.Helper()
	r := meshctl(t, "agents", "--hub", ws, "--timeout", "2s", "-o", "json")
	var list []agentInfo
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &list) != nil {
		return nil, r
	}
	return list, r
}

// waitMethods polls `meshctl methods -o json` until every method has a
// ready instance.
func waitMethods(t *testing.T, ws string, methods ...string) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%v served by a ready agent", methods), 10*time.Second, func() bool {
		r := meshctl(t, "methods", "--hub", ws, "--timeout", "2s", "-o", "json")
		var list []methodInfo
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &list) != nil {
			return false
		}
		for _, want := range methods {
			if !slices.ContainsFunc(list, func(m methodInfo) bool { return m.Method == want && m.Ready > 0 }) {
				return false
			}
		}
		return true
	})
}

// jsonEq reports whether two JSON texts hold the same value.
func jsonEq(a, b string) bool {
	var x, y any
	return json.Unmarshal([]byte(a), &x) == nil && json.Unmarshal([]byte(b), &y) == nil && reflect.DeepEqual(x, y)
}

// TestEchoAgent runs meshd and `meshctl agent run echo` as two processes
// and checks what meshctl prints and how it exits, then SIGKILLs the agent:
// the next call fails with a coded error within a second.
func TestEchoAgent(t *testing.T) {
	t.Parallel()
	h := startHub(t)
	agent := start(t, "meshctl", "agent", "run", "echo", "--hub", h.ws, "--id", "echo-1")
	waitMethods(t, h.ws, "echo.echo")

	t.Run("call -o json", func(t *testing.T) {
		r := meshctl(t, "call", "echo.echo", `{"hello":"mesh"}`, "--hub", h.ws, "-o", "json")
		if r.code != 0 || r.stdout != "{\"hello\":\"mesh\"}\n" || r.stderr != "" {
			t.Errorf("%v; want exit 0 and exactly {\"hello\":\"mesh\"} and a newline", r)
		}
	})
	t.Run("call -o pretty", func(t *testing.T) {
		r := meshctl(t, "call", "echo.echo", `{"hello":"mesh"}`, "--hub", h.ws, "-o", "pretty")
		if r.code != 0 || !strings.Contains(r.stdout, "Success") || !strings.Contains(r.stdout, "{\n  \"hello\": \"mesh\"\n}") {
			t.Errorf("%v; want exit 0, Success and the indented result", r)
		}
	})
	t.Run("json by default when stdout is not a terminal", func(t *testing.T) {
		r := meshctl(t, "call", "echo.echo", `[1,2]`, "--hub", h.ws)
		if r.code != 0 || r.stdout != "[1,2]\n" {
			t.Errorf("%v; want [1,2]", r)
		}
	})
	t.Run("MESH_HUB", func(t *testing.T) {
		r := runCtl(t.Context(), []string{"MESH_HUB=" + h.ws}, "call", "echo.echo", `"env"`, "-o", "json")
		if r.code != 0 || r.stdout != "\"env\"\n" {
			t.Errorf("%v; want \"env\" through the hub of $MESH_HUB", r)
		}
	})
	t.Run("call over HTTP", func(t *testing.T) {
		r := meshctl(t, "call", "echo.echo", `{"over":"http"}`, "--hub", h.base+"/rpc", "-o", "json")
		if r.code != 0 || r.stdout != "{\"over\":\"http\"}\n" {
			t.Errorf("%v; want the params back", r)
		}
	})
	t.Run("agents -o json", func(t *testing.T) {
		list, r := listAgents(t, h.ws)
		if len(list) != 1 || list[0].AgentID != "echo-1" || list[0].Name != "echo" || list[0].Status != "ready" ||
			!slices.Contains(list[0].Methods, "echo.echo") {
			t.Errorf("%v; want one agent echo-1 named echo, ready, serving echo.echo", r)
		}
	})
	t.Run("agents -o table", func(t *testing.T) {
		r := meshctl(t, "agents", "--hub", h.ws, "-o", "table")
		if r.code != 0 || !strings.HasPrefix(r.stdout, "AGENT ID") || !strings.Contains(r.stdout, "echo-1") {
			t.Errorf("%v; want a table with echo-1", r)
		}
	})
	t.Run("methods -o json", func(t *testing.T) {
		r := meshctl(t, "methods", "--hub", h.ws, "-o", "json")
		var list []methodInfo
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &list) != nil ||
			!slices.ContainsFunc(list, func(m methodInfo) bool {
				return m.Method == "echo.echo" && m.Ready == 1 && slices.Equal(m.Agents, []string{"echo-1"})
			}) {
			t.Errorf("%v; want echo.echo served by echo-1", r)
		}
	})
	t.Run("unknown method", func(t *testing.T) {
		r := meshctl(t, "call", "nope.nope", "--hub", h.ws)
		want(t, r, 1, "METHOD_NOT_FOUND: ")
		if r.stdout != "" {
			t.Errorf("stdout %q; want nothing", r.stdout)
		}
	})
	t.Run("bad params", func(t *testing.T) {
		r := meshctl(t, "call", "echo.echo", "{bad", "--hub", h.ws)
		want(t, r, 2, "error: params are not valid JSON")
	})
	t.Run("bad -o", func(t *testing.T) {
		want(t, meshctl(t, "call", "echo.echo", "--hub", h.ws, "-o", "yaml"), 2, "error: ")
	})
	t.Run("unreachable hub", func(t *testing.T) {
		r := meshctl(t, "call", "echo.echo", "--hub", "ws://127.0.0.1:1/ws")
		want(t, r, 3, "UNAVAILABLE: ")
		t.Logf("unreachable hub reported after %v", r.took())
	})

	// SIGKILL: no deregistration, the hub only sees the link drop. It
	// forgets the instance and, as the method was served recently, answers
	// the next call UNAVAILABLE at once rather than METHOD_NOT_FOUND or a
	// timeout.
	t.Run("call after SIGKILL of the agent", func(t *testing.T) {
		killed := time.Now()
		if err := agent.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		<-agent.done
		r := meshctl(t, "call", "echo.echo", `{"after":"kill"}`, "--hub", h.ws, "--timeout", "10s", "-o", "json")
		want(t, r, 1, "UNAVAILABLE: ")
		since := r.end.Sub(killed)
		t.Logf("the call after SIGKILL exited %v after the kill; the call itself took %v; %s",
			since.Round(time.Millisecond), r.took().Round(time.Millisecond), strings.TrimSpace(r.stderr))
		if since > time.Second {
			t.Errorf("the call after SIGKILL exited %v after the kill; want under 1s", since)
		}
		if list, r := listAgents(t, h.ws); r.code != 0 || len(list) != 0 {
			t.Errorf("%v; want no agent left", r)
		}
	})
}

// TestInFlightCallFailsFastWhenAgentDies: a call waiting on an agent that
// is SIGKILLed fails with UNAVAILABLE within a second of the kill, not at
// the agent's latency (5 s) or the call's timeout (10 s).
func TestInFlightCallFailsFastWhenAgentDies(t *testing.T) {
	h := startHub(t)
	agent := start(t, "meshctl", "agent", "run", "chaos", "--hub", h.ws, "--id", "chaos-1", "--latency", "5s")
	waitMethods(t, h.ws, "chaos.echo")

	done := make(chan result, 1)
	ctx := t.Context()
	go func() {
		done <- runCtl(ctx, nil, "call", "chaos.echo", `{"n":1}`, "--hub", h.ws, "--timeout", "10s", "-o", "json")
	}()
	callStart := time.Now()
	// Kill it 300 ms after the call started, once the hub has it in flight
	// at the agent.
	waitFor(t, "the call in flight at chaos-1", 3*time.Second, func() bool {
		list, _ := listAgents(t, h.ws)
		return len(list) == 1 && list[0].InFlight > 0
	})
	time.Sleep(300*time.Millisecond - time.Since(callStart))
	killed := time.Now()
	if err := agent.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("the call did not return within 15s")
	}
	want(t, r, 1, "UNAVAILABLE: ")
	since := r.end.Sub(killed)
	t.Logf("the in-flight call exited %v after the kill (%v after it started); %s",
		since.Round(time.Millisecond), r.took().Round(time.Millisecond), strings.TrimSpace(r.stderr))
	if since > time.Second {
		t.Errorf("the in-flight call exited %v after the kill; want under 1s", since)
	}
}

// rpcReply is a JSON-RPC 2.0 response.
type rpcReply struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  json.RawMessage `json:"result"`
	Error   *struct {
		Code    int             `json:"code"`
		Message string          `json:"message"`
		Data    json.RawMessage `json:"data"`
	} `json:"error"`
}

// postRPC POSTs a JSON-RPC body to /rpc with plain net/http.
func postRPC(t *testing.T, base, body string) (int, rpcReply, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/rpc", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST /rpc %s: %v", body, err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	if ct := res.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("POST /rpc %s: Content-Type %q; want application/json", body, ct)
	}
	var rep rpcReply
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatalf("POST /rpc %s: %d %q is not a JSON-RPC response: %v", body, res.StatusCode, raw, err)
	}
	if rep.JSONRPC != "2.0" {
		t.Errorf("POST /rpc %s: jsonrpc %q; want 2.0", body, rep.JSONRPC)
	}
	return res.StatusCode, rep, string(raw)
}

// TestDemoHub: meshd --demo runs the echo and kv agents itself; they answer
// through meshctl (WebSocket and HTTP) and through a plain HTTP POST.
func TestDemoHub(t *testing.T) {
	t.Parallel()
	h := startHub(t, "--demo")
	waitMethods(t, h.ws, "echo.echo", "memory.put", "memory.get")

	if r := meshctl(t, "call", "echo.echo", `{"demo":true}`, "--hub", h.ws, "-o", "json"); r.code != 0 || r.stdout != "{\"demo\":true}\n" {
		t.Errorf("%v; want the params back", r)
	}
	if r := meshctl(t, "call", "memory.put", `{"key":"cat","value":"meow"}`, "--hub", h.ws, "-o", "json"); r.code != 0 ||
		!jsonEq(r.stdout, `{"ok":true,"key":"cat"}`) {
		t.Errorf("%v; want {\"ok\":true,\"key\":\"cat\"}", r)
	}
	for _, hubURL := range []string{h.ws, h.base + "/rpc"} {
		if r := meshctl(t, "call", "memory.get", `{"key":"cat"}`, "--hub", hubURL, "-o", "json"); r.code != 0 ||
			!jsonEq(r.stdout, `{"key":"cat","value":"meow","found":true}`) {
			t.Errorf("%v; want meow, found", r)
		}
	}
	if r := meshctl(t, "call", "memory.put", `{"key":"cat"}`, "--hub", h.ws); r.code != 1 || !strings.HasPrefix(r.stderr, "INVALID_PARAMS: ") {
		t.Errorf("%v; want INVALID_PARAMS (no value)", r)
	}

	// Plain HTTP, as curl would.
	status, rep, raw := postRPC(t, h.base, `{"jsonrpc":"2.0","id":1,"method":"echo.echo","params":{"via":"http"}}`)
	if status != http.StatusOK || rep.Error != nil || string(rep.ID) != "1" || !jsonEq(string(rep.Result), `{"via":"http"}`) {
		t.Errorf("POST echo.echo: %d %s", status, raw)
	}
	status, rep, raw = postRPC(t, h.base, `{"jsonrpc":"2.0","id":"p","method":"memory.put","params":{"key":"dog","value":{"says":"woof"}}}`)
	if status != http.StatusOK || rep.Error != nil || string(rep.ID) != `"p"` || !jsonEq(string(rep.Result), `{"ok":true,"key":"dog"}`) {
		t.Errorf("POST memory.put: %d %s", status, raw)
	}
	status, rep, raw = postRPC(t, h.base, `{"jsonrpc":"2.0","id":2,"method":"memory.get","params":{"key":"dog"}}`)
	if status != http.StatusOK || rep.Error != nil || !jsonEq(string(rep.Result), `{"key":"dog","value":{"says":"woof"},"found":true}`) {
		t.Errorf("POST memory.get: %d %s", status, raw)
	}
	// What was put over HTTP is read back through meshctl: one store.
	if r := meshctl(t, "call", "memory.get", `{"key":"dog"}`, "--hub", h.ws, "-o", "json"); r.code != 0 ||
		!jsonEq(r.stdout, `{"key":"dog","value":{"says":"woof"},"found":true}`) {
		t.Errorf("%v; want woof", r)
	}
	status, rep, raw = postRPC(t, h.base, `{"jsonrpc":"2.0","id":3,"method":"nope.nope"}`)
	if rep.Error == nil || rep.Error.Code != -32601 || rep.Result != nil {
		t.Errorf("POST nope.nope: %d %s; want error -32601", status, raw)
	}
}

// TestMeshdExitsZeroOnSIGTERM: an idle hub with an agent attached stops on
// SIGTERM within a few seconds, exit code 0, its log JSON lines to the end.
func TestMeshdExitsZeroOnSIGTERM(t *testing.T) {
	t.Parallel()
	h := startHub(t)
	start(t, "meshctl", "agent", "run", "echo", "--hub", h.ws, "--id", "echo-sig")
	waitMethods(t, h.ws, "echo.echo")

	sent := time.Now()
	if err := h.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.done:
	case <-time.After(5 * time.Second):
		t.Fatal("meshd still running 5s after SIGTERM")
	}
	t.Logf("meshd exited %v after SIGTERM", h.exited.Sub(sent).Round(time.Millisecond))
	if h.err != nil || h.cmd.ProcessState.ExitCode() != 0 {
		t.Errorf("meshd exited with %v after SIGTERM; want exit 0", h.err)
	}
	var msgs []string
	sc := bufio.NewScanner(strings.NewReader(h.stderr.String()))
	for sc.Scan() {
		var line struct{ Level, Msg string }
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil || line.Level == "" || line.Msg == "" {
			t.Errorf("log line is not JSON with level and msg: %q", sc.Text())
		}
		msgs = append(msgs, line.Msg)
	}
	if !slices.Contains(msgs, "hub stopped") {
		t.Errorf("log %q; want a \"hub stopped\" line", msgs)
	}
	if httpStatus(&http.Client{Timeout: time.Second}, h.base+"/livez") != 0 {
		t.Error("something still answers on meshd's address after it exited")
	}
}

// TestGracefulDrain: on SIGTERM, meshd turns /readyz 503, refuses new
// calls with UNAVAILABLE, lets the call in flight finish, then exits 0.
func TestGracefulDrain(t *testing.T) {
	h := startHub(t, "--drain-timeout", "5s")
	start(t, "meshctl", "agent", "run", "echo", "--hub", h.ws, "--id", "echo-drain")
	waitMethods(t, h.ws, "echo.sleep")

	done := make(chan result, 1)
	ctx := t.Context()
	go func() {
		done <- runCtl(ctx, nil, "call", "echo.sleep", `{"ms":1500}`, "--hub", h.ws, "--timeout", "10s", "-o", "json")
	}()
	waitFor(t, "echo.sleep in flight", 3*time.Second, func() bool {
		list, _ := listAgents(t, h.ws)
		return len(list) == 1 && list[0].InFlight > 0
	})
	sent := time.Now()
	if err := h.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Timeout: time.Second}
	waitFor(t, "/readyz 503 while draining", time.Second, func() bool {
		return httpStatus(client, h.base+"/readyz") == http.StatusServiceUnavailable
	})
	// A new call while draining is refused at once: over HTTP with
	// UNAVAILABLE; meshctl cannot even open its WebSocket (503), so for it
	// there is no hub to reach.
	status, rep, raw := postRPC(t, h.base, `{"jsonrpc":"2.0","id":1,"method":"echo.echo","params":[1]}`)
	if rep.Error == nil || rep.Error.Code != -32002 {
		t.Errorf("POST during the drain: %d %s; want UNAVAILABLE (-32002)", status, raw)
	}
	want(t, meshctl(t, "call", "echo.echo", "1", "--hub", h.ws, "--timeout", "2s"), 3, "UNAVAILABLE: ")

	if r := <-done; r.code != 0 || !jsonEq(r.stdout, `{"slept":1500}`) {
		t.Errorf("the call in flight during SIGTERM: %v; want {\"slept\":1500}", r)
	}
	select {
	case <-h.done:
	case <-time.After(5 * time.Second):
		t.Fatal("meshd still running 5s after the drain")
	}
	t.Logf("meshd exited %v after SIGTERM (a 1.5s call was in flight)", h.exited.Sub(sent).Round(time.Millisecond))
	if h.err != nil {
		t.Errorf("meshd exited with %v after SIGTERM; want exit 0", h.err)
	}
}

// TestDemoHubDrain: meshd --demo stops its own agents first on SIGTERM;
// the call in flight on them still completes and meshd exits 0.
func TestDemoHubDrain(t *testing.T) {
	t.Parallel()
	h := startHub(t, "--demo", "--drain-timeout", "5s")
	waitMethods(t, h.ws, "echo.sleep")
	done := make(chan result, 1)
	ctx := t.Context()
	go func() {
		done <- runCtl(ctx, nil, "call", "echo.sleep", `{"ms":500}`, "--hub", h.ws, "--timeout", "10s", "-o", "json")
	}()
	waitFor(t, "echo.sleep in flight", 3*time.Second, func() bool {
		list, _ := listAgents(t, h.ws)
		return slices.ContainsFunc(list, func(a agentInfo) bool { return a.Name == "echo" && a.InFlight > 0 })
	})
	sent := time.Now()
	if err := h.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.code != 0 || !jsonEq(r.stdout, `{"slept":500}`) {
		t.Errorf("the call in flight during SIGTERM: %v; want {\"slept\":500}", r)
	}
	select {
	case <-h.done:
	case <-time.After(5 * time.Second):
		t.Fatal("meshd --demo still running 5s after the call ended")
	}
	t.Logf("meshd --demo exited %v after SIGTERM (a 0.5s call was in flight)", h.exited.Sub(sent).Round(time.Millisecond))
	if h.err != nil {
		t.Errorf("meshd --demo exited with %v after SIGTERM; want exit 0", h.err)
	}
}

// TestFrozenAgentExpires: a SIGSTOPped agent keeps its TCP connection
// open, so only its missed heartbeats (3 × 200 ms) give it away: the call
// waiting on it fails with UNAVAILABLE well before the call's own timeout.
// Once continued it registers again; on SIGTERM it deregisters and exits 0.
func TestFrozenAgentExpires(t *testing.T) {
	h := startHub(t)
	agent := start(t, "meshctl", "agent", "run", "echo", "--hub", h.ws, "--id", "frozen-1")
	t.Cleanup(func() { _ = agent.cmd.Process.Signal(syscall.SIGCONT) }) // before its stop: a stopped process ignores SIGTERM
	waitMethods(t, h.ws, "echo.sleep")

	done := make(chan result, 1)
	ctx := t.Context()
	go func() {
		done <- runCtl(ctx, nil, "call", "echo.sleep", `{"ms":5000}`, "--hub", h.ws, "--timeout", "10s", "-o", "json")
	}()
	waitFor(t, "echo.sleep in flight", 3*time.Second, func() bool {
		list, _ := listAgents(t, h.ws)
		return len(list) == 1 && list[0].InFlight > 0
	})
	stopped := time.Now()
	if err := agent.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var r result
	select {
	case r = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("the call did not return within 15s")
	}
	want(t, r, 1, "UNAVAILABLE: ")
	since := r.end.Sub(stopped)
	t.Logf("the call on the frozen agent exited %v after SIGSTOP; %s", since.Round(time.Millisecond), strings.TrimSpace(r.stderr))
	if since > 2*time.Second {
		t.Errorf("the call on the frozen agent exited %v after SIGSTOP; want under 2s (heartbeat 200ms)", since)
	}
	if list, r := listAgents(t, h.ws); r.code != 0 || len(list) != 0 {
		t.Errorf("%v; want the frozen agent gone", r)
	}

	if err := agent.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	waitMethods(t, h.ws, "echo.echo")
	if r := meshctl(t, "call", "echo.echo", `"back"`, "--hub", h.ws, "-o", "json"); r.code != 0 || r.stdout != "\"back\"\n" {
		t.Errorf("%v; want the agent back after SIGCONT", r)
	}

	termed := time.Now()
	if err := agent.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-agent.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the agent still runs 5s after SIGTERM")
	}
	t.Logf("the agent exited %v after SIGTERM", agent.exited.Sub(termed).Round(time.Millisecond))
	if agent.err != nil {
		t.Errorf("the agent exited with %v after SIGTERM; want 0", agent.err)
	}
	if list, r := listAgents(t, h.ws); r.code != 0 || len(list) != 0 {
		t.Errorf("%v; want the agent deregistered", r)
	}
	want(t, meshctl(t, "call", "echo.echo", "[]", "--hub", h.ws), 1, "UNAVAILABLE: ")
}

// TestChaosAgentErrors: the codes of a failing agent reach meshctl's
// stderr and exit code, and --timeout bounds a slow call.
func TestChaosAgentErrors(t *testing.T) {
	t.Parallel()
	t.Run("injected failure", func(t *testing.T) {
		h := startHub(t)
		start(t, "meshctl", "agent", "run", "chaos", "--hub", h.ws, "--fail-rate", "1", "--fail-code", "OVERLOADED")
		waitMethods(t, h.ws, "chaos.echo")
		r := meshctl(t, "call", "chaos.echo", "{}", "--hub", h.ws, "-o", "json")
		want(t, r, 1, "OVERLOADED: ")
		if r.stdout != "" {
			t.Errorf("stdout %q; want nothing", r.stdout)
		}
		r = meshctl(t, "call", "chaos.echo", "{}", "--hub", h.ws, "-o", "pretty")
		if r.code != 1 || !strings.Contains(r.stderr, "Code: OVERLOADED (-32005)") || !strings.Contains(r.stderr, "Retryable: yes") {
			t.Errorf("%v; want the code, its number and Retryable: yes", r)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		h := startHub(t)
		start(t, "meshctl", "agent", "run", "chaos", "--hub", h.ws, "--latency", "5s")
		waitMethods(t, h.ws, "chaos.echo")
		r := meshctl(t, "call", "chaos.echo", "{}", "--hub", h.ws, "--timeout", "300ms")
		want(t, r, 1, "TIMEOUT: ")
		t.Logf("--timeout 300ms against a 5s agent: exit %d after %v", r.code, r.took().Round(time.Millisecond))
		if r.took() > 2*time.Second {
			t.Errorf("--timeout 300ms call took %v", r.took())
		}
	})
}

// TestAdminMetricsWithoutToken: with --auth-key, the gateway port's
// /metrics asks for an admin token, while --admin-addr (the scraper's
// port, on loopback) serves them without one, as its help says.
func TestAdminMetricsWithoutToken(t *testing.T) {
	t.Parallel()
	key := filepath.Join(t.TempDir(), "mesh.key")
	if r := meshctl(t, "token", "keygen", "--out", key); r.code != 0 {
		t.Fatalf("keygen: %v", r)
	}
	admin := freeAddr(t)
	h := startHub(t, "--auth-key", key, "--admin-addr", admin)
	client := &http.Client{Timeout: 2 * time.Second}
	if s := httpStatus(client, h.base+"/metrics"); s != http.StatusUnauthorized {
		t.Errorf("gateway /metrics without a token: %d; want 401", s)
	}
	res, err := client.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(string(body), "agentmesh_") {
		t.Errorf("admin /metrics without a token: %d, %d bytes; want 200 with agentmesh_ metrics", res.StatusCode, len(body))
	}
}
