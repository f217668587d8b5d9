package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/cli"
	"github.com/agentmesh/agentmesh/internal/freeport"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
)

type result struct {
	code           int
	stdout, stderr string
}

func meshctl(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	code := cli.Run(ctx, cli.NewMeshctl(strings.NewReader(stdin), &out, &errb), args, &errb)
	return result{code, out.String(), errb.String()}
}

func TestMeshctlCall(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	m.RunAgent(t, agents.NewEcho(agents.WithID("echo-1")))
	hub := "--hub=" + m.WS
	cases := []struct {
		name       string
		stdin      string
		args       []string
		code       int
		stdout     string // exact, when set
		stdoutHas  string
		stderrHead string
	}{
		{name: "json", args: []string{"call", "echo.echo", `{"hello":"mesh"}`, hub, "-o", "json"}, stdout: "{\"hello\":\"mesh\"}\n"},
		{name: "over http", args: []string{"call", "echo.echo", `[1,2]`, "--hub", m.HTTP + "/rpc", "-o", "json"}, stdout: "[1,2]\n"},
		{name: "params from stdin", stdin: `{"from":"stdin"}`, args: []string{"call", "echo.echo", "-", hub, "-o", "json"}, stdout: "{\"from\":\"stdin\"}\n"},
		{name: "pretty", args: []string{"call", "echo.echo", `{"a":1}`, hub, "-o", "pretty"}, stdoutHas: "✅ Success (", code: 0},
		{name: "no params", args: []string{"call", "mesh.ping", hub, "-o", "json"}, stdoutHas: `"pong":true`},
		{name: "unknown method", args: []string{"call", "nope.nope", hub}, code: cli.ExitError, stderrHead: "METHOD_NOT_FOUND: "},
		{name: "unknown method pretty", args: []string{"call", "nope.nope", hub, "-o", "pretty"}, code: cli.ExitError, stderrHead: "❌ Error: "},
		{name: "timeout", args: []string{"call", "echo.sleep", `{"ms":2000}`, hub, "--timeout", "100ms"}, code: cli.ExitError, stderrHead: "TIMEOUT: "},
		{name: "bad params", args: []string{"call", "echo.echo", `{nope`, hub}, code: cli.ExitUsage, stderrHead: "error: params are not valid JSON"},
		{name: "bad output", args: []string{"call", "echo.echo", hub, "-o", "yaml"}, code: cli.ExitUsage},
		{name: "unreachable ws", args: []string{"call", "echo.echo", "--hub", "ws://127.0.0.1:1/ws"}, code: cli.ExitUnreachable, stderrHead: "UNAVAILABLE: cannot reach hub"},
		{name: "unreachable http", args: []string{"call", "echo.echo", "--hub", "http://127.0.0.1:1/rpc"}, code: cli.ExitUnreachable, stderrHead: "UNAVAILABLE: cannot reach hub"},
		{name: "bad hub url", args: []string{"call", "echo.echo", "--hub", "ftp://x"}, code: cli.ExitUsage},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := meshctl(t, tc.stdin, tc.args...)
			if r.code != tc.code {
				t.Fatalf("meshctl %v: exit %d; want %d (stdout %q, stderr %q)", tc.args, r.code, tc.code, r.stdout, r.stderr)
			}
			if tc.stdout != "" && r.stdout != tc.stdout {
				t.Errorf("stdout = %q; want %q", r.stdout, tc.stdout)
			}
			if tc.stdoutHas != "" && !strings.Contains(r.stdout, tc.stdoutHas) {
				t.Errorf("stdout = %q; want it to contain %q", r.stdout, tc.stdoutHas)
			}
			if tc.stderrHead != "" && !strings.HasPrefix(r.stderr, tc.stderrHead) {
				t.Errorf("stderr = %q; want it to start with %q", r.stderr, tc.stderrHead)
			}
		})
	}
}

