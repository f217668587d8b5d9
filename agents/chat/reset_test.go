package chat

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
)

var asideRE = regexp.MustCompile(`^r1\.jsonl\.reset-\d+$`)

// TestReset: a reset empties the conversation (history, summary,
// compactions, tokens), moves the session file aside intact, keeps the
// id, creation time and system prompt; the agent's events go on with the
// next send, which runs on the empty history; a new runtime on the same
// directory loads the new conversation, not the old one.
func TestReset(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{DataDir: dir, MaxMessages: 4, KeepMessages: 2}
	rt := newRT(t, cfg, &Scripted{ChunkSize: 16}, NewTools(lookupTool()))
	a := mustCreate(t, rt, "r1", "Be brief.")
	created := a.Context().CreatedAt
	for _, m := range []string{"one", `/tool lookup {"key":"k"}`, "three", "four"} {
		if _, err := a.Send(t.Context(), m, ""); err != nil {
			t.Fatal(err)
		}
	}
	before := a.Context()
	if before.Compactions == 0 || before.HistoryCount != 10 || before.Tokens.Messages == 0 {
		t.Fatalf("before reset: %+v; want compactions, 10 messages", before)
	}
	oldFile, err := os.ReadFile(sessionPath(dir, "r1"))
	if err != nil {
		t.Fatal(err)
	}
	rec := record(t, a)
	lastSeq := a.events.tail().NextSeq

	res, err := a.Reset(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if res.AgentID != "r1" || res.Removed != 10 || res.Cancelled != 0 || !asideRE.MatchString(res.MovedTo) {
		t.Fatalf("reset = %+v; want r1, 10 removed, 0 cancelled, moved to r1.jsonl.reset-MS", res)
	}
	// The old file is aside, byte for byte.
	aside, err := os.ReadFile(filepath.Join(dir, "sessions", res.MovedTo))
	if err != nil || string(aside) != string(oldFile) {
		t.Fatalf("file aside (%v): %d bytes, want the old file's %d", err, len(aside), len(oldFile))
	}
	// The new file holds only the session line, naming the old one.
	st, err := readSession(dir, "r1")
	if err != nil || len(st.history) != 0 || st.compactions != 0 || st.systemPrompt != "Be brief." || st.agentID != "r1" {
		t.Fatalf("new session file: %+v, %v", st, err)
	}
	if b, _ := os.ReadFile(sessionPath(dir, "r1")); !strings.Contains(string(b), `"resetFrom":"`+res.MovedTo+`"`) || strings.Count(string(b), "\n") != 1 {
		t.Errorf("new session file = %s; want one session line with resetFrom", b)
	}
	after := a.Context()
	if after.MessageCount != 0 || after.HistoryCount != 0 || after.Compactions != 0 || after.Summary != "" ||
		after.SystemPrompt != "Be brief." || after.CreatedAt != created || after.Busy {
		t.Errorf("context after reset = %+v", after)
	}
	if tk := a.Tokens(); tk.Messages != 0 || tk.Total != tk.System+tk.Tools || tk.Available != tk.Budget-tk.Total {
		t.Errorf("tokens after reset = %+v; want no message tokens", tk)
	}
	if page, err := rt.Messages("r1", 0, 100); err != nil || page.Total != 0 || len(page.Messages) != 0 {
		t.Errorf("history after reset = %+v, %v; want empty", page, err)
	}
	if l := rt.List(); len(l) != 1 || l[0].MessageCount != 0 {
		t.Errorf("list after reset = %+v", l)
	}

	// The next send runs on the empty history; its events follow the old ones.
	r, err := a.Send(t.Context(), "hello again", "after-reset")
	if err != nil || r.Content != `You said: "hello again" (1 messages in context)` {
		t.Fatalf("send after reset = %+v, %v", r, err)
	}
	evs := rec.events()
	if len(evs) == 0 || evs[0].Seq != lastSeq+1 || evs[0].RequestID != "after-reset" {
		t.Fatalf("events after reset: %d, first %+v; want seq %d of request after-reset", len(evs), evs, lastSeq+1)
	}
	checkMessageStream(t, evs, "r1")
	if page, _ := rt.Messages("r1", 0, 100); page.Total != 2 || TextOf(page.Messages[0].Content) != "hello again" {
		t.Errorf("history after reset and a send = %+v", page)
	}

	// A runtime on the same directory resumes the new conversation.
	rt.Close(t.Context())
	rt2 := newRT(t, cfg, &Scripted{}, nil)
	cr, err := rt2.Create("r1", "")
	if err != nil || !cr.Resumed || cr.MessageCount != 2 || !sameMs(t, cr.CreatedAt, created) {
		t.Fatalf("resume after reset = %+v, %v", cr, err)
	}
	if c := rt2.Get("r1").Context(); c.Compactions != 0 || c.SystemPrompt != "Be brief." {
		t.Errorf("resumed context = %+v", c)
	}
	// A second reset keeps the first aside file and makes another.
	res2, err := rt2.Get("r1").Reset(t.Context())
	if err != nil || res2.Removed != 2 || res2.MovedTo == res.MovedTo {
		t.Fatalf("second reset = %+v, %v", res2, err)
	}
	for _, f := range []string{res.MovedTo, res2.MovedTo} {
		if _, err := os.Stat(filepath.Join(dir, "sessions", f)); err != nil {
			t.Errorf("aside file %s: %v", f, err)
		}
	}
}

// TestResetAsideNeverOverwrites: two resets within the same millisecond
// get two names; nothing is overwritten.
func TestResetAsideNeverOverwrites(t *testing.T) {
	dir := t.TempDir()
	f, _, err := openSession(dir, "same")
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	now := time.UnixMilli(1700000000000)
	var names []string
	for i := range 3 {
		if err := f.append(entry{Type: entrySession, AgentID: "same", CreatedAt: int64(i + 1)}); err != nil {
			t.Fatal(err)
		}
		p, err := f.moveAside(dir, "same", now, entry{Type: entrySession, AgentID: "same"})
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, filepath.Base(p))
	}
	want := []string{"same.jsonl.reset-1700000000000", "same.jsonl.reset-1700000000000-1", "same.jsonl.reset-1700000000000-2"}
	if strings.Join(names, " ") != strings.Join(want, " ") {
		t.Fatalf("aside names %v; want %v", names, want)
	}
	for i, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, "sessions", n))
		if err != nil || !strings.Contains(string(b), `"createdAt":`+strconv.Itoa(i+1)) {
			t.Errorf("aside %s = %s, %v; want the file of round %d", n, b, err, i+1)
		}
	}
}

