package agentick_test

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/agents/chat"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
)

// startAgentickWith runs a hub with the echo agent and a chat agent whose
// runtime has cfg (sessions in dir, returned) and the mesh_call tool, its
// provider the scripted one with chunks of 8 runes every delay.
func startAgentickWith(t *testing.T, cfg chat.Config, delay time.Duration) (*meshtest.Mesh, string) {
	t.Helper()
	m := meshtest.Start(t, hub.Config{})
	m.RunAgent(t, agents.NewEcho())
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	tools := chat.NewTools(chat.MeshCallTool(m.Client(t), 10*time.Second))
	rt := chat.NewRuntime(cfg, &testkit.EssayProvider{Scripted: chat.Scripted{Delay: delay}}, tools)
	t.Cleanup(func() { rt.Close(context.Background()) })
	m.RunAgent(t, chat.NewService(rt))
	return m, cfg.DataDir
}

// connectAg dials the agentick WebSocket and connects as id.
func connectAg(t *testing.T, m *meshtest.Mesh, id string) *testkit.AgentickWS {
	t.Helper()
	c, _, err := testkit.DialAgentick(t, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Write(`{"type":"connect","clientId":"` + id + `"}`)
	if v := c.Read(); v["type"] != "connected" {
		t.Fatalf("connect %s: %v", id, v)
	}
	return c
}

// untilEnd reads c's frames up to the execution_end of messageId mid and
// returns the events read; they must all be events of session.
func untilEnd(t *testing.T, c *testkit.AgentickWS, session string, mid any) []map[string]any {
	t.Helper()
	var evs []map[string]any
	for {
		v := c.Read()
		if v["type"] != "event" || v["sessionId"] != session {
			t.Fatalf("frame %v; want an event of %s", v, session)
		}
		evs = append(evs, v)
		if d, _ := v["data"].(map[string]any); v["event"] == "execution_end" && d["messageId"] == mid {
			return evs
		}
	}
}

// sendTurn sends message to session over c and returns the turn's
// messageId and its events, execution_end included.
func sendTurn(t *testing.T, c *testkit.AgentickWS, id, session, message string) (string, []map[string]any) {
	t.Helper()
	mid, _ := payload(t, "send "+message, c.Call(id, "send", map[string]any{"sessionId": session, "message": message}))["messageId"].(string)
	if mid == "" {
		t.Fatalf("send %q: no messageId", message)
	}
	return mid, untilEnd(t, c, session, mid)
}

// eventNames lists the events' names, runs of one name folded.
func eventNames(evs []map[string]any) []string {
	var out []string
	for _, v := range evs {
		out = append(out, v["event"].(string))
	}
	return slices.Compact(out)
}

// resultOf returns the data of the result event of mid.
func resultOf(t *testing.T, evs []map[string]any, mid any) map[string]any {
	t.Helper()
	for _, v := range evs {
		if d, _ := v["data"].(map[string]any); v["event"] == "result" && d["messageId"] == mid {
			return d
		}
	}
	t.Fatalf("no result for %v in %v", mid, eventNames(evs))
	return nil
}

func historyOf(t *testing.T, c *testkit.AgentickWS, id, session string) []any {
	t.Helper()
	h := payload(t, "history", c.Call(id, "history", map[string]any{"sessionId": session}))
	msgs, _ := h["messages"].([]any)
	if msgs == nil || h["hasMore"] != false {
		t.Fatalf("history of %s = %v", session, h)
	}
	return msgs
}

// quiet checks that c receives nothing for d: it waits d, then pings,
// and nothing may come before the pong. (A read deadline would do, but
// a timed-out read leaves a gorilla connection unusable.)
func quiet(t *testing.T, c *testkit.AgentickWS, what string, d time.Duration) {
	t.Helper()
	if len(c.Aside) > 0 {
		t.Errorf("%s: got %v; want nothing", what, c.Aside)
		c.Aside = nil
	}
	time.Sleep(d)
	c.Write(`{"type":"ping","timestamp":42}`)
	for {
		v := c.Read()
		if v["type"] == "pong" && v["timestamp"] == 42.0 {
			return
		}
		t.Errorf("%s: got %v; want nothing", what, v)
	}
}

// TestAgentickReset: reset over the WebSocket empties the session's
// history (the chat agent's session file is moved aside, not removed),
// and a new send runs on the empty history; an unknown session is
// NOT_FOUND_RESOURCE, a closed one STATE_ALREADY_COMPLETE.
func TestAgentickReset(t *testing.T) {
	m, dir := startAgentickWith(t, chat.Config{}, 0)
	c := connectAg(t, m, "rc")
	mid, evs := sendTurn(t, c, "1", "rs", "hello")
	if d := resultOf(t, evs, mid); d["ok"] != true {
		t.Fatalf("first turn: %v", d)
	}
	if h := historyOf(t, c, "2", "rs"); len(h) != 2 {
		t.Fatalf("history before reset: %v", h)
	}
	res := c.Call("3", "reset", map[string]any{"sessionId": "rs"})
	if p := payload(t, "reset", res); !reflect.DeepEqual(p, map[string]any{"ok": true}) {
		t.Errorf("reset payload %v; want {ok: true}", p)
	}
	if h := historyOf(t, c, "4", "rs"); len(h) != 0 {
		t.Errorf("history after reset: %v; want none", h)
	}
	st := payload(t, "status", c.Call("5", "status", map[string]any{"sessionId": "rs"}))
	if s := st["session"].(map[string]any); s["messageCount"] != 0.0 || s["isActive"] != false {
		t.Errorf("status after reset: %v", s)
	}
	aside, _ := filepath.Glob(filepath.Join(dir, "sessions", "rs.jsonl.reset-*"))
	if len(aside) != 1 {
		t.Fatalf("files aside %v; want one", aside)
	}
	if b, err := os.ReadFile(aside[0]); err != nil || !strings.Contains(string(b), `"text":"hello"`) {
		t.Errorf("file aside (%v) does not hold the old conversation: %s", err, b)
	}
	// A new send works, on the empty history.
	mid, evs = sendTurn(t, c, "6", "rs", "again")
	if d := resultOf(t, evs, mid); d["ok"] != true || d["content"] != `You said: "again" (1 messages in context)` {
		t.Errorf("turn after reset: %v", d)
	}
	if h := historyOf(t, c, "7", "rs"); len(h) != 2 || h[0].(map[string]any)["id"] != "msg-0" || h[0].(map[string]any)["content"] != "again" {
		t.Errorf("history after reset and a send: %v", h)
	}
	// Errors.
	testkit.WantAgentickErr(t, "reset of an unknown session", c.Call("8", "reset", map[string]any{"sessionId": "never"}), "NOT_FOUND_RESOURCE")
	testkit.WantAgentickErr(t, "reset without sessionId", c.Call("9", "reset", map[string]any{}), "VALIDATION_REQUIRED")
	testkit.WantAgentickErr(t, "reset of another app's session", c.Call("10", "reset", map[string]any{"sessionId": "coding:rs"}), "NOT_FOUND_RESOURCE")
	payload(t, "close", c.Call("11", "close", map[string]any{"sessionId": "rs"}))
	testkit.WantAgentickErr(t, "reset of a closed session", c.Call("12", "reset", map[string]any{"sessionId": "rs"}), "STATE_ALREADY_COMPLETE")
	// Over /invoke too.
	if st, r := testkit.AgentickInvoke(t, m, "", `{"method":"send","params":{"sessionId":"inv","message":"hi"}}`); st != 200 {
		t.Fatalf("send inv: %d %v", st, r)
	}
	meshtest.WaitFor(t, 10*time.Second, func() bool {
		_, v := testkit.AgentickInvoke(t, m, "", `{"method":"status","params":{"sessionId":"inv"}}`)
		s, _ := v["payload"].(map[string]any)["session"].(map[string]any)
		return s != nil && s["messageCount"] == 2.0 && s["isActive"] == false
	})
	if st, r := testkit.AgentickInvoke(t, m, "", `{"method":"reset","params":{"sessionId":"chat:inv"}}`); st != 200 || !reflect.DeepEqual(r["payload"], map[string]any{"ok": true}) {
		t.Errorf("reset over /invoke: HTTP %d %v", st, r)
	}
	if st, r := testkit.AgentickInvoke(t, m, "", `{"method":"reset","params":{"sessionId":"never"}}`); st != 404 {
		t.Errorf("reset of an unknown session over /invoke: HTTP %d %v; want 404", st, r)
	}
	// The schema says what reset does now.
	sch := payload(t, "schema", c.Call("13", "schema", nil))
	rm := sch["methods"].(map[string]any)["reset"].(map[string]any)
	if d, _ := rm["description"].(string); !strings.HasPrefix(d, "Reset session") || strings.Contains(d, "not supported") || !slices.Contains(rm["errors"].([]any), any("NOT_FOUND_RESOURCE")) {
		t.Errorf("schema of reset: %v", rm)
	}
	if d, _ := sch["methods"].(map[string]any)["tool-confirm"].(map[string]any)["description"].(string); !strings.Contains(d, "without asking for confirmation") {
		t.Errorf("schema of tool-confirm: %q; want it to say why it finds no call", d)
	}
	if cm := sch["methods"].(map[string]any)["chat.reset"]; cm == nil {
		t.Error("chat.reset missing from the schema's custom methods")
	}
}

// TestAgentickResetDuringTurn: a reset while a turn runs and another send
// waits behind it cancels both (each ends with result aborted, the
// waiting one without running), leaves the history empty, and the next
// send runs.
func TestAgentickResetDuringTurn(t *testing.T) {
	m, dir := startAgentickWith(t, chat.Config{}, 0)
	c := connectAg(t, m, "rd")
	mid1, _ := payload(t, "send essay", c.Call("1", "send", map[string]any{"sessionId": "rd", "message": "Write a long essay"}))["messageId"].(string)
	mid2, _ := payload(t, "send queued", c.Call("2", "send", map[string]any{"sessionId": "rd", "message": "queued"}))["messageId"].(string)
	var evs []map[string]any
	for {
		v := c.Read()
		evs = append(evs, v)
		if v["event"] == "content_delta" {
			break // the essay is running
		}
	}
	payload(t, "reset", c.Call("3", "reset", map[string]any{"sessionId": "rd"}))
	evs = append(evs, untilEnd(t, c, "rd", mid2)...)
	t.Logf("events: %v", eventNames(evs))
	for _, mid := range []string{mid1, mid2} {
		if d := resultOf(t, evs, mid); d["ok"] != false || d["aborted"] != true {
			t.Errorf("result of %s: %v; want ok false, aborted", mid, d)
		}
	}
	// The waiting send never ran: no message events after the essay's end.
	i := slices.IndexFunc(evs, func(v map[string]any) bool {
		d, _ := v["data"].(map[string]any)
		return v["event"] == "execution_end" && d["messageId"] == mid1
	})
	if got := eventNames(evs[i+1:]); !reflect.DeepEqual(got, []string{"execution_start", "result", "execution_end"}) {
		t.Errorf("events of the send waiting at the reset: %v; want execution_start, result, execution_end", got)
	}
	if h := historyOf(t, c, "4", "rd"); len(h) != 0 {
		t.Errorf("history after a reset during a turn: %v; want none", h)
	}
	// The essay's partial answer went aside with the old conversation.
	aside, _ := filepath.Glob(filepath.Join(dir, "sessions", "rd.jsonl.reset-*"))
	if len(aside) != 1 {
		t.Fatalf("files aside %v", aside)
	}
	if b, _ := os.ReadFile(aside[0]); !strings.Contains(string(b), "Once upon a time") || !strings.Contains(string(b), `"stopReason":"aborted"`) {
		t.Errorf("file aside: %s", b)
	}
	mid, evs := sendTurn(t, c, "5", "rd", "after")
	if d := resultOf(t, evs, mid); d["ok"] != true || d["content"] != `You said: "after" (1 messages in context)` {
		t.Errorf("turn after reset: %v", d)
	}
}

// TestAgentickUnsubscribe: after unsubscribe answers, no event of the
// session reaches the client, even while a turn streams, while another
// subscribed client still gets the whole turn; subscribing again
// resumes the events.
func TestAgentickUnsubscribe(t *testing.T) {
	m, _ := startAgentickWith(t, chat.Config{}, 2*time.Millisecond)
	a, b := connectAg(t, m, "A"), connectAg(t, m, "B")
	for _, c := range []*testkit.AgentickWS{a, b} {
		payload(t, "subscribe", c.Call("s", "subscribe", map[string]any{"sessionId": "us"}))
	}
	st, r := testkit.AgentickInvoke(t, m, "", `{"method":"send","params":{"sessionId":"us","message":"/long 300"}}`)
	if st != 200 {
		t.Fatalf("send: %d %v", st, r)
	}
	mid := r["payload"].(map[string]any)["messageId"]
	// A leaves in the middle of the stream.
	for {
		if v := a.Read(); v["event"] == "content_delta" {
			break
		}
	}
	res := a.Call("u", "unsubscribe", map[string]any{"sessionId": "us"})
	payload(t, "unsubscribe", res)
	a.Aside = nil // events delivered before the answer are fine
	evs := untilEnd(t, b, "us", mid)
	var text strings.Builder
	for _, v := range evs {
		if v["event"] == "content_delta" {
			text.WriteString(v["data"].(map[string]any)["delta"].(string))
		}
	}
	if d := resultOf(t, evs, mid); d["ok"] != true || text.String() != d["content"] || !strings.HasSuffix(text.String(), "word300") {
		t.Errorf("B's turn: deltas %d bytes, result %v", text.Len(), d)
	}
	quiet(t, a, "A after unsubscribe, during the turn", 300*time.Millisecond)
	// Another turn: B gets it, A nothing.
	st, r = testkit.AgentickInvoke(t, m, "", `{"method":"send","params":{"sessionId":"us","message":"hi"}}`)
	if st != 200 {
		t.Fatalf("send: %d %v", st, r)
	}
	untilEnd(t, b, "us", r["payload"].(map[string]any)["messageId"])
	quiet(t, a, "A after unsubscribe, next turn", 300*time.Millisecond)
	// Unsubscribing again, or from a session never followed, is fine.
	payload(t, "unsubscribe again", a.Call("u2", "unsubscribe", map[string]any{"sessionId": "us"}))
	// Subscribed again, A gets the next turn.
	payload(t, "subscribe again", a.Call("s2", "subscribe", map[string]any{"sessionId": "us"}))
	_, r = testkit.AgentickInvoke(t, m, "", `{"method":"send","params":{"sessionId":"us","message":"back"}}`)
	mid = r["payload"].(map[string]any)["messageId"]
	if d := resultOf(t, untilEnd(t, a, "us", mid), mid); d["ok"] != true {
		t.Errorf("A's turn after subscribing again: %v", d)
	}
}

// TestAgentickToolEvents: a turn in which the chat agent calls a tool
// (mesh_call, here of echo.echo) gives tool_call_start (model) and
// tool_result (orchestration) between the two assistant messages; a
// failing tool call gives tool_result isError; history shows the call.
func TestAgentickToolEvents(t *testing.T) {
	m, _ := startAgentickWith(t, chat.Config{}, 0)
	c := connectAg(t, m, "tc")
	mid, evs := sendTurn(t, c, "1", "tools", `/call echo.echo {"ping":1}`)
	want := []string{"execution_start", "message_start", "content_delta", "message", "tick_end", "tool_call_start", "tool_result",
		"message_start", "content_delta", "message", "tick_end", "result", "execution_end"}
	if got := eventNames(evs); !reflect.DeepEqual(got, want) {
		t.Fatalf("events %v\nwant %v", got, want)
	}
	var first, start, result, tick map[string]any
	for _, v := range evs {
		d := v["data"].(map[string]any)
		switch v["event"] {
		case "message_start":
			if first == nil {
				first = d
			}
		case "tick_end":
			if tick == nil {
				tick = d
			}
		case "tool_call_start":
			start = d
			if v["category"] != "model" {
				t.Errorf("tool_call_start category %v; want model", v["category"])
			}
		case "tool_result":
			result = d
			if v["category"] != "orchestration" {
				t.Errorf("tool_result category %v; want orchestration", v["category"])
			}
		}
	}
	if tick["stopReason"] != "tool_use" {
		t.Errorf("first tick_end %v; want stopReason tool_use", tick)
	}
	callID, _ := start["callId"].(string)
	if callID == "" || start["name"] != "mesh_call" || start["streamId"] != first["streamId"] ||
		!reflect.DeepEqual(start["input"], map[string]any{"method": "echo.echo", "params": map[string]any{"ping": 1.0}}) {
		t.Errorf("tool_call_start %v", start)
	}
	if !reflect.DeepEqual(result, map[string]any{"streamId": first["streamId"], "callId": callID, "isError": false, "result": `{"ping":1}`}) {
		t.Errorf("tool_result %v", result)
	}
	if d := resultOf(t, evs, mid); d["ok"] != true || d["content"] != `Tool mesh_call returned: {"ping":1}` {
		t.Errorf("result %v", d)
	}
	h := historyOf(t, c, "2", "tools")
	roles := []string{}
	for _, m := range h {
		roles = append(roles, m.(map[string]any)["role"].(string))
	}
	if !reflect.DeepEqual(roles, []string{"user", "assistant", "tool", "assistant"}) {
		t.Errorf("history roles %v", roles)
	} else if tc := h[1].(map[string]any)["toolCalls"]; !reflect.DeepEqual(tc, []any{map[string]any{"name": "mesh_call", "input": start["input"]}}) {
		t.Errorf("history toolCalls %v", tc)
	}
	// A tool call that fails: tool_result with isError, and the turn goes on.
	mid, evs = sendTurn(t, c, "3", "tools", `/call no.such {}`)
	var failed map[string]any
	for _, v := range evs {
		if v["event"] == "tool_result" {
			failed = v["data"].(map[string]any)
		}
	}
	if failed == nil || failed["isError"] != true || !strings.Contains(failed["result"].(string), "no.such") {
		t.Errorf("tool_result of a failing call: %v", failed)
	}
	if d := resultOf(t, evs, mid); d["ok"] != true {
		t.Errorf("result after a failing tool: %v", d)
	}
}

// TestAgentickCompaction: when the chat agent compacts its context (here
// past 4 messages, keeping 2), the turn's events carry compaction_start
// and compaction_end {removed, kept, reason} (orchestration) before the
// answer's message_start; history keeps every message. A reset clears
// the compaction state.
func TestAgentickCompaction(t *testing.T) {
	m, _ := startAgentickWith(t, chat.Config{MaxMessages: 4, KeepMessages: 2}, 0)
	c := connectAg(t, m, "cc")
	for i, msg := range []string{"one", "two"} {
		_, evs := sendTurn(t, c, "s"+msg, "comp", msg)
		if slices.Contains(eventNames(evs), "compaction_start") {
			t.Fatalf("turn %d compacted already: %v", i, eventNames(evs))
		}
	}
	_, evs := sendTurn(t, c, "s3", "comp", "three")
	want := []string{"execution_start", "compaction_start", "compaction_end", "message_start", "content_delta", "message", "tick_end", "result", "execution_end"}
	if got := eventNames(evs); !reflect.DeepEqual(got, want) {
		t.Fatalf("events of the compacting turn %v\nwant %v", got, want)
	}
	for _, v := range evs {
		switch v["event"] {
		case "compaction_start", "compaction_end":
			if v["category"] != "orchestration" || v["sessionId"] != "comp" {
				t.Errorf("%v: category %v session %v", v["event"], v["category"], v["sessionId"])
			}
		}
		if v["event"] == "compaction_end" {
			// 5 messages, keep 2 from a user message: the 4 of the first two turns go.
			if d := v["data"]; !reflect.DeepEqual(d, map[string]any{"removed": 4.0, "kept": 1.0, "reason": "count"}) {
				t.Errorf("compaction_end data %v", d)
			}
		}
	}
	if h := historyOf(t, c, "h", "comp"); len(h) != 6 {
		t.Errorf("history after compaction: %d messages; want all 6", len(h))
	}
	st := payload(t, "status", c.Call("st", "status", map[string]any{"sessionId": "comp"}))
	if s := st["session"].(map[string]any); s["messageCount"] != 2.0 {
		t.Errorf("status messageCount %v; want the 2 in context", s["messageCount"])
	}
	ctxOf := func(id string) map[string]any {
		return payload(t, "chat.get_context", c.Call(id, "chat.get_context", map[string]any{"agentId": "comp"}))
	}
	if g := ctxOf("g1"); g["compactions"] != 1.0 {
		t.Errorf("compactions %v; want 1", g["compactions"])
	}
	payload(t, "reset", c.Call("r", "reset", map[string]any{"sessionId": "comp"}))
	if g := ctxOf("g2"); g["compactions"] != 0.0 || g["message_count"] != 0.0 || g["history_count"] != 0.0 ||
		g["tokens"].(map[string]any)["messages"] != 0.0 {
		t.Errorf("context after reset %v; want no compaction, no message, no message tokens", g)
	}
}