func TestMeshctlAgentsAndMethods(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	m.RunAgent(t, agents.NewEcho(agents.WithID("echo-1")))
	r := meshctl(t, "", "agents", "--hub", m.WS, "-o", "json")
	var list []control.AgentInfo
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &list) != nil || len(list) != 1 || list[0].AgentID != "echo-1" {
		t.Errorf("agents -o json: exit %d, %q", r.code, r.stdout)
	}
	r = meshctl(t, "", "agents", "--hub", m.WS, "-o", "table")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "AGENT ID") || !strings.Contains(r.stdout, "echo-1") || !strings.Contains(r.stdout, "ready") {
		t.Errorf("agents -o table: exit %d, %q", r.code, r.stdout)
	}
	r = meshctl(t, "", "methods", "--hub", m.WS, "-o", "table")
	if r.code != 0 || !strings.Contains(r.stdout, "echo.echo") || !strings.Contains(r.stdout, "1/1") {
		t.Errorf("methods -o table: exit %d, %q", r.code, r.stdout)
	}
	r = meshctl(t, "", "methods", "--hub", m.WS, "-o", "json")
	var methods []control.MethodInfo
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &methods) != nil || len(methods) != 3 {
		t.Errorf("methods -o json: exit %d, %q", r.code, r.stdout)
	}
}

func TestMeshctlAgentRun(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan int, 1)
	var errb bytes.Buffer
	go func() {
		done <- cli.Run(ctx, cli.NewMeshctl(strings.NewReader(""), &bytes.Buffer{}, &errb),
			[]string{"agent", "run", "chaos", "--hub", m.WS, "--id", "chaos-cli", "--fail-rate", "1", "--fail-code", "OVERLOADED"}, &errb)
	}()
	meshtest.WaitFor(t, 5*time.Second, func() bool { return m.Hub.Registry().Snapshot().Instance("chaos-cli") != nil })
	r := meshctl(t, "", "call", "chaos.echo", "1", "--hub", m.WS)
	if r.code != cli.ExitError || !strings.HasPrefix(r.stderr, "OVERLOADED: ") {
		t.Errorf("call to a chaos agent with --fail-rate 1: exit %d, stderr %q", r.code, r.stderr)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("agent run exited %d after cancel; want 0 (stderr %s)", code, errb.String())
	}
	if m.Hub.Registry().Snapshot().Instance("chaos-cli") != nil {
		t.Error("the agent did not deregister on shutdown")
	}
	for _, args := range [][]string{
		{"agent", "run", "nope"},
		{"agent", "run", "chaos", "--fail-code", "NOPE"},
		{"agent", "run", "chaos", "--fail-rate", "2"},
	} {
		if r := meshctl(t, "", args...); r.code != cli.ExitUsage {
			t.Errorf("meshctl %v: exit %d; want %d", args, r.code, cli.ExitUsage)
		}
	}
}

// TestMeshctlAgentRunInstances: --instances 3 runs three agents in one
// process, each registered under its own id, all deregistered on exit.
func TestMeshctlAgentRunInstances(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan int, 1)
	var errb bytes.Buffer
	go func() {
		done <- cli.Run(ctx, cli.NewMeshctl(strings.NewReader(""), &bytes.Buffer{}, &errb),
			[]string{"agent", "run", "echo", "--hub", m.WS, "--id", "multi", "--instances", "3"}, &errb)
	}()
	ids := []string{"multi-0", "multi-1", "multi-2"}
	meshtest.WaitFor(t, 5*time.Second, func() bool {
		snap := m.Hub.Registry().Snapshot()
		for _, id := range ids {
			if snap.Instance(id) == nil {
				return false
			}
		}
		return len(snap.Instances()) == 3
	})
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("agent run --instances 3 exited %d after cancel; want 0 (stderr %s)", code, errb.String())
	}
	if n := len(m.Hub.Registry().Snapshot().Instances()); n != 0 {
		t.Errorf("%d instances still registered after shutdown; want 0", n)
	}
	if r := meshctl(t, "", "agent", "run", "echo", "--instances", "0"); r.code != cli.ExitUsage {
		t.Errorf("--instances 0: exit %d; want %d", r.code, cli.ExitUsage)
	}
}

