package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/cli"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
)

// runChatAgent runs `meshctl agent run chat` until the returned stop.
func runChatAgent(t *testing.T, hub, dir string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var errb bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(ctx, cli.NewMeshctl(strings.NewReader(""), &bytes.Buffer{}, &errb),
			[]string{"agent", "run", "chat", "--hub", hub, "--data-dir", dir, "--chunk-delay", "1ms", "--log-level", "warn"}, &errb)
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if code := <-done; code != 0 {
				t.Errorf("meshctl agent run chat exited %d: %s", code, errb.String())
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func waitChat(t *testing.T, m *meshtest.Mesh) {
	t.Helper()
	c := m.Client(t)
	meshtest.WaitFor(t, 10*time.Second, func() bool {
		var methods []control.MethodInfo
		if c.Call(t.Context(), "mesh.methods", nil, &methods) != nil {
			return false
		}
		for _, mi := range methods {
			if mi.Method == "chat.send" && mi.Ready > 0 {
				return true
			}
		}
		return false
	})
}

// TestMeshctlChat: meshctl agent run chat serves the pool; meshctl chat
// streams answers, tool calls included; after the agent restarts on the
// same data directory the conversation resumes with its history.
func TestMeshctlChat(t *testing.T) {
	t.Setenv("OPENAI_MODEL", "") // --model "" falls back to it
	m := meshtest.Start(t, hub.Config{})
	m.RunAgent(t, agents.NewEcho())
	dir := t.TempDir()
	stop := runChatAgent(t, m.WS, dir)
	waitChat(t, m)
	hub := "--hub=" + m.WS

	r := meshctl(t, "hello\n\n/call echo.echo {\"x\":1}\n", "chat", "demo", hub)
	if r.code != 0 {
		t.Fatalf("meshctl chat: exit %d\nstdout %s\nstderr %s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{
		`You said: "hello" (1 messages in context)` + "\n",
		`Calling echo.echo.` + "\n",
		`  [tool mesh_call {"method":"echo.echo","params":{"x":1}}]` + "\n",
		`  [→ {"x":1}]` + "\n",
		`Tool mesh_call returned: {"x":1}` + "\n",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, r.stdout)
		}
	}
	if !strings.Contains(r.stderr, "chat agent demo (new)") {
		t.Errorf("stderr = %q", r.stderr)
	}
	before := meshctl(t, "", "call", "chat.getAgentMessages", `{"agentId":"demo","limit":100}`, hub, "-o", "json")
	var page struct {
		Messages []map[string]any
		Total    int
	}
	if err := json.Unmarshal([]byte(before.stdout), &page); err != nil || page.Total != 6 {
		t.Fatalf("history = %s (%v); want 6 messages", before.stdout, err)
	}

	// Restart the agent on the same directory: same history, and the
	// conversation goes on from it.
	stop()
	runChatAgent(t, m.WS, dir)
	waitChat(t, m)
	after := meshctl(t, "", "call", "chat.getAgentMessages", `{"agentId":"demo","limit":100}`, hub, "-o", "json")
	if after.stdout != before.stdout {
		t.Fatalf("history after restart differs:\n%s\n%s", before.stdout, after.stdout)
	}
	r = meshctl(t, "again\n", "chat", "demo", hub)
	if r.code != 0 || !strings.Contains(r.stderr, "chat agent demo (resumed, 6 messages)") || !strings.Contains(r.stdout, `You said: "again" (7 messages in context)`) {
		t.Errorf("chat after restart: exit %d\nstdout %s\nstderr %s", r.code, r.stdout, r.stderr)
	}
	// A provider error is reported, not fatal; an unknown provider is a usage error.
	if r := meshctl(t, "", "agent", "run", "chat", "--provider", "nope", hub); r.code != cli.ExitUsage {
		t.Errorf("--provider nope: exit %d, %s", r.code, r.stderr)
	}
	if r := meshctl(t, "", "agent", "run", "chat", "--provider", "openai", "--model", "", hub); r.code != cli.ExitUsage || !strings.Contains(r.stderr, "needs a model") {
		t.Errorf("--provider openai without a model: exit %d, %s", r.code, r.stderr)
	}
}

// TestMeshctlChatSharedAgent: two meshctl chat sessions on one agent at
// once each print their own answer only: a long answer streaming to one
// client never shows in the other's output, nor ends its wait early.
func TestMeshctlChatSharedAgent(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	runChatAgent(t, m.WS, t.TempDir())
	waitChat(t, m)
	hub := "--hub=" + m.WS
	if r := meshctl(t, "", "call", "chat.create", `{"agent_id":"shared"}`, hub); r.code != 0 {
		t.Fatal(r)
	}
	long := make(chan result, 1)
	go func() { long <- meshctl(t, "/long 600\n", "chat", "shared", hub) }()
	c := m.Client(t)
	meshtest.WaitFor(t, 10*time.Second, func() bool {
		var ctxInfo struct{ Busy bool }
		return c.Call(t.Context(), "chat.get_context", map[string]any{"agentId": "shared"}, &ctxInfo) == nil && ctxInfo.Busy
	})
	short := meshctl(t, "hello\n", "chat", "shared", hub)
	l := <-long
	if l.code != 0 || short.code != 0 {
		t.Fatalf("exit codes %d, %d\n%s\n%s", l.code, short.code, l.stderr, short.stderr)
	}
	if strings.Contains(short.stdout, "word") || !strings.HasPrefix(short.stdout, `You said: "hello"`) {
		t.Errorf("the short session printed %q; want its own answer only", short.stdout)
	}
	if strings.Contains(l.stdout, "You said") || !strings.Contains(l.stdout, "word600") {
		t.Errorf("the long session printed %d bytes ending %q; want its 600 words only", len(l.stdout), l.stdout[max(0, len(l.stdout)-80):])
	}
}
