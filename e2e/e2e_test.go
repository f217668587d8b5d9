package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "agentmesh-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, "go list -m:", err)
		os.Exit(1)
	}
	build := exec.Command("go", "build", "-o", dir, "./cmd/meshd", "./cmd/meshctl")
	build.Dir = strings.TrimSpace(string(root))
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build:", err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a background process whose output is kept.
type proc struct {
	cmd    *exec.Cmd
	stderr *syncBuf
	done   chan struct{}
	err    error
}

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

func start(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(filepath.Join(binDir, name), args...), stderr: &syncBuf{}, done: make(chan struct{})}
	p.cmd.Stderr = p.stderr
	p.cmd.Env = append(os.Environ(), "MESH_HUB=")
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
			return
		default:
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s stderr:\n%s", name, p.stderr.String())
		}
	})
	return p
}

type result struct {
	code           int
	stdout, stderr string
	took           time.Duration
}

func meshctl(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "meshctl"), args...)
	cmd.Env = append(os.Environ(), "MESH_HUB=")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	begin := time.Now()
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String(), took: time.Since(begin)}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("meshctl %v: %v", args, err)
	}
	return r
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

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

// startHub runs meshd on a free loopback port and waits for /readyz.
func startHub(t *testing.T, extra ...string) (p *proc, ws, base string) {
	t.Helper()
	addr := freeAddr(t)
	p = start(t, "meshd", append([]string{"--listen", addr, "--heartbeat", "200ms"}, extra...)...)
	base = "http://" + addr
	waitFor(t, "meshd ready", 10*time.Second, func() bool {
		res, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	})
	return p, "ws://" + addr + "/ws", base
}

func waitMethod(t *testing.T, ws, method string) {
	t.Helper()
	waitFor(t, method+" registered", 10*time.Second, func() bool {
		r := meshctl(t, "methods", "--hub", ws, "-o", "json")
		return r.code == 0 && strings.Contains(r.stdout, `"`+method+`"`)
	})
}

