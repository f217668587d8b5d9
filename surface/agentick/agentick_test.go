package agentick_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/agents/chat"
	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/telemetry"
)

func payload(t *testing.T, what string, res map[string]any) map[string]any {
	t.Helper()
	p, _ := res["payload"].(map[string]any)
	if res["ok"] != true || p == nil {
		t.Fatalf("%s: %v; want ok:true with a payload", what, res)
	}
	return p
}

// sse is a test client of GET /events.
type sse struct {
	t      *testing.T
	res    *http.Response
	cancel context.CancelFunc
	lines  chan string
	done   chan struct{}
	id     string // the id of the last frame next returned ("" if it had none)
	retry  string // the last retry: line's value
}

func openSSE(t *testing.T, m *meshtest.Mesh, clientID, tok string) (*sse, int) {
	t.Helper()
	s, status, _ := openSSEAt(t, m, "/events?clientId="+clientID, tok, "")
	return s, status
}

// openSSEAt opens path (with a Last-Event-ID header when lastID is not
// ""); on a status other than 200 it returns the body.
func openSSEAt(t *testing.T, m *meshtest.Mesh, path, tok, lastID string) (*sse, int, []byte) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, m.HTTP+path, nil)
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		cancel()
		return nil, res.StatusCode, body
	}
	s := &sse{t: t, res: res, cancel: cancel, lines: make(chan string, 4096), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer close(s.lines)
		sc := bufio.NewScanner(res.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			s.lines <- sc.Text()
		}
	}()
	t.Cleanup(s.close)
	return s, res.StatusCode, nil
}

func (s *sse) close() {
	s.cancel()
	s.res.Body.Close()
	<-s.done
}

// next returns the next data frame (comment lines are counted in
// comments); s.id is its id.
func (s *sse) next(comments *int) map[string]any {
	s.t.Helper()
	timeout := time.After(10 * time.Second)
	id := ""
	for {
		select {
		case l, ok := <-s.lines:
			if !ok {
				s.t.Fatal("SSE stream ended")
			}
			switch {
			case strings.HasPrefix(l, ":"):
				if comments != nil {
					*comments++
				}
			case strings.HasPrefix(l, "id: "):
				id = strings.TrimPrefix(l, "id: ")
			case strings.HasPrefix(l, "retry: "):
				s.retry = strings.TrimPrefix(l, "retry: ")
			case strings.HasPrefix(l, "data: "):
				var v map[string]any
				if err := json.Unmarshal([]byte(strings.TrimPrefix(l, "data: ")), &v); err != nil {
					s.t.Fatalf("SSE data not JSON: %q", l)
				}
				s.id = id
				return v
			case l == "":
			default:
				s.t.Fatalf("unexpected SSE line %q", l)
			}
		case <-timeout:
			s.t.Fatal("no SSE frame within 10 s")
		}
	}
}

// seedErrors is the seed's errors record, word for word.
var seedErrors = map[string]any{
	"NOT_FOUND_RESOURCE":     "Resource not found (session, method, tool)",
	"NOT_FOUND_TOOL":         "Tool not found",
	"GUARD_DENIED":           "Access denied by guard (role, permission)",
	"VALIDATION_REQUIRED":    "Required parameter missing",
	"VALIDATION_TYPE":        "Parameter type mismatch",
	"STATE_ALREADY_COMPLETE": "Operation on closed/completed resource",
	"METHOD_ERROR":           "Unhandled error in method handler",
	"INTERNAL_ERROR":         "Unexpected internal error",
}

var seedBuiltins = []string{"send", "abort", "status", "history", "reset", "close", "apps", "sessions",
	"subscribe", "unsubscribe", "channel", "channel-subscribe", "schema", "tool-catalog", "tool-confirm", "tool-dispatch"}