func TestMeshdDemo(t *testing.T) {
	addr := freeport.Addr(t)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan int, 1)
	var errb bytes.Buffer
	go func() {
		done <- cli.Run(ctx, cli.NewMeshd(&bytes.Buffer{}, &errb), []string{"--listen", addr, "--demo", "--log-level", "warn"}, &errb)
	}()
	meshtest.WaitFor(t, 5*time.Second, func() bool {
		r := meshctl(t, "", "methods", "--hub", "ws://"+addr+"/ws", "-o", "json")
		return r.code == 0 && strings.Contains(r.stdout, "memory.get") && strings.Contains(r.stdout, "echo.echo")
	})
	r := meshctl(t, "", "call", "memory.put", `{"key":"k","value":42}`, "--hub", "ws://"+addr+"/ws", "-o", "json")
	if r.code != 0 {
		t.Errorf("memory.put: exit %d %s", r.code, r.stderr)
	}
	res, err := http.Post("http://"+addr+"/rpc", "application/json",
		strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"memory.get","params":{"key":"k"}}`))
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Result struct{ Value int } `json:"result"`
	}
	_ = json.NewDecoder(res.Body).Decode(&body)
	res.Body.Close()
	if body.Result.Value != 42 {
		t.Errorf("memory.get over /rpc = %+v; want 42", body)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("meshd exited %d; want 0 (stderr %s)", code, errb.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("meshd did not stop")
	}
	if r := cli.Run(t.Context(), cli.NewMeshd(&bytes.Buffer{}, &errb), []string{"--log-level", "loud"}, &errb); r != cli.ExitUsage {
		t.Errorf("meshd --log-level loud: exit %d; want %d", r, cli.ExitUsage)
	}
}

func TestMeshctlBench(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	m.RunAgent(t, agents.NewEcho())
	r := meshctl(t, "", "bench", "echo.echo", `{"a":1}`, "--hub", m.WS, "-c", "4", "-n", "500", "--connections", "2", "-o", "json")
	var rep struct {
		Count     int64 `json:"count"`
		Success   int64 `json:"success"`
		Latencies struct {
			P99 float64 `json:"99th"`
		} `json:"latencies"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rep) != nil || rep.Count != 500 || rep.Success != 500 || rep.Latencies.P99 <= 0 {
		t.Fatalf("bench -o json: exit %d, %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	old := filepath.Join(t.TempDir(), "old.json")
	if err := os.WriteFile(old, []byte(r.stdout), 0o600); err != nil {
		t.Fatal(err)
	}
	r = meshctl(t, "", "bench", "echo.echo", "--hub", m.WS, "-n", "200", "--compare", old, "--fail-on", "p99>1ns")
	if r.code != cli.ExitSLO || !strings.Contains(r.stderr, "SLO broken: p99>1ns") || !strings.Contains(r.stdout, "Compared with the earlier run") {
		t.Errorf("bench --fail-on: exit %d, stdout %q, stderr %q; want 99", r.code, r.stdout, r.stderr)
	}
	r = meshctl(t, "", "bench", "echo.echo", "--hub", m.WS, "-d", "300ms", "--rps", "200", "--fail-on", "errors>0")
	if r.code != 0 || !strings.Contains(r.stdout, "open loop") {
		t.Errorf("open-loop bench: exit %d, %q", r.code, r.stdout)
	}
	if r := meshctl(t, "", "bench", "echo.echo", "--hub", "ws://127.0.0.1:1/ws"); r.code != cli.ExitUnreachable {
		t.Errorf("bench against no hub: exit %d; want 3", r.code)
	}
	if r := meshctl(t, "", "bench", "echo.echo", "--hub", m.WS, "--fail-on", "speed>9"); r.code != cli.ExitUsage {
		t.Errorf("bad --fail-on: exit %d; want 2", r.code)
	}
}
