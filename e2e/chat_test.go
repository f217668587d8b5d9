package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

type chatPage struct {
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	Total int `json:"total"`
}

// TestChatAgentProcessRestart: a chat agent process (meshctl agent run
// chat) is killed with SIGKILL in the middle of a streamed turn and
// started again on the same data directory. Its history is served again
// (first from the file, for the agent not yet re-created), whole: every
// message written before the kill, the interrupted turn's user message
// included, and the conversation goes on from it.
func TestChatAgentProcessRestart(t *testing.T) {
	t.Parallel()
	h := startHub(t)
	dir := t.TempDir()
	run := func() *proc {
		p := start(t, "meshctl", "agent", "run", "chat", "--hub", h.ws, "--data-dir", dir, "--chunk-delay", "2ms")
		waitMethods(t, h.ws, "chat.send", "chat.getAgentMessages")
		return p
	}
	agent := run()
	call := func(method, params string) result {
		return meshctl(t, "call", method, params, "--hub", h.ws, "--timeout", "10s", "-o", "json")
	}
	if r := call("chat.create", `{"agent_id":"p1","system_prompt":"Remember."}`); r.code != 0 {
		t.Fatal(r)
	}
	for _, m := range []string{"first", "/think second", "/long 40"} {
		if r := call("chat.send", fmt.Sprintf(`{"agentId":"p1","content":%q}`, m)); r.code != 0 {
			t.Fatal(r)
		}
	}
	before := call("chat.getAgentMessages", `{"agentId":"p1","limit":100}`)
	var b chatPage
	if before.code != 0 || json.Unmarshal([]byte(before.stdout), &b) != nil || b.Total != 6 {
		t.Fatalf("history before the kill: %v", before)
	}

	// A long turn streams; the agent is killed in its middle.
	go func() {
		_ = runCtl(t.Context(), nil, "call", "chat.send", `{"agentId":"p1","content":"/long 100000","request_id":"doomed"}`, "--hub", h.ws, "--timeout", "15s")
	}()
	waitFor(t, "the long turn streaming", 10*time.Second, func() bool {
		r := call("chat.get_context", `{"agentId":"p1"}`)
		return r.code == 0 && strings.Contains(r.stdout, `"busy":true`)
	})
	time.Sleep(100 * time.Millisecond)
	if err := agent.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-agent.done
	killedAt := time.Now()

	run()
	var after result
	waitFor(t, "history served by the restarted agent", 10*time.Second, func() bool {
		after = call("chat.getAgentMessages", `{"agentId":"p1","limit":100}`)
		return after.code == 0
	})
	var a chatPage
	if err := json.Unmarshal([]byte(after.stdout), &a); err != nil {
		t.Fatal(err)
	}
	// The six messages, then the interrupted turn's user message (its
	// answer was never finished, so never written).
	if a.Total != 7 || a.Messages[6].Role != "user" || !strings.Contains(string(a.Messages[6].Content), "/long 100000") {
		t.Fatalf("history after the restart: %s", after.stdout)
	}
	for i := range b.Messages {
		if string(a.Messages[i].Content) != string(b.Messages[i].Content) || a.Messages[i].Role != b.Messages[i].Role {
			t.Errorf("message %d changed across the restart: %s → %s", i, b.Messages[i].Content, a.Messages[i].Content)
		}
	}
	// Every line of the file is whole.
	data, err := os.ReadFile(filepath.Join(dir, "sessions", "p1.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
	for i, l := range lines {
		if !json.Valid([]byte(l)) {
			t.Errorf("session line %d is not JSON: %.80s", i, l)
		}
	}
	r := call("chat.create", `{"agent_id":"p1"}`)
	if r.code != 0 || !strings.Contains(r.stdout, `"resumed":true`) || !strings.Contains(r.stdout, `"message_count":7`) {
		t.Fatalf("re-create: %v", r)
	}
	r = call("chat.send", `{"agentId":"p1","content":"still there?"}`)
	if r.code != 0 || !strings.Contains(r.stdout, `(8 messages in context)`) {
		t.Errorf("send after the restart: %v", r)
	}
	if r := call("chat.get_context", `{"agentId":"p1"}`); !strings.Contains(r.stdout, `"system_prompt":"Remember."`) {
		t.Errorf("system prompt lost: %v", r)
	}
	t.Logf("history of %d messages (file: %d lines) back %v after the kill", a.Total, len(lines), time.Since(killedAt).Round(time.Millisecond))
}

// TestDemoChatCtrlC: meshd --demo runs a chat agent whose sessions go to
// --chat-data-dir; meshctl chat, a real process at a pipe, streams an
// answer, and Ctrl-C (SIGINT) cancels that answer without ending the
// command, which then takes the next line. The history keeps the
// cancelled answer as "aborted".
func TestDemoChatCtrlC(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	h := startHub(t, "--demo", "--chat-data-dir", dir)
	waitMethods(t, h.ws, "chat.send", "chat.events")

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "meshctl"), "chat", "talk", "--hub", h.ws)
	cmd.Env = env()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr syncBuf
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	if _, err := io.WriteString(stdin, "/long 100000\n"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the answer streaming", 10*time.Second, func() bool { return strings.Contains(stdout.String(), "word50 ") })
	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "(cancelled)", 10*time.Second, func() bool { return strings.Contains(stderr.String(), "(cancelled)") })
	select {
	case err := <-done:
		t.Fatalf("meshctl chat exited on Ctrl-C during an answer (%v); want it to take the next line\n%s", err, stderr.String())
	default:
	}
	if _, err := io.WriteString(stdin, "after\n"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the next answer", 10*time.Second, func() bool { return strings.Contains(stdout.String(), `You said: "after"`) })
	stdin.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("meshctl chat at end of input: %v\n%s", err, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("meshctl chat did not exit at the end of its input")
	}

	r := meshctl(t, "call", "chat.getAgentMessages", `{"agentId":"talk","limit":10}`, "--hub", h.ws, "-o", "json")
	var page struct {
		Messages []struct {
			Role       string `json:"role"`
			StopReason string `json:"stopReason"`
		} `json:"messages"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &page) != nil {
		t.Fatal(r)
	}
	var got []string
	for _, m := range page.Messages {
		got = append(got, strings.TrimSuffix(m.Role+" "+m.StopReason, " "))
	}
	if want := []string{"user", "assistant aborted", "user", "assistant end_turn"}; !slices.Equal(got, want) {
		t.Errorf("history %v; want %v", got, want)
	}
	if _, err := os.Stat(filepath.Join(dir, "sessions", "talk.jsonl")); err != nil {
		entries, _ := os.ReadDir(dir)
		t.Errorf("no session file for talk in --chat-data-dir (%v); it holds %v", err, entries)
	}
}