// TestAgentickSeedExamples replays the seed's frames literally over a real
// WebSocket and compares the answers with those the seed shows, ids aside.
func TestAgentickSeedExamples(t *testing.T) {
	m := testkit.StartNexus3(t, nil)
	c, _, err := testkit.DialAgentick(t, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Connection.
	c.Write(`{ "type": "connect", "clientId": "my-client" }`)
	got := c.Read()
	seed := map[string]any{}
	_ = json.Unmarshal([]byte(`{
"type": "connected",
"gatewayId": "gw-abc",
"protocolVersion": "1.0",
"apps": ["coding", "research"],
"sessions": []
}`), &seed)
	if !reflect.DeepEqual(testkit.Keys(got), testkit.Keys(seed)) || got["type"] != "connected" || got["protocolVersion"] != "1.0" {
		t.Fatalf("connected = %v; want the seed's fields %v", got, testkit.Keys(seed))
	}
	if id, _ := got["gatewayId"].(string); id == "" {
		t.Errorf("gatewayId = %v", got["gatewayId"])
	}
	// The apps are the mesh's (the chat runtime), not the seed's example names.
	if !reflect.DeepEqual(got["apps"], []any{"chat"}) || !reflect.DeepEqual(got["sessions"], []any{}) {
		t.Errorf("connected apps %v sessions %v; want [chat] and []", got["apps"], got["sessions"])
	}

	// Schema discovery.
	c.Write(`{ "type": "req", "id": "req-1", "method": "schema", "params": {} }`)
	res := c.Res("req-1")
	if !reflect.DeepEqual(testkit.Keys(res), []string{"id", "ok", "payload", "type"}) || res["ok"] != true {
		t.Fatalf("schema res = %v; want {type, id, ok: true, payload}", res)
	}
	p := res["payload"].(map[string]any)
	if !reflect.DeepEqual(testkit.Keys(p), []string{"errors", "events", "methods", "protocolVersion"}) || p["protocolVersion"] != "1.0" {
		t.Fatalf("schema payload keys %v", testkit.Keys(p))
	}
	if !reflect.DeepEqual(p["errors"], seedErrors) {
		t.Errorf("schema errors = %v; want the seed's %v", p["errors"], seedErrors)
	}
	methods := p["methods"].(map[string]any)
	for _, name := range seedBuiltins {
		me, _ := methods[name].(map[string]any)
		if me == nil || me["builtin"] != true || me["description"] == "" {
			t.Errorf("schema method %s = %v; want builtin with a description", name, me)
			continue
		}
		for k := range me {
			if !slices.Contains([]string{"description", "builtin", "params", "response", "errors", "roles"}, k) {
				t.Errorf("schema method %s has field %q, not in the seed's table", name, k)
			}
		}
		errs, _ := me["errors"].([]any)
		for _, e := range errs {
			if _, ok := seedErrors[e.(string)]; !ok {
				t.Errorf("schema method %s lists error %v, not a key of errors", name, e)
			}
		}
	}
	// The seed's send entry: errors include NOT_FOUND_RESOURCE and VALIDATION_REQUIRED.
	sendErrs := methods["send"].(map[string]any)["errors"].([]any)
	if !slices.Contains(sendErrs, any("NOT_FOUND_RESOURCE")) || !slices.Contains(sendErrs, any("VALIDATION_REQUIRED")) {
		t.Errorf("send errors %v", sendErrs)
	}
	// Custom methods: the mesh's, builtin false.
	if cm, _ := methods["chat.send"].(map[string]any); cm == nil || cm["builtin"] != false {
		t.Errorf("schema method chat.send = %v; want a custom method (builtin false)", cm)
	}
	cats := map[string]string{}
	for _, e := range p["events"].([]any) {
		ev := e.(map[string]any)
		cats[ev["type"].(string)] = ev["category"].(string)
	}
	for typ, cat := range map[string]string{"content_delta": "model", "execution_start": "orchestration", "result": "result", "channel": "gateway",
		"tool_call_start": "model", "message": "model", "tick_end": "orchestration", "tool_result": "orchestration"} {
		if cats[typ] != cat {
			t.Errorf("event %s: category %q; want %q (the seed's table)", typ, cats[typ], cat)
		}
	}

	// The seed's error shape.
	c.Write(`{ "type": "req", "id": "req-1", "method": "history", "params": { "sessionId": "nope" } }`)
	res = c.Res("req-1")
	if !reflect.DeepEqual(testkit.Keys(res), []string{"error", "id", "ok", "type"}) || res["ok"] != false {
		t.Fatalf("error res = %v; want {type, id, ok: false, error}", res)
	}
	if e := res["error"].(map[string]any); !reflect.DeepEqual(testkit.Keys(e), []string{"code", "message"}) || e["code"] != "NOT_FOUND_RESOURCE" {
		t.Errorf("error = %v; want {code: NOT_FOUND_RESOURCE, message}", e)
	}
	// "A send call might return NOT_FOUND_RESOURCE (bad session ID) or
	// VALIDATION_REQUIRED (missing message)."
	testkit.WantAgentickErr(t, "send to an unknown app's session", c.Call("req-2", "send", map[string]any{"sessionId": "research:main", "message": "hi"}), "NOT_FOUND_RESOURCE")
	testkit.WantAgentickErr(t, "send without message", c.Call("req-3", "send", map[string]any{"sessionId": "main"}), "VALIDATION_REQUIRED")

	// send: {messageId}; the turn's events reach the sending client.
	// The turn's first events may reach the client before send's res.
	c.Write(`{"type":"req","id":"req-4","method":"send","params":{"sessionId":"main","message":"Hello"}}`)
	var evs []string
	res = nil
	for res == nil || !slices.Contains(evs, "execution_end") {
		v := c.Read()
		if v["type"] == "res" && v["id"] == "req-4" && res == nil {
			res = v
			mid, _ := payload(t, "send", res)["messageId"].(string)
			if mid == "" || len(res["payload"].(map[string]any)) != 1 {
				t.Fatalf("send payload %v; want {messageId}", res["payload"])
			}
			continue
		}
		if v["type"] != "event" || v["sessionId"] != "main" {
			t.Fatalf("frame %v; want send's res and events of main", v)
		}
		evs = append(evs, v["event"].(string))
		if v["category"] != cats[v["event"].(string)] {
			t.Errorf("event %v: category %v; want %v", v["event"], v["category"], cats[v["event"].(string)])
		}
	}
	t.Logf("events of send: %v", evs)
	if evs[0] != "execution_start" || !slices.Contains(evs, "content_delta") || evs[len(evs)-2] != "result" {
		t.Errorf("events %v; want execution_start … content_delta … result, execution_end", evs)
	}
	// ping/pong as the gateway's protocol has it.
	c.Write(`{"type":"ping","timestamp":123}`)
	if v := c.Read(); v["type"] != "pong" || v["timestamp"] != 123.0 {
		t.Errorf("pong = %v", v)
	}
}

// TestAgentickSSETurn: a client following a session over SSE receives a
// turn's events in order, the gateway's lifecycle events around the chat
// agent's, content deltas adding up to the message, and keep-alive
// comments while idle; the stream ends with the client.
func TestAgentickSSETurn(t *testing.T) {
	m := testkit.StartNexus3(t, nil)
	s, status := openSSE(t, m, "sse-1", "")
	if status != 200 {
		t.Fatalf("GET /events: HTTP %d", status)
	}
	if h := s.res.Header.Get("Content-Type"); h != "text/event-stream" {
		t.Errorf("Content-Type %q", h)
	}
	comments := 0
	if v := s.next(&comments); v["type"] != "connected" || v["protocolVersion"] != "1.0" || v["resumed"] != nil {
		t.Fatalf("first SSE frame %v; want connected", v)
	}
	if s.id != "0" || s.retry != "1000" {
		t.Errorf("connected frame: id %q, retry %q; want id 0 (before the first event) and retry 1000", s.id, s.retry)
	}
	st, r := testkit.AgentickInvoke(t, m, "", `{"method":"subscribe","params":{"sessionId":"s1"},"clientId":"sse-1"}`)
	if st != 200 || r["ok"] != true {
		t.Fatalf("subscribe: HTTP %d %v", st, r)
	}
	st, r = testkit.AgentickInvoke(t, m, "", `{"method":"send","params":{"sessionId":"s1","message":"/long 40"}}`)
	if st != 200 || r["ok"] != true {
		t.Fatalf("send: HTTP %d %v", st, r)
	}
	mid := r["payload"].(map[string]any)["messageId"]
	start := time.Now()
	var order []string
	var text strings.Builder
	var final, result string
	for {
		v := s.next(&comments)
		if v["type"] != "event" || v["sessionId"] != "s1" {
			t.Fatalf("SSE frame %v", v)
		}
		ev, d := v["event"].(string), v["data"].(map[string]any)
		order = append(order, ev)
		switch ev {
		case "content_delta":
			text.WriteString(d["delta"].(string))
		case "message":
			for _, b := range d["message"].(map[string]any)["content"].([]any) {
				if bl := b.(map[string]any); bl["type"] == "text" {
					final += bl["text"].(string)
				}
			}
		case "result":
			if d["messageId"] != mid || d["ok"] != true {
				t.Errorf("result %v; want ok for %v", d, mid)
			}
			result, _ = d["content"].(string)
		}
		if ev == "execution_end" {
			break
		}
	}
	took := time.Since(start)
	compact := slices.Compact(slices.Clone(order))
	want := []string{"execution_start", "message_start", "content_delta", "message", "tick_end", "result", "execution_end"}
	t.Logf("SSE turn: %d events in %v, order %v", len(order), took, compact)
	if !slices.Equal(compact, want) {
		t.Errorf("event order %v; want %v", compact, want)
	}
	if text.String() != final || final != result || !strings.HasPrefix(final, "word1 word2") {
		t.Errorf("deltas %q, message %q, result %q; want the same text", text.String(), final, result)
	}
	// Idle: keep-alive comments (every 200 ms in tests).
	before := comments
	deadline := time.Now().Add(5 * time.Second)
	for comments < before+2 && time.Now().Before(deadline) {
		select {
		case l := <-s.lines:
			if strings.HasPrefix(l, ":") {
				comments++
			}
		case <-time.After(time.Second):
		}
	}
	if comments < before+2 {
		t.Errorf("keep-alive comments while idle: %d; want ≥ 2", comments-before)
	}
	// A second stream with the same clientId, without Last-Event-ID, is
	// refused (409); the first goes on (TestAgentickSSESecondStream).
	if _, st, body := openSSEAt(t, m, "/events?clientId=sse-1", "", ""); st != http.StatusConflict || !strings.Contains(string(body), "STATE_ALREADY_COMPLETE") {
		t.Errorf("second stream: HTTP %d %s; want 409 STATE_ALREADY_COMPLETE", st, body)
	}
	s.close()
	waitAgentickGone(t)
}

// agentickGoroutines counts the goroutines running the surface's code.
func agentickGoroutines() int {
	buf := make([]byte, 1<<22)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		// The gateway's methods (turns, the SSE handler serveEvents,
		// followers), a socket's and a subscription's. (Under package
		// hub these names had gone stale, "mesh.(*agentickGW)": only the
		// SSE handler was counted, and the wait ended before the turns.)
		const pkg = "github.com/agentmesh/agentmesh/surface/agentick."
		if strings.Contains(g, pkg+"(*gateway)") || strings.Contains(g, pkg+"(*agWS)") || strings.Contains(g, pkg+"(*agSub)") {
			if !strings.Contains(g, "watchDrain") {
				n++
			}
		}
	}
	return n
}

