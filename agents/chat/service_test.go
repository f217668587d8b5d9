package chat

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
)

// TestServiceOverTheMesh drives the chat agent through a real hub: the
// pool methods, a turn streamed to a long-polling client, cancel,
// get_tokens/get_context, history of a destroyed agent, and the mesh_call
// tool calling the echo agent and another chat agent (a subagent).
func TestServiceOverTheMesh(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	m.RunAgent(t, agents.NewEcho())
	toolClient := m.Client(t)
	rt := NewRuntime(Config{DataDir: t.TempDir()}, &Scripted{ChunkSize: 6, Delay: time.Millisecond}, NewTools(MeshCallTool(toolClient, 10*time.Second)))
	t.Cleanup(func() { rt.Close(context.Background()) })
	m.RunAgent(t, NewService(rt))
	c := m.Client(t)
	ctx := t.Context()
	call := func(method string, params, out any) error {
		return c.Call(ctx, method, params, out, mesh.CallTimeout(20*time.Second))
	}

	var created CreateResult
	if err := call("chat.create_agent", map[string]any{"agent_id": "main", "system_prompt": "Help."}, &created); err != nil || created.AgentID != "main" || created.Resumed {
		t.Fatalf("chat.create_agent = %+v, %v", created, err)
	}
	if err := call("chat.create", map[string]any{"agent_id": "sub"}, nil); err != nil {
		t.Fatal(err)
	}
	if err := call("chat.create", map[string]any{"agent_id": "sub"}, nil); envelope.CodeOf(err) != envelope.CodeInvalidParams {
		t.Errorf("second create of sub: %v; want INVALID_PARAMS", err)
	}

	// A long poller collects main's events while a turn with a mesh_call runs.
	var (
		mu     sync.Mutex
		events []SeqEvent
	)
	pollCtx, stopPoll := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		after := uint64(0)
		for pollCtx.Err() == nil {
			var page EventsPage
			if err := c.Call(pollCtx, "chat.events", map[string]any{"agentId": "main", "after_seq": after, "wait_ms": 2000}, &page, mesh.CallTimeout(5*time.Second)); err != nil {
				continue
			}
			mu.Lock()
			events = append(events, page.Events...)
			mu.Unlock()
			after = page.NextSeq
		}
	})
	var sent SendResult
	if err := call("chat.send", map[string]any{"agentId": "main", "content": `/call echo.echo {"ping":1}`, "request_id": "r-echo"}, &sent); err != nil {
		t.Fatal(err)
	}
	if sent.RequestID != "r-echo" || sent.Content != `Tool mesh_call returned: {"ping":1}` {
		t.Errorf("send = %+v", sent)
	}
	waitFor(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(events) > 0 && events[len(events)-1].Event.Type == EventMessageEnd && events[len(events)-1].Event.Message.StopReason == StopEndTurn
	})
	stopPoll()
	wg.Wait()
	want := []string{"message_start", "message_update*", "message_end", "tool_execution_start", "tool_execution_end", "message_start", "message_update*", "message_end"}
	if got := types(events); !reflect.DeepEqual(got, want) {
		t.Fatalf("events over the mesh = %v\nwant %v", got, want)
	}
	for i := 1; i < len(events); i++ {
		if events[i].Seq != events[i-1].Seq+1 {
			t.Fatalf("long poll lost or repeated events: seq %d after %d", events[i].Seq, events[i-1].Seq)
		}
	}
	ts := events[slicesIndex(events, EventToolExecutionStart)].Event
	if ts.ToolName != MeshCallToolName || string(ts.Args) != `{"method":"echo.echo","params":{"ping":1}}` {
		t.Errorf("tool_execution_start = %+v (args %s)", ts, ts.Args)
	}

	// Subagents: main asks sub through the mesh; an agent may not send to itself.
	if err := call("chat.send", map[string]any{"agentId": "main", "content": `/call chat.send {"agentId":"sub","content":"hello sub"}`}, &sent); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(sent.Content, `You said: \"hello sub\" (1 messages in context)`) {
		t.Errorf("subagent answer = %q", sent.Content)
	}
	if err := call("chat.send", map[string]any{"agentId": "main", "content": `/call chat.send {"agentId":"main","content":"loop"}`}, &sent); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(sent.Content, "cannot send to itself") {
		t.Errorf("self-send answer = %q", sent.Content)
	}

	// cancel: a running request, then one that is gone.
	errc := make(chan error, 1)
	go func() {
		errc <- c.Call(ctx, "chat.send", map[string]any{"agentId": "sub", "content": "/long 5000", "request_id": "long"}, nil, mesh.CallTimeout(30*time.Second))
	}()
	waitFor(t, func() bool { return rt.Get("sub").Context().Busy })
	var cres map[string]any
	if err := call("chat.cancel", map[string]any{"agentId": "sub", "request_id": "long"}, &cres); err != nil || !reflect.DeepEqual(cres, map[string]any{"cancelled": true, "request_id": "long"}) {
		t.Errorf("chat.cancel = %v, %v", cres, err)
	}
	if err := <-errc; envelope.CodeOf(err) != envelope.CodeCancelled {
		t.Errorf("cancelled send over the mesh: %v; want CANCELLED", err)
	}
	cres = nil
	if err := call("chat.cancel", map[string]any{"agentId": "sub", "request_id": "long"}, &cres); err != nil ||
		!reflect.DeepEqual(cres, map[string]any{"cancelled": false, "request_id": "long", "reason": "not_found_or_completed"}) {
		t.Errorf("second chat.cancel = %v, %v", cres, err)
	}

	var tk Tokens
	if err := call("chat.get_tokens", map[string]any{"agentId": "main"}, &tk); err != nil || tk.Messages == 0 || tk.Tools == 0 || tk.Total != tk.System+tk.Tools+tk.Messages {
		t.Errorf("chat.get_tokens = %+v, %v", tk, err)
	}
	var info ContextInfo
	if err := call("chat.get_context", map[string]any{"agent_id": "main"}, &info); err != nil || info.MessageCount != 12 || info.SystemPrompt != "Help." {
		t.Errorf("chat.get_context = %+v, %v", info, err)
	}
	var list struct{ Agents []AgentInfo }
	if err := call("chat.list", nil, &list); err != nil || len(list.Agents) != 2 || list.Agents[0].AgentID != "main" || list.Agents[0].MessageCount != 12 {
		t.Errorf("chat.list = %+v, %v", list, err)
	}
	var del map[string]any
	if err := call("chat.destroy", map[string]any{"agent_id": "main"}, &del); err != nil || del["success"] != true {
		t.Errorf("chat.destroy = %v, %v", del, err)
	}
	var page struct {
		Messages []json.RawMessage `json:"messages"`
		Total    int               `json:"total"`
		Offset   int               `json:"offset"`
		Limit    int               `json:"limit"`
	}
	if err := call("chat.getAgentMessages", map[string]any{"agentId": "main", "offset": 10, "limit": 5}, &page); err != nil || page.Total != 12 || len(page.Messages) != 2 || page.Offset != 10 || page.Limit != 5 {
		t.Errorf("getAgentMessages of a destroyed agent = %+v, %v", page, err)
	}
	for _, tc := range []struct {
		method string
		params any
		code   envelope.Code
	}{
		{"chat.send", map[string]any{"agentId": "main", "content": "x"}, envelope.CodeAgentNotFound},
		{"chat.send", map[string]any{"agentId": "sub"}, envelope.CodeInvalidParams},
		{"chat.send", map[string]any{"content": "x"}, envelope.CodeInvalidParams},
		{"chat.getAgentMessages", map[string]any{"agentId": "nope"}, envelope.CodeAgentNotFound},
		{"chat.cancel", map[string]any{"agentId": "sub"}, envelope.CodeInvalidParams},
		{"chat.events", map[string]any{"agentId": "sub", "max": 5000}, envelope.CodeInvalidParams},
		{"chat.create", map[string]any{"agent_id": "a/b"}, envelope.CodeInvalidParams},
		{"chat.nope", nil, envelope.CodeMethodNotFound},
	} {
		if err := call(tc.method, tc.params, nil); envelope.CodeOf(err) != tc.code {
			t.Errorf("%s %v: %v; want %s", tc.method, tc.params, err, tc.code)
		}
	}
}

