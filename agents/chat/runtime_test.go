package chat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentmesh/agentmesh/envelope"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}

// recorder collects an agent's events in order.
type recorder struct {
	mu  sync.Mutex
	evs []SeqEvent
}

func record(t *testing.T, a *Agent) *recorder {
	r := &recorder{}
	t.Cleanup(a.Subscribe(func(e SeqEvent) {
		r.mu.Lock()
		r.evs = append(r.evs, e)
		r.mu.Unlock()
	}))
	return r
}

func (r *recorder) events() []SeqEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.evs)
}

// types lists the event types with consecutive message_updates folded
// into one "message_update*".
func types(evs []SeqEvent) []string {
	var out []string
	for _, e := range evs {
		t := e.Event.Type
		if t == EventMessageUpdate {
			t += "*"
			if len(out) > 0 && out[len(out)-1] == t {
				continue
			}
		}
		out = append(out, t)
	}
	return out
}

// asMap marshals v and decodes it as a generic map, to check the wire shape.
func asMap(t *testing.T, v any) map[string]any {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// checkMessageStream checks one assistant message's events: start with
// empty content, updates whose text only grows (full accumulated
// content, not deltas), an end whose content is the last update's.
func checkMessageStream(t *testing.T, evs []SeqEvent, agentID string) (end Event) {
	t.Helper()
	if len(evs) < 2 || evs[0].Event.Type != EventMessageStart || evs[len(evs)-1].Event.Type != EventMessageEnd {
		t.Fatalf("message stream = %v; want message_start … message_end", types(evs))
	}
	sid := evs[0].StreamID
	start := asMap(t, evs[0].StreamPayload)
	if !reflect.DeepEqual(keys(start), []string{"agentId", "event", "streamId"}) || start["agentId"] != agentID {
		t.Errorf("StreamPayload = %v; want streamId, agentId %s, event", start, agentID)
	}
	if got := asMap(t, evs[0].Event); !reflect.DeepEqual(got, map[string]any{"type": "message_start", "message": map[string]any{"role": "assistant", "content": []any{}}}) {
		t.Errorf("message_start = %v", got)
	}
	prev := ""
	var last Content
	for _, e := range evs[1 : len(evs)-1] {
		if e.Event.Type != EventMessageUpdate || e.StreamID != sid {
			t.Fatalf("inside a message stream: %s on stream %s (want message_update on %s)", e.Event.Type, e.StreamID, sid)
		}
		txt := TextOf(e.Event.Message.Content)
		if !strings.HasPrefix(txt, prev) {
			t.Errorf("message_update text %q does not extend the previous %q: not the full accumulated content", txt, prev)
		}
		prev, last = txt, e.Event.Message.Content
	}
	end = evs[len(evs)-1].Event
	if evs[len(evs)-1].StreamID != sid {
		t.Errorf("message_end on stream %s, want %s", evs[len(evs)-1].StreamID, sid)
	}
	if end.Message == nil || end.Message.StopReason == "" {
		t.Fatalf("message_end without stopReason: %+v", end)
	}
	if len(evs) > 2 && !reflect.DeepEqual(asMap(t, StreamMessage{Content: last}), asMap(t, StreamMessage{Content: end.Message.Content})) {
		t.Errorf("message_end content %v differs from the last update's %v", end.Message.Content, last)
	}
	return end
}

func newRT(t *testing.T, cfg Config, p Provider, tools *Tools) *Runtime {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	rt := NewRuntime(cfg, p, tools)
	t.Cleanup(func() { rt.Close(context.Background()) })
	return rt
}

func mustCreate(t *testing.T, rt *Runtime, id, prompt string) *Agent {
	t.Helper()
	res, err := rt.Create(id, prompt)
	if err != nil {
		t.Fatal(err)
	}
	return rt.Get(res.AgentID)
}

func lookupTool() Tool {
	return Tool{
		Spec: ToolSpec{Name: "lookup", Description: "look a key up", Parameters: json.RawMessage(`{"type":"object","properties":{"key":{"type":"string"}}}`)},
		Run: func(ctx context.Context, call ToolCall, args json.RawMessage) (string, error) {
			var in struct{ Key string }
			if err := json.Unmarshal(args, &in); err != nil {
				return "", err
			}
			if in.Key == "" {
				return "", errors.New("no key")
			}
			return "value-of-" + in.Key, nil
		},
	}
}

func TestScriptedTurnWithToolCall(t *testing.T) {
	rt := newRT(t, Config{}, &Scripted{ChunkSize: 5}, NewTools(lookupTool()))
	a := mustCreate(t, rt, "w1", "You are a test.")
	rec := record(t, a)
	res, err := a.Send(t.Context(), `/tool lookup {"key":"cat"}`, "req-1")
	if err != nil {
		t.Fatal(err)
	}
	if res.RequestID != "req-1" || res.Content != "Tool lookup returned: value-of-cat" {
		t.Errorf("send = %+v", res)
	}
	evs := rec.events()
	want := []string{"message_start", "message_update*", "message_end", "tool_execution_start", "tool_execution_end", "message_start", "message_update*", "message_end"}
	if got := types(evs); !reflect.DeepEqual(got, want) {
		t.Fatalf("event order = %v\nwant %v", got, want)
	}
	i := slices.IndexFunc(evs, func(e SeqEvent) bool { return e.Event.Type == EventToolExecutionStart })
	end1 := checkMessageStream(t, evs[:i], "w1")
	if end1.Message.StopReason != StopToolUse {
		t.Errorf("first message_end stopReason = %q, want tool_use", end1.Message.StopReason)
	}
	calls := ToolCalls(end1.Message.Content)
	if len(calls) != 1 || calls[0].Name != "lookup" || string(calls[0].Arguments) != `{"key":"cat"}` {
		t.Fatalf("toolCall blocks = %+v", calls)
	}
	ts, te := evs[i], evs[i+1]
	if ts.StreamID != evs[0].StreamID || te.StreamID != evs[0].StreamID {
		t.Errorf("tool events are not on the calling message's stream")
	}
	if got := asMap(t, ts.Event); !reflect.DeepEqual(got, map[string]any{"type": "tool_execution_start", "toolCallId": calls[0].ID, "toolName": "lookup", "args": map[string]any{"key": "cat"}}) {
		t.Errorf("tool_execution_start = %v", got)
	}
	if got := asMap(t, te.Event); !reflect.DeepEqual(got, map[string]any{"type": "tool_execution_end", "toolCallId": calls[0].ID, "result": "value-of-cat", "isError": false}) {
		t.Errorf("tool_execution_end = %v", got)
	}
	end2 := checkMessageStream(t, evs[i+2:], "w1")
	if evs[i+2].StreamID == evs[0].StreamID {
		t.Errorf("the second assistant message reuses the first one's streamId")
	}
	if end2.Message.StopReason != StopEndTurn || TextOf(end2.Message.Content) != res.Content {
		t.Errorf("second message_end = %+v", end2.Message)
	}
	for k, e := range evs {
		if e.Seq != evs[0].Seq+uint64(k) {
			t.Fatalf("seq not consecutive at %d", k)
		}
	}
	page, err := rt.Messages("w1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	roles := []string{}
	for _, m := range page.Messages {
		roles = append(roles, m.Role)
	}
	if !reflect.DeepEqual(roles, []string{"user", "assistant", "toolResult", "assistant"}) || page.Total != 4 || page.Limit != 50 {
		t.Fatalf("history roles = %v (total %d, limit %d)", roles, page.Total, page.Limit)
	}
	tr := page.Messages[2]
	if tr.ToolCallID != calls[0].ID || tr.ToolName != "lookup" || tr.IsError == nil || *tr.IsError || TextOf(tr.Content) != "value-of-cat" {
		t.Errorf("toolResult = %+v", tr)
	}
	as := page.Messages[3]
	if as.Model != "scripted-1" || as.Provider != "scripted" || as.Usage == nil || as.Usage.TotalTokens != as.Usage.Input+as.Usage.Output || as.Timestamp == 0 {
		t.Errorf("assistant message = %+v", as)
	}
	// A failing tool is a result with isError, and the turn goes on.
	rec2 := record(t, a)
	if _, err := a.Send(t.Context(), `/tool lookup {}`, ""); err != nil {
		t.Fatal(err)
	}
	var tend *Event
	for _, e := range rec2.events() {
		if e.Event.Type == EventToolExecutionEnd {
			tend = &e.Event
		}
	}
	if tend == nil || *tend.IsError != true || *tend.Result != "no key" {
		t.Errorf("failing tool's end event = %+v", tend)
	}
}

func TestCancelledTurn(t *testing.T) {
	rt := newRT(t, Config{}, &Scripted{ChunkSize: 4, Delay: 5 * time.Millisecond}, nil)
	a := mustCreate(t, rt, "c1", "")
	rec := record(t, a)
	started := make(chan struct{})
	var once sync.Once
	cancelSub := a.Subscribe(func(e SeqEvent) {
		if e.Event.Type == EventMessageUpdate && len(TextOf(e.Event.Message.Content)) > 20 {
			once.Do(func() { close(started) })
		}
	})
	defer cancelSub()
	errc := make(chan error, 1)
	go func() {
		_, err := a.Send(context.Background(), "/long 2000", "long-1")
		errc <- err
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the turn did not stream")
	}
	if !a.Cancel("long-1") {
		t.Fatal("Cancel of the running request = false")
	}
	var err error
	select {
	case err = <-errc:
	case <-time.After(5 * time.Second):
		t.Fatal("send did not return after cancel")
	}
	if envelope.CodeOf(err) != envelope.CodeCancelled {
		t.Fatalf("cancelled send error = %v; want CANCELLED", err)
	}
	if a.Cancel("long-1") {
		t.Errorf("a second cancel found the request again")
	}
	evs := rec.events()
	if got := types(evs); !reflect.DeepEqual(got, []string{"message_start", "message_update*", "message_end"}) {
		t.Fatalf("cancelled turn events = %v", got)
	}
	end := checkMessageStream(t, evs, "c1")
	if end.Message.StopReason != StopAborted {
		t.Errorf("stopReason = %q, want aborted", end.Message.StopReason)
	}
	partial := TextOf(end.Message.Content)
	if partial == "" || strings.Contains(partial, "word2000") {
		t.Errorf("partial text = %.60q…; want a strict prefix of the answer", partial)
	}
	page, _ := rt.Messages("c1", 0, 10)
	if page.Total != 2 || page.Messages[1].StopReason != StopAborted || TextOf(page.Messages[1].Content) != partial {
		t.Errorf("history after cancel = %+v", page)
	}
	// The agent takes the next send normally.
	if res, err := a.Send(t.Context(), "hello", ""); err != nil || !strings.Contains(res.Content, `"hello"`) {
		t.Errorf("send after cancel = %+v, %v", res, err)
	}
}

func TestCompaction(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cfg    Config
		reason string
	}{
		{"tokens", Config{TokenBudget: 300, KeepTokens: 120, MaxMessages: -1}, "tokens"},
		{"count", Config{MaxMessages: 6, KeepMessages: 2}, "count"},
		{"summary", Config{TokenBudget: 300, KeepTokens: 120, MaxMessages: -1, Summarize: true}, "summary"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.cfg.DataDir = dir
			rt := newRT(t, tc.cfg, &Scripted{ChunkSize: 16}, nil)
			a := mustCreate(t, rt, "k1", "Be brief.")
			rec := record(t, a)
			var compactedAt = -1
			for i := 0; i < 12 && compactedAt < 0; i++ {
				before := len(rec.events())
				if _, err := a.Send(t.Context(), fmt.Sprintf("message number %d with some padding to use tokens %s", i, strings.Repeat("x", 60)), ""); err != nil {
					t.Fatal(err)
				}
				for j, e := range rec.events()[before:] {
					if e.Event.Type == EventCompactionStart {
						compactedAt = before + j
						break
					}
				}
			}
			if compactedAt < 0 {
				t.Fatalf("no compaction in 12 turns; context %+v", a.Context())
			}
			evs := rec.events()
			cs, ce := evs[compactedAt], evs[compactedAt+1]
			if cs.StreamID != "compaction:k1" || ce.StreamID != "compaction:k1" || ce.Event.Type != EventCompactionEnd {
				t.Fatalf("compaction events = %+v, %+v", cs, ce)
			}
			if got := asMap(t, cs.Event); !reflect.DeepEqual(got, map[string]any{"type": "compaction_start"}) {
				t.Errorf("compaction_start = %v", got)
			}
			if evs[compactedAt+2].Event.Type != EventMessageStart {
				t.Errorf("compaction is not followed by the turn's message_start but %s", evs[compactedAt+2].Event.Type)
			}
			end := asMap(t, ce.Event)
			want := []string{"kept", "reason", "removed", "tokensKept", "tokensRemoved", "type"}
			if tc.reason == "count" {
				want = []string{"kept", "reason", "removed", "type"} // absent in count mode
			}
			if !reflect.DeepEqual(keys(end), want) || end["reason"] != tc.reason {
				t.Fatalf("compaction_end = %v; want keys %v, reason %s", end, want, tc.reason)
			}
			removed, kept := *ce.Event.Removed, *ce.Event.Kept
			hist, _ := rt.Messages("k1", 0, 1000)
			ctx := a.Context()
			if removed <= 0 || kept <= 0 {
				t.Errorf("removed %d, kept %d", removed, kept)
			}
			// The kept messages are the context now (the turn then added one
			// assistant message); the history still holds everything.
			extra := 0
			if tc.reason == "summary" {
				extra = 1
				// Bounded (max(KeepTokens/4, 64) tokens), newest removed lines kept.
				if !strings.HasPrefix(ctx.Summary, "user: message number ") || EstimateTokens(ctx.Summary) > 64 {
					t.Errorf("summary = %q", ctx.Summary)
				}
			}
			if ctx.MessageCount != kept+1+extra || ctx.HistoryCount != hist.Total || ctx.Compactions != 1 {
				t.Errorf("after compaction: context %d messages (kept %d + 1 + summary %d), history %d/%d, compactions %d",
					ctx.MessageCount, kept, extra, ctx.HistoryCount, hist.Total, ctx.Compactions)
			}
			if tc.reason != "count" {
				tr, tk := *ce.Event.TokensRemoved, *ce.Event.TokensKept
				if tr <= 0 || tk <= 0 || tk > tc.cfg.KeepTokens+EstimateTokens(ctx.Summary)+8 {
					t.Errorf("tokensRemoved %d, tokensKept %d (keep %d)", tr, tk, tc.cfg.KeepTokens)
				}
			} else if ctx.MessageCount > tc.cfg.MaxMessages {
				t.Errorf("context holds %d messages, over the budget %d", ctx.MessageCount, tc.cfg.MaxMessages)
			}
			// The first kept message is a user message (no orphan tool result).
			if first := hist.Messages[hist.Total-ctx.MessageCount+extra]; first.Role != RoleUser {
				t.Errorf("context starts with a %s message", first.Role)
			}
			// A runtime on the same directory sees the same context.
			rt.Close(t.Context())
			rt2 := newRT(t, tc.cfg, &Scripted{}, nil)
			a2 := mustCreate(t, rt2, "k1", "")
			if got := a2.Context(); got.MessageCount != ctx.MessageCount || got.HistoryCount != ctx.HistoryCount || got.Summary != ctx.Summary || got.SystemPrompt != "Be brief." {
				t.Errorf("after reload: %+v\nbefore: %+v", got, ctx)
			}
		})
	}
}