// TestResetLeavesNoGap: a stray .new file of a reset that crashed is
// replaced; after a reset the session's name holds the new file, the old
// one is aside, nothing else is left; and the session's name never went
// missing (the old file is linked aside before the new one is renamed
// over it), which a watcher polling the name checks throughout.
func TestResetLeavesNoGap(t *testing.T) {
	dir := t.TempDir()
	f, _, err := openSession(dir, "gap")
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	p := sessionPath(dir, "gap")
	if err := os.WriteFile(p+".new", []byte("half a line of a crashed reset"), 0o600); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	missing := make(chan int, 1)
	go func() {
		n := 0
		for {
			select {
			case <-stop:
				missing <- n
				return
			default:
			}
			if _, err := os.Lstat(p); err != nil {
				n++
			}
		}
	}()
	for i := range 50 {
		if err := f.append(entry{Type: entrySession, AgentID: "gap", CreatedAt: int64(i + 1)}); err != nil {
			t.Fatal(err)
		}
		if _, err := f.moveAside(dir, "gap", time.UnixMilli(1700000000000), entry{Type: entrySession, AgentID: "gap"}); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	if n := <-missing; n != 0 {
		t.Errorf("the session's file was missing %d times while it was reset; want never", n)
	}
	if _, err := os.Lstat(p + ".new"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a .new file is left: %v", err)
	}
	entries, _ := os.ReadDir(filepath.Join(dir, "sessions"))
	if len(entries) != 51 { // gap.jsonl and 50 aside
		t.Errorf("%d files in the sessions directory; want 51", len(entries))
	}
}

// TestResetDuringTurn: a reset while a turn runs and another send waits
// cancels both (CANCELLED), waits for the turn to end, and leaves an
// empty history; the cancelled turn's partial answer is in the file
// aside; the next send works.
func TestResetDuringTurn(t *testing.T) {
	dir := t.TempDir()
	rt := newRT(t, Config{DataDir: dir}, &Scripted{ChunkSize: 1, Delay: 2 * time.Millisecond}, nil)
	a := mustCreate(t, rt, "r1", "")
	errc := make(chan error, 2)
	go func() { _, err := a.Send(context.Background(), "/long 5000", "running"); errc <- err }()
	waitFor(t, func() bool { return a.Context().Busy })
	go func() { _, err := a.Send(context.Background(), "queued", "queued"); errc <- err }()
	waitFor(t, func() bool { return a.waiting.Load() == 1 })
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	res, err := a.Reset(ctx) // without cancelling, the turn would run for a minute
	if err != nil {
		t.Fatal(err)
	}
	if res.Cancelled != 2 || res.Removed != 2 {
		t.Errorf("reset = %+v; want 2 sends cancelled, 2 messages removed (the user's and the partial answer)", res)
	}
	for range 2 {
		select {
		case err := <-errc:
			if envelope.CodeOf(err) != envelope.CodeCancelled {
				t.Errorf("send during reset: %v; want CANCELLED", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a send outlived the reset")
		}
	}
	if page, _ := rt.Messages("r1", 0, 10); page.Total != 0 {
		t.Errorf("history after a reset during a turn = %+v; want empty", page)
	}
	st := parseFile(t, filepath.Join(dir, "sessions", res.MovedTo))
	if len(st.history) != 2 || st.history[1].StopReason != StopAborted {
		t.Errorf("file aside holds %+v; want the user's message and the aborted answer", st.history)
	}
	if r, err := a.Send(t.Context(), "fresh", ""); err != nil || r.Content != `You said: "fresh" (1 messages in context)` {
		t.Errorf("send after reset = %+v, %v", r, err)
	}
}

// sameMs compares two RFC 3339 times to the millisecond (what a session
// file keeps).
func sameMs(t *testing.T, a, b string) bool {
	t.Helper()
	ta, err1 := time.Parse(time.RFC3339Nano, a)
	tb, err2 := time.Parse(time.RFC3339Nano, b)
	if err1 != nil || err2 != nil {
		t.Fatalf("times %q %q: %v %v", a, b, err1, err2)
	}
	return ta.UnixMilli() == tb.UnixMilli()
}

// TestSendInConversation: a send naming the conversation before a reset
// is CANCELLED without running (no event, nothing in the history); one
// naming the current conversation runs.
func TestSendInConversation(t *testing.T) {
	rt := newRT(t, Config{}, &Scripted{}, nil)
	a := mustCreate(t, rt, "c1", "")
	conv := a.Context().Conversation
	if _, err := a.SendIn(t.Context(), conv, "first", ""); err != nil || conv != 0 {
		t.Fatalf("send in conversation %d: %v", conv, err)
	}
	if _, err := a.Reset(t.Context()); err != nil {
		t.Fatal(err)
	}
	if c := a.Context().Conversation; c != conv+1 {
		t.Fatalf("conversation after reset = %d; want %d", c, conv+1)
	}
	rec := record(t, a)
	if _, err := a.SendIn(t.Context(), conv, "stale", "stale"); envelope.CodeOf(err) != envelope.CodeCancelled || !strings.Contains(err.Error(), "reset") {
		t.Errorf("send to the conversation before the reset: %v; want CANCELLED", err)
	}
	if page, _ := rt.Messages("c1", 0, 10); page.Total != 0 || len(rec.events()) != 0 {
		t.Errorf("a refused send left %d messages, %d events", page.Total, len(rec.events()))
	}
	if r, err := a.SendIn(t.Context(), conv+1, "fresh", ""); err != nil || r.Content != `You said: "fresh" (1 messages in context)` {
		t.Errorf("send to the current conversation: %+v, %v", r, err)
	}
}

func parseFile(t *testing.T, p string) *state {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return parse(b)
}

// stubborn is a provider whose turn ignores cancellation until released.
type stubborn struct {
	started, release chan struct{}
}

func (s *stubborn) Name() string { return "stubborn" }

func (s *stubborn) Stream(ctx context.Context, req *Request, update func(Content)) (*Message, error) {
	close(s.started)
	<-s.release
	return &Message{Role: RoleAssistant, Content: Content{Text("late")}, StopReason: StopEndTurn}, nil
}

// TestResetGivesUp: a turn that does not end when cancelled holds the
// reset up only until the reset's ctx ends: CANCELLED, nothing changed.
func TestResetGivesUp(t *testing.T) {
	dir := t.TempDir()
	p := &stubborn{started: make(chan struct{}), release: make(chan struct{})}
	rt := newRT(t, Config{DataDir: dir}, p, nil)
	a := mustCreate(t, rt, "r1", "")
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = a.Send(context.Background(), "hi", "")
	}()
	<-p.started
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	errc := make(chan error, 1)
	go func() { _, err := a.Reset(ctx); errc <- err }()
	select {
	case err := <-errc:
		if envelope.CodeOf(err) != envelope.CodeCancelled {
			t.Errorf("reset held up by a stubborn turn: %v; want CANCELLED", err)
		}
		close(p.release)
	case <-time.After(5 * time.Second):
		t.Error("reset did not give up when its ctx ended")
		close(p.release)
		<-errc
	}
	<-done
	if page, _ := rt.Messages("r1", 0, 10); page.Total != 2 {
		t.Errorf("history after a reset that gave up = %d messages; want the turn's 2", page.Total)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "sessions", "r1.jsonl.reset-*")); len(m) != 0 {
		t.Errorf("files aside after a reset that gave up: %v", m)
	}
}

// TestResetOverTheMesh: chat.reset through a hub, its errors, its schema.
func TestResetOverTheMesh(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	rt := NewRuntime(Config{DataDir: t.TempDir()}, &Scripted{}, nil)
	t.Cleanup(func() { rt.Close(context.Background()) })
	m.RunAgent(t, NewService(rt))
	c := m.Client(t)
	ctx := t.Context()
	if err := c.Call(ctx, "chat.create", map[string]any{"agent_id": "m1"}, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Call(ctx, "chat.send", map[string]any{"agentId": "m1", "content": "hi"}, nil); err != nil {
		t.Fatal(err)
	}
	var res ResetResult
	if err := c.Call(ctx, "chat.reset", map[string]any{"agent_id": "m1"}, &res); err != nil || res.Removed != 2 || !strings.HasPrefix(res.MovedTo, "m1.jsonl.reset-") {
		t.Fatalf("chat.reset = %+v, %v", res, err)
	}
	var page MessagesPage
	if err := c.Call(ctx, "chat.getAgentMessages", map[string]any{"agentId": "m1"}, &page); err != nil || page.Total != 0 {
		t.Errorf("history after chat.reset = %+v, %v", page, err)
	}
	if err := c.Call(ctx, "chat.send", map[string]any{"agentId": "m1", "content": "stale", "conversation": 0}, nil); envelope.CodeOf(err) != envelope.CodeCancelled {
		t.Errorf("chat.send to the conversation before the reset: %v; want CANCELLED", err)
	}
	var ci ContextInfo
	if err := c.Call(ctx, "chat.get_context", map[string]any{"agentId": "m1"}, &ci); err != nil || ci.Conversation != 1 || ci.HistoryCount != 0 {
		t.Errorf("context after reset = %+v, %v; want conversation 1, empty", ci, err)
	}
	if err := c.Call(ctx, "chat.send", map[string]any{"agentId": "m1", "content": "now", "conversation": 1}, nil); err != nil {
		t.Errorf("chat.send to the current conversation: %v", err)
	}
	if err := c.Call(ctx, "chat.reset", map[string]any{"agentId": "nobody"}, nil); envelope.CodeOf(err) != envelope.CodeAgentNotFound {
		t.Errorf("chat.reset of an unknown agent: %v; want AGENT_NOT_FOUND", err)
	}
	if err := c.Call(ctx, "chat.reset", map[string]any{}, nil); envelope.CodeOf(err) != envelope.CodeInvalidParams {
		t.Errorf("chat.reset without an id: %v; want INVALID_PARAMS", err)
	}
	var s control.SchemaPayload
	if err := c.Call(ctx, "mesh.schema", nil, &s); err != nil {
		t.Fatal(err)
	}
	if ms, ok := s.Methods["chat.reset"]; !ok || !strings.Contains(string(ms.Response), "moved_to") {
		t.Errorf("schema of chat.reset = %+v", ms)
	}
}

// TestResetWindow: a send that registers after Reset cancelled the sends
// in flight, and finds the turn free before Reset takes it, yields the
// turn and runs after the reset, on the empty history (not on the old
// one, into the file moved aside).
func TestResetWindow(t *testing.T) {
	dir := t.TempDir()
	rt := newRT(t, Config{DataDir: dir}, &Scripted{}, nil)
	a := mustCreate(t, rt, "w1", "")
	if _, err := a.Send(t.Context(), "before", ""); err != nil {
		t.Fatal(err)
	}
	sent := make(chan error, 1)
	resetWindowHook = func(*Agent) {
		resetWindowHook = nil
		go func() {
			_, err := a.Send(context.Background(), "in the window", "")
			sent <- err
		}()
		// Time for the send to register and take the free turn.
		for range 100 {
			if len(a.turn) == 1 {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	defer func() { resetWindowHook = nil }()
	res, err := a.Reset(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := <-sent; err != nil {
		t.Fatalf("the send in the window: %v", err)
	}
	if h := a.Context().HistoryCount; h != 2 {
		t.Errorf("history after the reset and the send: %d messages; want 2 (the send ran on the empty history)", h)
	}
	aside, _ := os.ReadFile(filepath.Join(dir, "sessions", res.MovedTo))
	if strings.Contains(string(aside), "in the window") {
		t.Error("the send in the window ran on the old history (it is in the file moved aside)")
	}
}