func slicesIndex(evs []SeqEvent, typ string) int {
	for i, e := range evs {
		if e.Event.Type == typ {
			return i
		}
	}
	return -1
}

func TestEventRingIsBounded(t *testing.T) {
	l := newEventLog(4)
	for i := range 10 {
		l.publish(StreamPayload{StreamID: "s", AgentID: "a", Event: Event{Type: EventMessageUpdate, Message: &StreamMessage{Role: RoleAssistant, Content: Content{Text(strings.Repeat("x", i))}}}}, "")
	}
	p := l.read(t.Context(), 0, 0, 0)
	if len(p.Events) != 4 || p.Events[0].Seq != 7 || p.NextSeq != 10 || p.Dropped != 6 {
		t.Errorf("read(0) = %d events from %d, next %d, dropped %d; want 4 from 7, next 10, dropped 6", len(p.Events), p.Events[0].Seq, p.NextSeq, p.Dropped)
	}
	p = l.read(t.Context(), 8, 1, 0)
	if len(p.Events) != 1 || p.Events[0].Seq != 9 || p.NextSeq != 9 || p.Dropped != 0 {
		t.Errorf("read(8, max 1) = %+v", p)
	}
	// A long poll waits for the next event, and no longer than told.
	start := time.Now()
	p = l.read(t.Context(), 10, 0, 50*time.Millisecond)
	if len(p.Events) != 0 || p.NextSeq != 10 || time.Since(start) < 50*time.Millisecond {
		t.Errorf("empty long poll = %+v after %s", p, time.Since(start))
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		l.publish(StreamPayload{StreamID: "s", AgentID: "a", Event: Event{Type: EventCompactionStart}}, "")
	}()
	p = l.read(t.Context(), 10, 0, 5*time.Second)
	if len(p.Events) != 1 || p.Events[0].Seq != 11 {
		t.Errorf("woken long poll = %+v", p)
	}
	l.close()
	if p = l.read(t.Context(), 11, 0, 5*time.Second); !p.Closed {
		t.Errorf("read of a closed log did not say so")
	}
}