func TestSessionSurvivesRuntimeRestart(t *testing.T) {
	dir := t.TempDir()
	rt := NewRuntime(Config{DataDir: dir}, &Scripted{}, NewTools(lookupTool()))
	a := mustCreate(t, rt, "", "sys")
	id := a.ID()
	if len(id) != 8 {
		t.Errorf("generated id %q, want 8 hex digits", id)
	}
	for _, m := range []string{"one", `/tool lookup {"key":"k"}`, "/think three"} {
		if _, err := a.Send(t.Context(), m, ""); err != nil {
			t.Fatal(err)
		}
	}
	before, _ := rt.Messages(id, 0, 100)
	list := rt.List()
	if len(list) != 1 || list[0].AgentID != id || list[0].MessageCount != before.Total || list[0].ShouldShutdown {
		t.Errorf("list = %+v", list)
	}
	if _, err := rt.Messages("nobody", 0, 10); envelope.CodeOf(err) != envelope.CodeAgentNotFound || !strings.Contains(err.Error(), "No session found for agent: nobody") {
		t.Errorf("messages of an unknown agent: %v", err)
	}
	rt.Close(t.Context()) // a restart, not a destroy: the agent resumes (TestDestroyedIDStartsAfresh)

	rt2 := newRT(t, Config{DataDir: dir}, &Scripted{}, nil)
	res, err := rt2.Create(id, "")
	if err != nil || !res.Resumed || res.MessageCount != before.Total {
		t.Fatalf("re-create = %+v, %v", res, err)
	}
	after, _ := rt2.Messages(id, 0, 100)
	if !reflect.DeepEqual(asMap(t, before), asMap(t, after)) {
		t.Fatalf("history changed across the restart:\n%+v\n%+v", before, after)
	}
	if got := rt2.Get(id).Context().SystemPrompt; got != "sys" {
		t.Errorf("system prompt after restart = %q", got)
	}
	// The conversation goes on where it was.
	r, err := rt2.Get(id).Send(t.Context(), "four", "")
	if err != nil || !strings.Contains(r.Content, fmt.Sprintf("(%d messages in context)", before.Total+1)) {
		t.Errorf("send after restart = %+v, %v", r, err)
	}
	if _, err := rt2.Create(id, ""); envelope.CodeOf(err) != envelope.CodeInvalidParams {
		t.Errorf("create of an existing agent: %v; want INVALID_PARAMS", err)
	}
	if _, err := rt2.Create("../etc", ""); envelope.CodeOf(err) != envelope.CodeInvalidParams {
		t.Errorf("create with a path for an id: %v; want INVALID_PARAMS", err)
	}
}