func TestCallThroughRealProcesses(t *testing.T) {
	_, ws, _ := startHub(t)
	agent := start(t, "meshctl", "agent", "run", "echo", "--hub", ws, "--id", "echo-1")
	waitMethod(t, ws, "echo.echo")

	r := meshctl(t, "call", "echo.echo", `{"hello":"mesh"}`, "--hub", ws, "-o", "json")
	if r.code != 0 || r.stdout != "{\"hello\":\"mesh\"}\n" {
		t.Fatalf("call echo.echo: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = meshctl(t, "call", "echo.echo", `{"hello":"mesh"}`, "--hub", ws, "-o", "pretty")
	if r.code != 0 || !strings.Contains(r.stdout, "Success") || !strings.Contains(r.stdout, "\"hello\": \"mesh\"") {
		t.Errorf("pretty call: exit %d, %q", r.code, r.stdout)
	}
	r = meshctl(t, "agents", "--hub", ws, "-o", "json")
	var agents []struct{ AgentID, Name, Status string }
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &agents) != nil || len(agents) != 1 || agents[0].Name != "echo" || agents[0].Status != "ready" {
		t.Errorf("agents: exit %d, %q", r.code, r.stdout)
	}
	if r := meshctl(t, "call", "nope.nope", "--hub", ws); r.code != 1 || !strings.HasPrefix(r.stderr, "METHOD_NOT_FOUND: ") {
		t.Errorf("unknown method: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := meshctl(t, "call", "echo.echo", "{bad", "--hub", ws); r.code != 2 {
		t.Errorf("bad params: exit %d; want 2", r.code)
	}
	if r := meshctl(t, "call", "echo.echo", "--hub", "ws://127.0.0.1:1/ws"); r.code != 3 || !strings.HasPrefix(r.stderr, "UNAVAILABLE: ") {
		t.Errorf("unreachable hub: exit %d, stderr %q; want 3", r.code, r.stderr)
	}

	// SIGKILL the agent: the next call fails with a coded error within a
	// second, not at its timeout.
	if err := agent.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	<-agent.done
	r = meshctl(t, "call", "echo.echo", `1`, "--hub", ws, "--timeout", "10s")
	since := time.Since(killed)
	if r.code != 1 || !strings.HasPrefix(r.stderr, "UNAVAILABLE: ") {
		t.Errorf("call after SIGKILL: exit %d, stderr %q; want UNAVAILABLE", r.code, r.stderr)
	}
	t.Logf("call after SIGKILL answered %v after the kill (the call itself took %v)", since, r.took)
	if since > time.Second {
		t.Errorf("call after SIGKILL answered %v after the kill; want under 1s", since)
	}
}

func TestInFlightCallFailsFastWhenAgentDies(t *testing.T) {
	_, ws, _ := startHub(t)
	agent := start(t, "meshctl", "agent", "run", "chaos", "--hub", ws, "--latency", "5s")
	waitMethod(t, ws, "chaos.echo")
	type out struct {
		r   result
		end time.Time
	}
	done := make(chan out, 1)
	go func() {
		r := meshctl(t, "call", "chaos.echo", "1", "--hub", ws, "--timeout", "10s")
		done <- out{r, time.Now()}
	}()
	time.Sleep(300 * time.Millisecond)
	killed := time.Now()
	_ = agent.cmd.Process.Kill()
	o := <-done
	if o.r.code != 1 || !strings.HasPrefix(o.r.stderr, "UNAVAILABLE: ") {
		t.Errorf("in-flight call: exit %d, stderr %q; want UNAVAILABLE", o.r.code, o.r.stderr)
	}
	if d := o.end.Sub(killed); d > time.Second {
		t.Errorf("in-flight call answered %v after the kill; want under 1s", d)
	}
}

func TestDemoHub(t *testing.T) {
	_, ws, base := startHub(t, "--demo")
	waitMethod(t, ws, "memory.get")
	if r := meshctl(t, "call", "memory.put", `{"key":"cat","value":"meow"}`, "--hub", ws); r.code != 0 {
		t.Fatalf("memory.put: exit %d %s", r.code, r.stderr)
	}
	if r := meshctl(t, "call", "memory.get", `{"key":"cat"}`, "--hub", base+"/rpc", "-o", "json"); r.code != 0 || !strings.Contains(r.stdout, `"value":"meow"`) {
		t.Errorf("memory.get over HTTP: exit %d, %q", r.code, r.stdout)
	}
	res, err := http.Post(base+"/rpc", "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"echo.echo","params":{"via":"curl"}}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if string(body) != `{"jsonrpc":"2.0","result":{"via":"curl"},"id":1}` {
		t.Errorf("POST /rpc = %s", body)
	}
}

func TestGracefulShutdown(t *testing.T) {
	hub, ws, _ := startHub(t, "--demo", "--drain-timeout", "5s")
	waitMethod(t, ws, "echo.sleep")
	// A call in flight when SIGTERM arrives still completes.
	done := make(chan result, 1)
	go func() { done <- meshctl(t, "call", "echo.sleep", `{"ms":500}`, "--hub", ws, "--timeout", "10s") }()
	time.Sleep(150 * time.Millisecond)
	_ = hub.cmd.Process.Signal(syscall.SIGTERM)
	if r := <-done; r.code != 0 {
		t.Errorf("call in flight during SIGTERM: exit %d, %s", r.code, r.stderr)
	}
	select {
	case <-hub.done:
		if hub.err != nil {
			t.Errorf("meshd exited with %v after SIGTERM; want 0", hub.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("meshd did not exit after SIGTERM")
	}
	// Its log is JSON lines.
	sc := bufio.NewScanner(strings.NewReader(hub.stderr.String()))
	lines := 0
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Errorf("log line is not JSON: %q", sc.Text())
		}
		lines++
	}
	if lines == 0 {
		t.Error("meshd logged nothing")
	}
}