// TestSendAsStream: chat.send called as a stream yields the turn's events
// as its chunks (message_start, updates, message_end, tool events), all of
// its own request_id, in order, then the turn's answer; another caller's
// turn on the same agent does not leak into it; a cancelled stream
// cancels the turn.
func TestSendAsStream(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	m.RunAgent(t, agents.NewEcho())
	toolClient := m.Client(t)
	rt := NewRuntime(Config{DataDir: t.TempDir()}, &Scripted{ChunkSize: 4, Delay: time.Millisecond}, NewTools(MeshCallTool(toolClient, 10*time.Second)))
	t.Cleanup(func() { rt.Close(context.Background()) })
	m.RunAgent(t, NewService(rt))
	c := m.Client(t)
	ctx := t.Context()
	if err := c.Call(ctx, "chat.create", map[string]any{"agent_id": "main"}, nil); err != nil {
		t.Fatal(err)
	}
	// Another caller's turn runs beside it.
	other := make(chan error, 1)
	go func() {
		other <- c.Call(ctx, "chat.send", map[string]any{"agentId": "main", "content": "someone else", "request_id": "r-other"}, nil)
	}()

	s, err := c.Stream(ctx, "chat.send", map[string]any{"agentId": "main", "content": `/call echo.echo {"ping":2}`, "request_id": "r-stream"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var types []string
	var last uint64
	for raw, err := range s.All() {
		if err != nil {
			t.Fatal(err)
		}
		var e SeqEvent
		if err := json.Unmarshal(raw, &e); err != nil {
			t.Fatalf("chunk %s: %v", raw, err)
		}
		if e.RequestID != "r-stream" || e.AgentID != "main" || e.Seq <= last || e.StreamID == "" {
			t.Fatalf("chunk %s: want main's events of r-stream, in order", raw)
		}
		last = e.Seq
		if n := len(types); n == 0 || types[n-1] != e.Event.Type {
			types = append(types, e.Event.Type)
		}
	}
	want := []string{EventMessageStart, EventMessageUpdate, EventMessageEnd, EventToolExecutionStart, EventToolExecutionEnd,
		EventMessageStart, EventMessageUpdate, EventMessageEnd}
	if !reflect.DeepEqual(types, want) {
		t.Errorf("event types %v; want %v", types, want)
	}
	var res SendResult
	if r := s.Result(); r == nil || json.Unmarshal(r.Result, &res) != nil || res.RequestID != "r-stream" || res.Content != `Tool mesh_call returned: {"ping":2}` {
		t.Errorf("the stream's end: %+v", s.Result())
	}
	if err := <-other; err != nil {
		t.Fatal(err)
	}

	// Cancel mid-turn: the turn is cancelled (its history records it).
	s, err = c.Stream(ctx, "chat.send", map[string]any{"agentId": "main", "content": strings.Repeat("long answer ", 200), "request_id": "r-cancel"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	waitFor(t, func() bool {
		var page MessagesPage
		if c.Call(ctx, "chat.getAgentMessages", map[string]any{"agentId": "main", "limit": 100}, &page) != nil || len(page.Messages) == 0 {
			return false
		}
		return page.Messages[len(page.Messages)-1].StopReason == StopAborted
	})
}