func waitAgentickGone(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for agentickGoroutines() > 0 {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("agentick goroutines left: %d\n%s", agentickGoroutines(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAgentickInvoke runs every built-in method over POST /invoke.
func TestAgentickInvoke(t *testing.T) {
	m := testkit.StartNexus3(t, nil)
	ok := func(what, body string) map[string]any {
		t.Helper()
		st, r := testkit.AgentickInvoke(t, m, "", body)
		if st != 200 || r["ok"] != true || r["type"] != "res" {
			t.Fatalf("%s: HTTP %d %v", what, st, r)
		}
		p, _ := r["payload"].(map[string]any)
		return p
	}
	fail := func(what, body string, status int, code string) map[string]any {
		t.Helper()
		st, r := testkit.AgentickInvoke(t, m, "", body)
		testkit.WantAgentickErr(t, what, r, code)
		if st != status {
			t.Errorf("%s: HTTP %d; want %d", what, st, status)
		}
		return r
	}
	apps := ok("apps", `{"method":"apps"}`)
	if !reflect.DeepEqual(apps["apps"], []any{map[string]any{"id": "chat", "name": "chat", "description": "The chat-agent runtime (agents/chat)", "isDefault": true}}) {
		t.Errorf("apps = %v", apps)
	}
	if s := ok("sessions (none)", `{"method":"sessions"}`); !reflect.DeepEqual(s["sessions"], []any{}) {
		t.Errorf("sessions = %v; want []", s)
	}
	// A send creates the session and runs the turn in the background.
	r := ok("send", `{"method":"send","params":{"sessionId":"chat:inv","message":"Hello"},"id":"x-1"}`)
	if r["messageId"] == "" {
		t.Fatal("send: no messageId")
	}
	var hist map[string]any
	meshtest.WaitFor(t, 10*time.Second, func() bool {
		_, v := testkit.AgentickInvoke(t, m, "", `{"method":"history","params":{"sessionId":"inv"}}`)
		hist, _ = v["payload"].(map[string]any)
		msgs, _ := hist["messages"].([]any)
		return len(msgs) == 2
	})
	msgs := hist["messages"].([]any)
	u, a := msgs[0].(map[string]any), msgs[1].(map[string]any)
	if u["id"] != "msg-0" || u["role"] != "user" || u["content"] != "Hello" || a["id"] != "msg-1" || a["role"] != "assistant" || hist["hasMore"] != false {
		t.Errorf("history = %v", hist)
	}
	if _, err := time.Parse(time.RFC3339Nano, u["timestamp"].(string)); err != nil {
		t.Errorf("timestamp %v: %v", u["timestamp"], err)
	}
	h1 := ok("history limit 1", `{"method":"history","params":{"sessionId":"inv","limit":1}}`)
	if m := h1["messages"].([]any); len(m) != 1 || m[0].(map[string]any)["id"] != "msg-1" || h1["hasMore"] != true {
		t.Errorf("history limit 1 = %v", h1)
	}
	hb := ok("history before", `{"method":"history","params":{"sessionId":"inv","before":"msg-1"}}`)
	if m := hb["messages"].([]any); len(m) != 1 || m[0].(map[string]any)["id"] != "msg-0" || hb["hasMore"] != false {
		t.Errorf("history before msg-1 = %v", hb)
	}
	ss := ok("sessions", `{"method":"sessions"}`)["sessions"].([]any)
	if len(ss) != 1 || ss[0].(map[string]any)["id"] != "inv" || ss[0].(map[string]any)["appId"] != "chat" || ss[0].(map[string]any)["messageCount"] != 2.0 {
		t.Errorf("sessions = %v", ss)
	}
	stat := ok("status", `{"method":"status","params":{"sessionId":"inv"}}`)
	g, sess := stat["gateway"].(map[string]any), stat["session"].(map[string]any)
	if g["sessions"] != 1.0 || !reflect.DeepEqual(g["apps"], []any{"chat"}) || sess["id"] != "inv" || sess["messageCount"] != 2.0 || sess["isActive"] != false {
		t.Errorf("status = %v", stat)
	}
	if st := ok("status (gateway only)", `{"method":"status"}`); st["session"] != nil || st["gateway"] == nil {
		t.Errorf("status without sessionId = %v", st)
	}
	tc := ok("tool-catalog", `{"method":"tool-catalog","params":{"sessionId":"inv"}}`)
	var names []string
	for _, tl := range tc["tools"].([]any) {
		names = append(names, tl.(map[string]any)["name"].(string))
	}
	if !slices.Contains(names, "chat.list") || slices.Contains(names, "mesh.ping") {
		t.Errorf("tool-catalog names %v; want the agents' methods, not the hub's built-ins", names)
	}
	td := ok("tool-dispatch", `{"method":"tool-dispatch","params":{"sessionId":"inv","tool":"chat.list","input":{}}}`)
	content := td["content"].([]any)[0].(map[string]any)
	if content["type"] != "text" || !strings.Contains(content["text"].(string), `"agent_id":"inv"`) {
		t.Errorf("tool-dispatch = %v", td)
	}
	// Custom method: the mesh's method of that name.
	st, cr := testkit.AgentickInvoke(t, m, "", `{"method":"chat.get_tokens","params":{"agentId":"inv"}}`)
	if p, _ := cr["payload"].(map[string]any); st != 200 || p["budget"] == nil {
		t.Errorf("custom chat.get_tokens: HTTP %d %v", st, cr)
	}
	// The /invoke id is echoed when given.
	if _, v := testkit.AgentickInvoke(t, m, "", `{"method":"apps","id":"mine"}`); v["id"] != "mine" {
		t.Errorf("invoke id = %v; want mine", v["id"])
	}
	ok("channel publish", `{"method":"channel","params":{"sessionId":"inv","channel":"ui","payload":{"x":1}}}`)
	fail("reset unknown", `{"method":"reset","params":{"sessionId":"never"}}`, 404, "NOT_FOUND_RESOURCE")
	fail("tool-confirm", `{"method":"tool-confirm","params":{"sessionId":"inv","callId":"c1","confirmed":true}}`, 404, "NOT_FOUND_RESOURCE")
	fail("subscribe without a stream", `{"method":"subscribe","params":{"sessionId":"inv"},"clientId":"nobody"}`, 404, "NOT_FOUND_RESOURCE")
	fail("abort with nothing running", `{"method":"abort","params":{"sessionId":"inv"}}`, 409, "STATE_ALREADY_COMPLETE")
	if c := ok("close", `{"method":"close","params":{"sessionId":"inv"}}`); c["ok"] != true {
		t.Errorf("close = %v", c)
	}
	fail("close again", `{"method":"close","params":{"sessionId":"inv"}}`, 409, "STATE_ALREADY_COMPLETE")
	fail("close unknown", `{"method":"close","params":{"sessionId":"never"}}`, 404, "NOT_FOUND_RESOURCE")
	// A closed session's history stays readable (the chat runtime's session file).
	if h := ok("history of a closed session", `{"method":"history","params":{"sessionId":"inv"}}`); len(h["messages"].([]any)) != 2 {
		t.Errorf("history after close = %v", h)
	}
}

// TestAgentickErrorCodes drives every error code of the seed, over
// /invoke and over the WebSocket.
func TestAgentickErrorCodes(t *testing.T) {
	m := testkit.StartNexus3(t, nil)
	boom := agents.New("boom")
	boom.Handle("boom.fail", func(ctx context.Context, p json.RawMessage) (any, error) {
		return nil, errors.New("handler exploded")
	})
	boom.Handle("boom.down", func(ctx context.Context, p json.RawMessage) (any, error) {
		return nil, envelope.NewError(envelope.CodeUnavailable, "backend down")
	})
	m.RunAgent(t, boom)
	type tc struct {
		name, body string
		status     int
		code       string
	}
	// Session e1 with one finished turn.
	if st, r := testkit.AgentickInvoke(t, m, "", `{"method":"send","params":{"sessionId":"e1","message":"hi"}}`); st != 200 {
		t.Fatalf("send e1: %d %v", st, r)
	}
	meshtest.WaitFor(t, 10*time.Second, func() bool {
		_, v := testkit.AgentickInvoke(t, m, "", `{"method":"status","params":{"sessionId":"e1"}}`)
		p, _ := v["payload"].(map[string]any)
		s, _ := p["session"].(map[string]any)
		return s != nil && s["isActive"] == false && s["messageCount"] == 2.0
	})
	counts := map[string]int{}
	for _, c := range []tc{
		{"unknown session", `{"method":"history","params":{"sessionId":"nope"}}`, 404, "NOT_FOUND_RESOURCE"},
		{"unknown app", `{"method":"send","params":{"sessionId":"coding:x","message":"hi"}}`, 404, "NOT_FOUND_RESOURCE"},
		{"unknown method", `{"method":"no.such"}`, 404, "NOT_FOUND_RESOURCE"},
		{"unknown tool", `{"method":"tool-dispatch","params":{"sessionId":"e1","tool":"no.such","input":{}}}`, 404, "NOT_FOUND_TOOL"},
		{"built-in is no tool", `{"method":"tool-dispatch","params":{"sessionId":"e1","tool":"mesh.ping","input":{}}}`, 404, "NOT_FOUND_TOOL"},
		{"missing sessionId", `{"method":"send","params":{"message":"hi"}}`, 400, "VALIDATION_REQUIRED"},
		{"missing method", `{"params":{}}`, 400, "VALIDATION_REQUIRED"},
		{"missing callId", `{"method":"tool-confirm","params":{"sessionId":"e1","confirmed":true}}`, 400, "VALIDATION_REQUIRED"},
		{"message not a string", `{"method":"send","params":{"sessionId":"e1","message":42}}`, 400, "VALIDATION_TYPE"},
		{"params not an object", `{"method":"apps","params":[1]}`, 400, "VALIDATION_TYPE"},
		{"limit not an integer", `{"method":"history","params":{"sessionId":"e1","limit":"ten"}}`, 400, "VALIDATION_TYPE"},
		{"not JSON", `{"method":`, 400, "VALIDATION_TYPE"},
		{"attachments", `{"method":"send","params":{"sessionId":"e1","message":"hi","attachments":[{"type":"image","data":"x","mimeType":"image/png"}]}}`, 400, "VALIDATION_TYPE"},
		{"abort idle", `{"method":"abort","params":{"sessionId":"e1"}}`, 409, "STATE_ALREADY_COMPLETE"},
		{"handler error", `{"method":"boom.fail"}`, 500, "METHOD_ERROR"},
		{"reset without sessionId", `{"method":"reset","params":{}}`, 400, "VALIDATION_REQUIRED"},
		{"mesh unavailable", `{"method":"boom.down"}`, 503, "INTERNAL_ERROR"},
	} {
		st, r := testkit.AgentickInvoke(t, m, "", c.body)
		testkit.WantAgentickErr(t, c.name, r, c.code)
		if st != c.status {
			t.Errorf("%s: HTTP %d; want %d (%v)", c.name, st, c.status, r)
		}
		if c.name == "mesh unavailable" {
			if d, _ := r["error"].(map[string]any)["details"].(map[string]any); d["meshCode"] != "UNAVAILABLE" {
				t.Errorf("unavailable: details %v; want meshCode UNAVAILABLE", d)
			}
		}
		counts[c.code]++
	}
	// abort of a running turn: the turn ends with result ok:false, aborted.
	c, _, err := testkit.DialAgentick(t, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Write(`{"type":"req","id":"early","method":"apps","params":{}}`)
	testkit.WantAgentickErr(t, "req before connect", c.Res("early"), "VALIDATION_REQUIRED")
	counts["VALIDATION_REQUIRED"]++
	c.Write(`{"type":"connect"}`)
	if v := c.Read(); v["type"] != "error" || v["code"] != "VALIDATION_REQUIRED" {
		t.Errorf("connect without clientId: %v", v)
	}
	c.Write(`not json`)
	if v := c.Read(); v["type"] != "error" || v["code"] != "VALIDATION_TYPE" {
		t.Errorf("not JSON: %v", v)
	}
	c.Write(`{"type":"req","id":"deep","method":"apps","params":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`)
	testkit.WantAgentickErr(t, "too deep", c.Res("deep"), "VALIDATION_TYPE")
	c.Write(`{"type":"connect","clientId":"errs"}`)
	if v := c.Read(); v["type"] != "connected" {
		t.Fatalf("connect: %v", v)
	}
	c.Write(`{"type":"connect","clientId":"errs"}`)
	if v := c.Read(); v["type"] != "error" || v["code"] != "STATE_ALREADY_COMPLETE" {
		t.Errorf("second connect: %v", v)
	}
	res := c.Call("s", "send", map[string]any{"sessionId": "essay", "message": "Write a long essay"})
	mid := payload(t, "send essay", res)["messageId"]
	// Wait for its first delta: the turn is running.
	for {
		v := c.Read()
		if v["event"] == "content_delta" {
			break
		}
	}
	if r := c.Call("a", "abort", map[string]any{"sessionId": "essay"}); r["ok"] != true || r["payload"] != nil {
		t.Errorf("abort = %v; want ok with no payload", r)
	}
	for {
		v := c.Read()
		if v["event"] == "result" {
			d := v["data"].(map[string]any)
			if d["messageId"] != mid || d["ok"] != false || d["aborted"] != true {
				t.Errorf("result after abort %v", d)
			}
			break
		}
	}
	t.Logf("error codes driven: %v", counts)
	for code := range seedErrors {
		if counts[code] == 0 && code != "GUARD_DENIED" { // GUARD_DENIED: TestAgentickAuth
			t.Errorf("error code %s not driven", code)
		}
	}
}

// TestAgentickAuth: on a hub with a key, every agentick entry refuses a
// request without a token (401) and a wrong role gets GUARD_DENIED:
// by the role table's entry for the agentick method, or for the mesh
// method it maps onto.
func TestAgentickAuth(t *testing.T) {
	m := testkit.SecuredHub(t, hub.Security{Roles: map[string][]string{"chat.destroy": {"writer"}, "agentick.tool-catalog": {"tools"}}})
	rt := chat.NewRuntime(chat.Config{DataDir: t.TempDir()}, &chat.Scripted{}, nil)
	t.Cleanup(func() { rt.Close(context.Background()) })
	m.RunAgent(t, chat.NewService(rt, agents.WithToken(testkit.Token(t, auth.Claims{Subject: "chat", Serve: []string{"chat.*"}}, time.Hour))))
	if st, _ := testkit.AgentickInvoke(t, m, "", `{"method":"apps"}`); st != http.StatusUnauthorized {
		t.Errorf("/invoke without a token: HTTP %d; want 401", st)
	}
	if _, st := openSSE(t, m, "x", ""); st != http.StatusUnauthorized {
		t.Errorf("/events without a token: HTTP %d; want 401", st)
	}
	if _, res, err := testkit.DialAgentick(t, m, nil); err == nil || res == nil || res.StatusCode != http.StatusUnauthorized {
		t.Errorf("WebSocket without a token: %v %v; want 401", res, err)
	}
	reader := testkit.Token(t, auth.Claims{Subject: "r", Roles: []string{"reader"}}, time.Hour)
	writer := testkit.Token(t, auth.Claims{Subject: "w", Roles: []string{"writer", "tools"}}, time.Hour)
	st, r := testkit.AgentickInvoke(t, m, reader, `{"method":"send","params":{"sessionId":"a1","message":"hi"}}`)
	if st != 200 || r["ok"] != true {
		t.Fatalf("reader's send: %d %v", st, r)
	}
	st, r = testkit.AgentickInvoke(t, m, reader, `{"method":"close","params":{"sessionId":"a1"}}`)
	testkit.WantAgentickErr(t, "reader's close (chat.destroy needs writer)", r, "GUARD_DENIED")
	if st != 403 {
		t.Errorf("reader's close: HTTP %d; want 403", st)
	}
	st, r = testkit.AgentickInvoke(t, m, reader, `{"method":"tool-catalog","params":{"sessionId":"a1"}}`)
	testkit.WantAgentickErr(t, "reader's tool-catalog (agentick.tool-catalog needs tools)", r, "GUARD_DENIED")
	if st != 403 {
		t.Errorf("reader's tool-catalog: HTTP %d; want 403", st)
	}
	if st, r := testkit.AgentickInvoke(t, m, writer, `{"method":"tool-catalog","params":{"sessionId":"a1"}}`); st != 200 || r["ok"] != true {
		t.Errorf("writer's tool-catalog: %d %v", st, r)
	}
	// The schema shows the roles of the role table.
	_, sch := testkit.AgentickInvoke(t, m, writer, `{"method":"schema"}`)
	methods := sch["payload"].(map[string]any)["methods"].(map[string]any)
	if roles := methods["tool-catalog"].(map[string]any)["roles"]; !reflect.DeepEqual(roles, []any{"tools"}) {
		t.Errorf("schema roles of tool-catalog %v; want [tools]", roles)
	}
	// close inherits chat.destroy's roles (the method behind it); the
	// mesh's built-ins are listed (callable here as custom methods),
	// builtin true, admin ones with their role; agent control is not.
	if roles := methods["close"].(map[string]any)["roles"]; !reflect.DeepEqual(roles, []any{"writer"}) {
		t.Errorf("schema roles of close %v; want [writer] (chat.destroy's)", roles)
	}
	if ma, ok := methods["mesh.agents"].(map[string]any); !ok || ma["builtin"] != true || !reflect.DeepEqual(ma["roles"], []any{"admin"}) {
		t.Errorf("schema entry of mesh.agents %v; want builtin, roles [admin]", methods["mesh.agents"])
	}
	if _, ok := methods["agent.register"]; ok {
		t.Error("schema lists agent.register, which no gateway client can call")
	}
	// Over the WebSocket with a token (as a subprotocol, as browsers can).
	c, _, err := testkit.DialAgentick(t, m, http.Header{"Sec-WebSocket-Protocol": {"bearer." + reader}})
	if err != nil {
		t.Fatal(err)
	}
	c.Write(`{"type":"connect","clientId":"rc"}`)
	if v := c.Read(); v["type"] != "connected" || !reflect.DeepEqual(v["sessions"], []any{"a1"}) {
		t.Fatalf("connected %v", v)
	}
	testkit.WantAgentickErr(t, "reader's close over WS", c.Call("1", "close", map[string]any{"sessionId": "a1"}), "GUARD_DENIED")
	if r := c.Call("2", "close", map[string]any{"sessionId": "a1"}); r["error"].(map[string]any)["message"] == "" {
		t.Error("no message")
	}
	// Another caller cannot take over a clientId.
	if _, st := openSSE(t, m, "rc", writer); st != http.StatusForbidden {
		t.Errorf("writer taking reader's clientId: HTTP %d; want 403", st)
	}
	wc, _, err := testkit.DialAgentick(t, m, http.Header{"Authorization": {"Bearer " + writer}})
	if err != nil {
		t.Fatal(err)
	}
	wc.Write(`{"type":"connect","clientId":"wc"}`)
	wc.Read()
	if r := wc.Call("3", "close", map[string]any{"sessionId": "a1"}); r["ok"] != true {
		t.Errorf("writer's close: %v", r)
	}
}

// TestAgentickNoGoroutineLeft: a WebSocket client subscribed to a session
// with a turn running, and an SSE client, leave no goroutine of the
// surface behind once they disconnect.
func TestAgentickNoGoroutineLeft(t *testing.T) {
	m := testkit.StartNexus3(t, nil)
	// Everything running now (the hub, the chat agent) may stay; nothing
	// the clients start may.
	testkit.AgentickInvoke(t, m, "", `{"method":"apps"}`) // the hub's agentick state (its drain watcher lives with the hub)
	http.DefaultClient.CloseIdleConnections()
	base := goleak.IgnoreCurrent()
	// Idle workers of the links' worker pools (link.go) and the writers of
	// links that stay (the chat agent's; conn.go starts a writer when a
	// frame is queued and lets it linger a second) wind down on their own
	// clock.
	workers := goleak.IgnoreTopFunction("github.com/agentmesh/agentmesh/link.(*Link).worker")
	writers := goleak.IgnoreTopFunction("github.com/agentmesh/agentmesh/link/wsconn.(*Conn).writeLoop")
	for round := range 3 {
		c, _, err := testkit.DialAgentick(t, m, nil)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(`{"type":"connect","clientId":"leak"}`)
		c.Read()
		payload(t, "send", c.Call("1", "send", map[string]any{"sessionId": "leak", "message": "/long 2000"}))
		payload(t, "subscribe", c.Call("2", "subscribe", map[string]any{"sessionId": "other"}))
		s, _ := openSSE(t, m, "leak-sse", "")
		s.next(nil)
		testkit.AgentickInvoke(t, m, "", `{"method":"subscribe","params":{"sessionId":"leak"},"clientId":"leak-sse"}`)
		n := agentickGoroutines()
		c.WS.Close()
		s.close()
		start := time.Now()
		waitAgentickGone(t)
		t.Logf("round %d: %d surface goroutines while connected, 0 %v after disconnect", round, n, time.Since(start))
		if n == 0 {
			t.Error("no surface goroutine seen while connected: the count checks nothing")
		}
		http.DefaultClient.CloseIdleConnections()
		if err := goleak.Find(base, workers, writers); err != nil {
			t.Errorf("round %d: goroutines left after disconnect: %v", round, err)
		}
	}
}

// TestAgentickMetricsLikeNative: a call entering by the agentick surface
// is counted in rpc_server_call_duration_seconds under the chat method it
// maps onto, as the same call made natively, success and failure alike.
func TestAgentickMetricsLikeNative(t *testing.T) {
	var hb *hub.Hub
	metrics := telemetry.NewMetrics(telemetry.NewLabeler(func(m string) bool { return hb.KnownMethod(m) }))
	m := testkit.StartNexus3(t, &hb, hub.WithTelemetry(telemetry.New(nil, metrics)))
	c := m.Client(t, mesh.WithoutReliability())
	count := func(method, status string) uint64 {
		return testkit.HistCount(t, metrics, "rpc_server_call_duration_seconds", map[string]string{"rpc_method": method, "rpc_response_status_code": status})
	}
	for _, tc := range []struct {
		name, method, status string
		native               func() error
		agentick             string
		wantStatus           int
	}{
		{"sessions", "chat.list", "",
			func() error { return c.Call(t.Context(), "chat.list", nil, nil) },
			`{"method":"sessions"}`, 200},
		{"history of an unknown session", "chat.getAgentMessages", "-32001",
			func() error {
				if err := c.Call(t.Context(), "chat.getAgentMessages", map[string]any{"agentId": "nope", "offset": 0, "limit": 1}, nil); err == nil {
					t.Error("native getAgentMessages of an unknown agent succeeded")
				}
				return nil
			},
			`{"method":"history","params":{"sessionId":"nope"}}`, 404},
	} {
		before := count(tc.method, tc.status)
		if err := tc.native(); err != nil {
			t.Fatalf("%s native: %v", tc.name, err)
		}
		afterNative := count(tc.method, tc.status)
		if st, r := testkit.AgentickInvoke(t, m, "", tc.agentick); st != tc.wantStatus {
			t.Fatalf("%s via agentick: HTTP %d %v", tc.name, st, r)
		}
		afterAg := count(tc.method, tc.status)
		t.Logf("%s: %s{status=%q} count %d → native %d → agentick %d", tc.name, tc.method, tc.status, before, afterNative, afterAg)
		if afterNative-before != 1 || afterAg-afterNative != 1 {
			t.Errorf("%s: counted %d natively and %d via agentick; want 1 and 1", tc.name, afterNative-before, afterAg-afterNative)
		}
	}
}

// TestAgentickTraceLikeNative: an /invoke call carrying a W3C traceparent
// header makes the same spans in the hub (names, kinds, status) as the
// native call of the chat method it maps onto, each under its caller's
// trace and parent span.
func TestAgentickTraceLikeNative(t *testing.T) {
	exp, p := testkit.Tracing(t, "hub")
	m := testkit.StartNexus3(t, nil, hub.WithTelemetry(telemetry.New(p, nil)))
	const (
		nativeTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
		agTrace     = "6bf92f3577b34da6a3ce929d0e0e4738"
		parent      = "00f067aa0ba902b7"
	)
	body := `{"jsonrpc":"2.0","id":1,"method":"chat.list","params":{},"meta":{"traceparent":"00-` + nativeTrace + `-` + parent + `-01"}}`
	res, err := http.Post(m.HTTP+"/rpc", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if st, r := testkit.AgentickInvoke(t, m, "", `{"method":"sessions"}`, "traceparent", "00-"+agTrace+"-"+parent+"-01"); st != 200 {
		t.Fatalf("sessions: HTTP %d %v", st, r)
	}
	if err := p.ForceFlush(t.Context()); err != nil {
		t.Fatal(err)
	}
	native, viaAg := testkit.SpanShapes(t, exp, nativeTrace, parent), testkit.SpanShapes(t, exp, agTrace, parent)
	t.Logf("spans: native %v, agentick %v", native, viaAg)
	if len(native) == 0 || !slices.Contains(native, "chat.list/server/Unset") || !slices.Equal(native, viaAg) {
		t.Errorf("spans of the native call %v, of the agentick call %v; want the same, with the chat.list server span", native, viaAg)
	}
}

// TestAgentickChannel: a channel message reaches the clients subscribed
// to that session's channel, and only them.
func TestAgentickChannel(t *testing.T) {
	m := testkit.StartNexus3(t, nil)
	if st, r := testkit.AgentickInvoke(t, m, "", `{"method":"send","params":{"sessionId":"room","message":"hi"}}`); st != 200 {
		t.Fatalf("send: %d %v", st, r)
	}
	a, _, _ := testkit.DialAgentick(t, m, nil)
	b, _, _ := testkit.DialAgentick(t, m, nil)
	for _, c := range []struct {
		ws *testkit.AgentickWS
		id string
	}{{a, "A"}, {b, "B"}} {
		c.ws.Write(`{"type":"connect","clientId":"` + c.id + `"}`)
		c.ws.Read()
	}
	payload(t, "channel-subscribe", a.Call("1", "channel-subscribe", map[string]any{"sessionId": "room", "channel": "cursor"}))
	testkit.WantAgentickErr(t, "channel-subscribe unknown session", a.Call("2", "channel-subscribe", map[string]any{"sessionId": "void", "channel": "cursor"}), "NOT_FOUND_RESOURCE")
	payload(t, "channel", b.Call("3", "channel", map[string]any{"sessionId": "room", "channel": "cursor", "payload": map[string]any{"x": 7}}))
	payload(t, "channel other", b.Call("4", "channel", map[string]any{"sessionId": "room", "channel": "other", "payload": 1}))
	v := a.Read()
	d, _ := v["data"].(map[string]any)
	if v["type"] != "event" || v["event"] != "channel" || v["category"] != "gateway" || v["sessionId"] != "room" ||
		d["channel"] != "cursor" || d["from"] != "B" || !reflect.DeepEqual(d["payload"], map[string]any{"x": 7.0}) {
		t.Errorf("channel event %v", v)
	}
	// Nothing else arrives for A (not subscribed to "other").
	a.WS.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, msg, err := a.WS.ReadMessage(); err == nil {
		t.Errorf("A got %s; want nothing", msg)
	}
}

// TestAgentickLongTurn: a subscriber follows a long answer (1200 words,
// each message_update event carrying the whole text so far) to its end,
// deltas adding up to the text, and the chat agent keeps its link: the
// surface polls chat.events in pages small enough for the link's limit.
func TestAgentickLongTurn(t *testing.T) {
	m := testkit.StartNexus3(t, nil)
	c, _, err := testkit.DialAgentick(t, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Write(`{"type":"connect","clientId":"long"}`)
	c.Read()
	start := time.Now()
	payload(t, "send", c.Call("1", "send", map[string]any{"sessionId": "long", "message": "/long 1200"}))
	var text strings.Builder
	deltas := 0
	var result string
	for {
		v := c.Read()
		d, _ := v["data"].(map[string]any)
		switch v["event"] {
		case "content_delta":
			deltas++
			text.WriteString(d["delta"].(string))
		case "result":
			result, _ = d["content"].(string)
		}
		if v["event"] == "execution_end" {
			break
		}
	}
	t.Logf("long turn: %d deltas, %d bytes, %v", deltas, text.Len(), time.Since(start))
	if result == "" || text.String() != result || !strings.HasSuffix(result, "word1200") {
		t.Errorf("deltas add up to %d bytes, result %d bytes; want the same 1200 words", text.Len(), len(result))
	}
	if err := m.Client(t).Call(t.Context(), "chat.list", nil, nil); err != nil {
		t.Errorf("chat.list after the long turn: %v (the chat agent lost its link?)", err)
	}
}

// TestAgentickDrain: a hub with agentick clients following sessions
// (long polls of chat.events in flight) drains promptly: the clients are
// closed once the drain starts instead of holding it for a poll's 10 s.
func TestAgentickDrain(t *testing.T) {
	m := testkit.StartNexus3(t, nil)
	c, _, err := testkit.DialAgentick(t, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.Write(`{"type":"connect","clientId":"d1"}`)
	c.Read()
	payload(t, "subscribe", c.Call("1", "subscribe", map[string]any{"sessionId": "d"}))
	s, _ := openSSE(t, m, "d2", "")
	s.next(nil)
	if st, r := testkit.AgentickInvoke(t, m, "", `{"method":"subscribe","params":{"sessionId":"d"},"clientId":"d2"}`); st != 200 {
		t.Fatalf("subscribe d2: %d %v", st, r)
	}
	time.Sleep(200 * time.Millisecond) // the long polls are waiting
	start := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := m.Hub.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	took := time.Since(start)
	t.Logf("drain with 2 agentick subscribers: %v", took)
	if took > 5*time.Second {
		t.Errorf("drain took %v; want well under a long poll's 10 s", took)
	}
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		t.Error("the SSE stream did not end with the hub")
	}
	_ = c.WS.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		if _, _, err := c.WS.ReadMessage(); err != nil {
			break
		}
	}
	waitAgentickGone(t)
}

// TestAgentickSendBound: the sends of one session waiting here are
// bounded; past the bound a send is refused at once (INTERNAL_ERROR,
// mesh code OVERLOADED, HTTP 429) and other sessions are served.
func TestAgentickSendBound(t *testing.T) {
	m := testkit.StartNexus3(t, nil)
	accepted, refused := 0, 0
	for range 20 {
		st, r := testkit.AgentickInvoke(t, m, "", `{"method":"send","params":{"sessionId":"busy","message":"Write a long essay"}}`)
		switch {
		case st == 200:
			accepted++
		case st == 429 && r["error"].(map[string]any)["code"] == "INTERNAL_ERROR" &&
			r["error"].(map[string]any)["details"].(map[string]any)["meshCode"] == "OVERLOADED":
			refused++
		default:
			t.Fatalf("send: HTTP %d %v", st, r)
		}
	}
	t.Logf("20 sends to a stuck session: %d accepted, %d refused", accepted, refused)
	if accepted != 16 || refused != 4 {
		t.Errorf("accepted %d, refused %d; want 16 and 4", accepted, refused)
	}
	if st, r := testkit.AgentickInvoke(t, m, "", `{"method":"send","params":{"sessionId":"free","message":"hi"}}`); st != 200 {
		t.Errorf("another session's send: HTTP %d %v", st, r)
	}
	if st, r := testkit.AgentickInvoke(t, m, "", `{"method":"abort","params":{"sessionId":"busy"}}`); st != 200 {
		t.Errorf("abort: HTTP %d %v", st, r)
	}
	if st, r := testkit.AgentickInvoke(t, m, "", `{"method":"close","params":{"sessionId":"busy"}}`); st != 200 {
		t.Errorf("close: HTTP %d %v", st, r)
	}
	waitAgentickGone(t)
}

// TestAgentickRoot: the seed's clients connect to ws://host:port; the
// same endpoint answers at /agentick/ws; a plain GET / is refused 405
// and POST / is still NEXUS3's.
func TestAgentickRoot(t *testing.T) {
	m := testkit.StartNexus3(t, nil)
	for _, url := range []string{"ws://" + m.Addr, "ws://" + m.Addr + "/", "ws://" + m.Addr + "/agentick/ws"} {
		c, res, err := testkit.DialAgentickAt(t, url, nil)
		if err != nil {
			t.Fatalf("dial %s: %v (%v)", url, err, res)
		}
		c.Write(`{"type":"connect","clientId":"root"}`)
		if v := c.Read(); v["type"] != "connected" || v["protocolVersion"] != "1.0" {
			t.Errorf("%s: connect answered %v", url, v)
		}
		payload(t, "sessions via "+url, c.Call("1", "sessions", nil))
		c.WS.Close()
	}
	res, err := http.Get("http://" + m.Addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMethodNotAllowed || res.Header.Get("Allow") != "POST" {
		t.Errorf("plain GET / = %d (Allow %q); want 405, Allow: POST", res.StatusCode, res.Header.Get("Allow"))
	}
	if st, r := testkit.AgentickInvoke(t, m, "", `{"method":"sessions"}`); st != 200 {
		t.Errorf("POST /invoke after: %d %v", st, r)
	}
	res, err = http.Post("http://"+m.Addr+"/", "application/json", strings.NewReader(`{"jsonrpc":"2.0","method":"list_agents","id":1}`))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Errorf("NEXUS3 POST / = %d; want 200", res.StatusCode)
	}
}

// TestAgentickReqRightAfterConnect: a req sent on the heels of connect
// (the same burst of frames) is answered after connected, never before:
// connected is built from calls into the mesh, and a req whose answer
// needs none (an unknown method, a schema) was ready first.
func TestAgentickReqRightAfterConnect(t *testing.T) {
	m := testkit.StartNexus3(t, nil)
	for i := range 20 {
		c, _, err := testkit.DialAgentick(t, m, nil)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(fmt.Sprintf(`{"type":"connect","clientId":"quick-%d"}`, i))
		c.Write(`{"type":"req","id":"r1","method":"no-such-method","params":{}}`)
		c.Write(`{"type":"req","id":"r2","method":"schema","params":{}}`)
		if first := c.Read(); first["type"] != "connected" {
			t.Fatalf("round %d: the first frame is %v; want connected, before any res", i, first)
		}
		for range 2 {
			if f := c.Read(); f["type"] != "res" {
				t.Fatalf("round %d: %v; want the two answers after connected", i, f)
			}
		}
		c.WS.Close()
	}
}

// TestAgentickRefusalRightAfterConnect: frames the socket's reader
// answers itself (refused at decode, a ping, a second connect) sent on
// the heels of connect are answered after connected, in their order,
// never before it.
func TestAgentickRefusalRightAfterConnect(t *testing.T) {
	m := testkit.StartNexus3(t, nil)
	for i := range 20 {
		c, _, err := testkit.DialAgentick(t, m, nil)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(fmt.Sprintf(`{"type":"connect","clientId":"early-%d"}`, i))
		c.Write(`{"type":"req","id":"bad"}`)
		c.Write(`{"type":"ping","timestamp":7}`)
		c.Write(`{"type":"connect","clientId":"again"}`)
		c.Write(`not json`)
		if first := c.Read(); first["type"] != "connected" {
			t.Fatalf("round %d: the first frame is %v; want connected, before any answer", i, first)
		}
		if v := c.Read(); v["type"] != "res" || v["id"] != "bad" || v["ok"] != false {
			t.Fatalf("round %d: %v; want the refusal of req bad", i, v)
		}
		if v := c.Read(); v["type"] != "pong" || v["timestamp"] != 7.0 {
			t.Fatalf("round %d: %v; want the pong", i, v)
		}
		if v := c.Read(); v["type"] != "error" || v["code"] != "STATE_ALREADY_COMPLETE" {
			t.Fatalf("round %d: %v; want the second connect's refusal", i, v)
		}
		if v := c.Read(); v["type"] != "error" || v["code"] != "VALIDATION_TYPE" {
			t.Fatalf("round %d: %v; want the refusal of the frame that is not JSON", i, v)
		}
		// After connected, answers go out at once again.
		c.Write(`{"type":"ping","timestamp":8}`)
		if v := c.Read(); v["type"] != "pong" || v["timestamp"] != 8.0 {
			t.Fatalf("round %d: %v; want the pong", i, v)
		}
		c.WS.Close()
	}
}