func TestTornLastLine(t *testing.T) {
	dir := t.TempDir()
	rt := NewRuntime(Config{DataDir: dir}, &Scripted{}, nil)
	a := mustCreate(t, rt, "torn", "")
	for i := range 3 {
		if _, err := a.Send(t.Context(), fmt.Sprintf("m%d", i), ""); err != nil {
			t.Fatal(err)
		}
	}
	rt.Close(t.Context())
	p := sessionPath(dir, "torn")
	full, _ := os.ReadFile(p)
	// Cut the file in the middle of its last line (a crash mid-append).
	lastStart := strings.LastIndex(strings.TrimSuffix(string(full), "\n"), "\n") + 1
	cut := lastStart + (len(full)-lastStart)/2
	if err := os.WriteFile(p, full[:cut], 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := readSession(dir, "torn")
	if err != nil {
		t.Fatal(err)
	}
	if len(st.history) != 5 || st.skipped != 1 {
		t.Fatalf("loaded %d messages, skipped %d; want the 5 complete ones and the torn line skipped", len(st.history), st.skipped)
	}
	rt2 := newRT(t, Config{DataDir: dir}, &Scripted{}, nil)
	a2 := mustCreate(t, rt2, "torn", "")
	if _, err := a2.Send(t.Context(), "after", ""); err != nil {
		t.Fatal(err)
	}
	rt2.Close(t.Context())
	st, _ = readSession(dir, "torn")
	if len(st.history) != 7 || st.skipped != 0 {
		t.Fatalf("after repair and two appends: %d messages, %d bad lines; want 7 and 0", len(st.history), st.skipped)
	}
	if TextOf(st.history[5].Content) != "after" {
		t.Errorf("message 5 = %+v", st.history[5])
	}
	// A complete last line without its newline is kept, and the next
	// append starts a line of its own.
	data, _ := os.ReadFile(p)
	_ = os.WriteFile(p, []byte(strings.TrimSuffix(string(data), "\n")), 0o600)
	rt3 := newRT(t, Config{DataDir: dir}, &Scripted{}, nil)
	if _, err := mustCreate(t, rt3, "torn", "").Send(t.Context(), "again", ""); err != nil {
		t.Fatal(err)
	}
	rt3.Close(t.Context())
	st, _ = readSession(dir, "torn")
	if len(st.history) != 9 || st.skipped != 0 {
		t.Fatalf("after a missing newline: %d messages, %d bad lines; want 9 and 0", len(st.history), st.skipped)
	}
}

func TestConcurrentSendsAreSerialised(t *testing.T) {
	rt := newRT(t, Config{MaxQueue: 16}, &Scripted{ChunkSize: 3, Delay: time.Millisecond}, nil)
	a := mustCreate(t, rt, "s1", "")
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			if _, err := a.Send(t.Context(), fmt.Sprintf("msg-%d", i), fmt.Sprintf("rq-%d", i)); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	page, _ := rt.Messages("s1", 0, 100)
	if page.Total != 2*n {
		t.Fatalf("history has %d messages, want %d", page.Total, 2*n)
	}
	seen := map[string]bool{}
	for i := 0; i < page.Total; i += 2 {
		u, as := page.Messages[i], page.Messages[i+1]
		q := TextOf(u.Content)
		if u.Role != RoleUser || as.Role != RoleAssistant || !strings.Contains(TextOf(as.Content), fmt.Sprintf("%q (%d messages", q, i+1)) {
			t.Fatalf("messages %d,%d interleaved: %s %q / %s %q", i, i+1, u.Role, q, as.Role, TextOf(as.Content))
		}
		seen[q] = true
	}
	if len(seen) != n {
		t.Errorf("%d distinct user messages, want %d", len(seen), n)
	}
	// Each turn's events are contiguous too: no message_start before the
	// previous message_end; and each carries its send's request_id, one
	// run of events per request_id.
	open := false
	runs := map[string]int{}
	prev := ""
	for _, e := range a.Events(t.Context(), 0, 1024, 0).Events {
		if !strings.HasPrefix(e.RequestID, "rq-") {
			t.Fatalf("event %d (%s) has request_id %q; want its send's", e.Seq, e.Event.Type, e.RequestID)
		}
		if e.RequestID != prev {
			runs[e.RequestID]++
			prev = e.RequestID
		}
		switch e.Event.Type {
		case EventMessageStart:
			if open {
				t.Fatal("two message streams interleaved")
			}
			open = true
		case EventMessageEnd:
			open = false
		}
	}
	for id, n := range runs {
		if n != 1 {
			t.Errorf("request %s: its events come in %d runs; want one", id, n)
		}
	}
	if len(runs) != n {
		t.Errorf("events of %d requests; want %d", len(runs), n)
	}

	// Past MaxQueue waiting sends, a send is refused with OVERLOADED.
	rt2 := newRT(t, Config{MaxQueue: 1}, &Scripted{ChunkSize: 1, Delay: 2 * time.Millisecond}, nil)
	b := mustCreate(t, rt2, "s2", "")
	var codes sync.Map
	var wg2 sync.WaitGroup
	for i := range 4 {
		wg2.Go(func() {
			_, err := b.Send(t.Context(), "/long 30", fmt.Sprintf("r%d", i))
			codes.Store(i, envelope.CodeOf(err))
		})
	}
	wg2.Wait()
	ok, over := 0, 0
	codes.Range(func(_, v any) bool {
		switch v.(envelope.Code) {
		case envelope.CodeOK:
			ok++
		case envelope.CodeOverloaded:
			over++
		}
		return true
	})
	if ok+over != 4 || over == 0 || ok < 1 {
		t.Errorf("4 sends with MaxQueue 1: %d ok, %d OVERLOADED; want all either, some refused", ok, over)
	}
	page2, _ := rt2.Messages("s2", 0, 100)
	if page2.Total != 2*ok {
		t.Errorf("history has %d messages for %d successful sends", page2.Total, ok)
	}
}

func TestCancelQueuedSendAndDuplicates(t *testing.T) {
	rt := newRT(t, Config{}, &Scripted{ChunkSize: 1, Delay: 2 * time.Millisecond}, nil)
	a := mustCreate(t, rt, "q1", "")
	first := make(chan error, 1)
	go func() { _, err := a.Send(context.Background(), "/long 200", "first"); first <- err }()
	waitFor(t, func() bool { return a.Context().Busy })
	if _, err := a.Send(t.Context(), "x", "first"); envelope.CodeOf(err) != envelope.CodeInvalidParams {
		t.Errorf("duplicate request_id: %v; want INVALID_PARAMS", err)
	}
	queued := make(chan error, 1)
	go func() { _, err := a.Send(context.Background(), "queued", "second"); queued <- err }()
	waitFor(t, func() bool { return a.waiting.Load() == 1 })
	if !a.Cancel("second") {
		t.Fatal("cancel of a queued send = false")
	}
	if err := <-queued; envelope.CodeOf(err) != envelope.CodeCancelled {
		t.Errorf("queued send after cancel: %v", err)
	}
	a.Cancel("first")
	<-first
	page, _ := rt.Messages("q1", 0, 100)
	for _, m := range page.Messages {
		if TextOf(m.Content) == "queued" {
			t.Errorf("a send cancelled while queued reached the history")
		}
	}
	a.Shutdown()
	if _, err := a.Send(t.Context(), "late", ""); envelope.CodeOf(err) != envelope.CodeUnavailable {
		t.Errorf("send after shutdown: %v; want UNAVAILABLE", err)
	}
	if !rt.ShouldShutdown() || !rt.List()[0].ShouldShutdown {
		t.Errorf("pool should_shutdown not reported")
	}
}

func TestGetTokens(t *testing.T) {
	rt := newRT(t, Config{TokenBudget: 1000}, &Scripted{}, NewTools(lookupTool()))
	a := mustCreate(t, rt, "t1", strings.Repeat("s", 400))
	tk := a.Tokens()
	if tk.System != 100 || tk.Tools == 0 || tk.Messages != 0 || tk.Total != tk.System+tk.Tools || tk.Budget != 1000 || tk.Available != 1000-tk.Total {
		t.Errorf("tokens = %+v", tk)
	}
	if _, err := a.Send(t.Context(), "hello", ""); err != nil {
		t.Fatal(err)
	}
	tk2 := a.Tokens()
	if tk2.Messages <= 0 || tk2.Total != tk2.System+tk2.Tools+tk2.Messages || tk2.Available != 1000-tk2.Total {
		t.Errorf("tokens after a turn = %+v", tk2)
	}
	if got := keys(asMap(t, tk2)); !reflect.DeepEqual(got, []string{"available", "budget", "messages", "system", "tools", "total"}) {
		t.Errorf("get_tokens keys = %v", got)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestDestroyDuringTurn(t *testing.T) {
	rt := newRT(t, Config{}, &Scripted{ChunkSize: 1, Delay: 2 * time.Millisecond}, nil)
	a := mustCreate(t, rt, "d1", "")
	errc := make(chan error, 2)
	go func() { _, err := a.Send(context.Background(), "/long 5000", "running"); errc <- err }()
	waitFor(t, func() bool { return a.Context().Busy })
	go func() { _, err := a.Send(context.Background(), "queued", "queued"); errc <- err }()
	waitFor(t, func() bool { return a.waiting.Load() == 1 })
	if !rt.Destroy(t.Context(), "d1") {
		t.Fatal("destroy = false")
	}
	// Destroy returned: the turn is over, both sends have failed.
	for range 2 {
		select {
		case err := <-errc:
			if c := envelope.CodeOf(err); c != envelope.CodeCancelled && c != envelope.CodeAgentNotFound {
				t.Errorf("send to a destroyed agent: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a send outlived destroy")
		}
	}
	if _, err := a.Send(t.Context(), "late", ""); envelope.CodeOf(err) != envelope.CodeAgentNotFound {
		t.Errorf("send after destroy: %v; want AGENT_NOT_FOUND", err)
	}
	page, err := rt.Messages("d1", 0, 10)
	if err != nil || page.Total != 2 || page.Messages[1].StopReason != StopAborted {
		t.Errorf("history of the destroyed agent = %+v, %v", page, err)
	}
	if p := a.Events(t.Context(), 0, 0, time.Second); !p.Closed {
		t.Errorf("events of a destroyed agent are not marked closed")
	}
}

// TestEventPagesBounded publishes the message_update events of a long
// answer (each carries the whole text so far) and reads them back in
// pages: each page stays under MaxPageBytes, and the pages together give
// every event once, in order. Unbounded, the first page of 256 events
// was 33 MB, far past a link's 1 MiB limit.
func TestEventPagesBounded(t *testing.T) {
	l := newEventLog(1024)
	text := ""
	for range 400 {
		text += strings.Repeat("w", 320)
		l.publish(StreamPayload{StreamID: "s", AgentID: "a", Event: Event{Type: EventMessageUpdate,
			Message: &StreamMessage{Role: "assistant", Content: Content{Text(text)}}}}, "")
	}
	var after uint64
	seen := 0
	for pages := 0; seen < 400; pages++ {
		if pages > 400 {
			t.Fatal("no progress")
		}
		p := l.read(t.Context(), after, 256, 0)
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		// Well under a link's 1 MiB message limit, with the envelope around it.
		if len(b) > 512<<10 && len(p.Events) > 1 {
			t.Fatalf("page of %d events is %d bytes, over 512 KiB", len(p.Events), len(b))
		}
		for _, e := range p.Events {
			if e.Seq != uint64(seen)+1 {
				t.Fatalf("event seq %d, want %d", e.Seq, seen+1)
			}
			seen++
		}
		after = p.NextSeq
	}
}

// TestCreatedAtPrecision: created_at is UTC to the millisecond, three
// digits always, and a resumed agent answers the very string its first
// creation did (the session file keeps milliseconds; it switched from
// nanoseconds to milliseconds across a restart before).
func TestCreatedAtPrecision(t *testing.T) {
	dir := t.TempDir()
	rt := NewRuntime(Config{DataDir: dir}, &Scripted{}, nil)
	first, err := rt.Create("p1", "")
	if err != nil {
		t.Fatal(err)
	}
	rt.Close(context.Background())
	if !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`).MatchString(first.CreatedAt) {
		t.Errorf("created_at %q; want UTC to the millisecond, 3 digits", first.CreatedAt)
	}
	rt = NewRuntime(Config{DataDir: dir}, &Scripted{}, nil)
	defer rt.Close(context.Background())
	again, err := rt.Create("p1", "")
	if err != nil || !again.Resumed {
		t.Fatalf("resume: %+v, %v", again, err)
	}
	if again.CreatedAt != first.CreatedAt {
		t.Errorf("created_at %q when resumed; want %q, as created", again.CreatedAt, first.CreatedAt)
	}
	if l := rt.List(); len(l) != 1 || l[0].CreatedAt != first.CreatedAt {
		t.Errorf("list: %+v; want created_at %q", l, first.CreatedAt)
	}
}

// TestDestroyedIDStartsAfresh: a destroyed agent's history is still
// served from its file, but an agent created again under its id is a
// new agent with a state of its own (NEXUS3's isolation), across a
// restart too; the old history is moved aside, not lost. A restart
// without a destroy resumes (TestSessionSurvivesRuntimeRestart).
func TestDestroyedIDStartsAfresh(t *testing.T) {
	dir := t.TempDir()
	rt := NewRuntime(Config{DataDir: dir}, &Scripted{}, nil)
	a := mustCreate(t, rt, "iso", "sys")
	for _, m := range []string{"one", "two"} {
		if _, err := a.Send(t.Context(), m, ""); err != nil {
			t.Fatal(err)
		}
	}
	before, _ := rt.Messages("iso", 0, 100)
	if !rt.Destroy(t.Context(), "iso") || rt.Destroy(t.Context(), "iso") {
		t.Errorf("destroy twice: want true then false")
	}
	// A destroyed agent's history is still served from its file.
	closed, err := rt.Messages("iso", 1, 2)
	if err != nil || closed.Total != before.Total || len(closed.Messages) != 2 || closed.Offset != 1 || closed.Limit != 2 {
		t.Fatalf("messages of a destroyed agent = %+v, %v", closed, err)
	}
	res, err := rt.Create("iso", "")
	if err != nil || res.Resumed || res.MessageCount != 0 {
		t.Fatalf("create after destroy = %+v, %v; want a new agent, no history", res, err)
	}
	if now, _ := rt.Messages("iso", 0, 100); now.Total != 0 {
		t.Errorf("the new agent's messages: %d; want 0", now.Total)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "sessions", "iso.jsonl.reset-*")); len(m) != 1 {
		t.Errorf("old history moved aside to %v; want one file", m)
	}
	if got := rt.Get("iso").Context().SystemPrompt; got != "" {
		t.Errorf("the new agent's system prompt %q; want the default (none here), not the destroyed one's", got)
	}
	// Destroyed again, then the runtime restarts: still a new agent.
	rt.Destroy(t.Context(), "iso")
	rt.Close(t.Context())
	rt2 := newRT(t, Config{DataDir: dir}, &Scripted{}, nil)
	if res, err := rt2.Create("iso", ""); err != nil || res.Resumed {
		t.Errorf("create after destroy and restart = %+v, %v; want a new agent", res, err)
	}
}
