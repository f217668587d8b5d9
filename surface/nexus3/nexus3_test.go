package nexus3_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/agents/chat"
	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/telemetry"
)

// essayProvider is the scripted provider, except that "Write a long
// essay" (the seed's long-running request) streams a first chunk and then
// writes until it is cancelled.

// nexus3SeedReplies scripts the provider with the NEXUS3 seed's example
// conversation, answered from the context the agent keeps: a greeting,
// and a name told in one message and asked for in a later one (an agent
// that lost its context would answer that it does not know it).
func nexus3SeedReplies(req *chat.Request) (string, bool) {
	n := len(req.Messages)
	if n == 0 {
		return "", false
	}
	const told = "My name is "
	switch last := chat.TextOf(req.Messages[n-1].Content); {
	case last == "Hello":
		return "Hello! How can I help you?", true
	case strings.HasPrefix(last, told):
		return "Nice to meet you, " + strings.TrimPrefix(last, told) + "!", true
	case last == "What is my name?":
		for i := n - 2; i >= 0; i-- {
			if t := chat.TextOf(req.Messages[i].Content); req.Messages[i].Role == chat.RoleUser && strings.HasPrefix(t, told) {
				return "Your name is " + strings.TrimPrefix(t, told) + ".", true
			}
		}
		return "I do not know your name.", true
	}
	return "", false
}

type curlReply struct {
	status int
	body   []byte
}

// curl does what the seed's `curl -X POST URL [-H "Content-Type: application/json"] -d BODY` does.
func curl(t *testing.T, base, path string, jsonCT bool, body string) curlReply {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if jsonCT {
		req.Header.Set("Content-Type", "application/json")
	} else {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded") // curl -d's default
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return curlReply{res.StatusCode, b}
}

func jsonOf(t *testing.T, s []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(s, &v); err != nil {
		t.Fatalf("not JSON: %q: %v", s, err)
	}
	return v
}

// same checks that got is HTTP want status and the JSON the seed shows.
func same(t *testing.T, what string, got curlReply, status int, want string) {
	t.Helper()
	if got.status != status {
		t.Errorf("%s: HTTP %d %s; want %d", what, got.status, got.body, status)
		return
	}
	if g, w := jsonOf(t, got.body), jsonOf(t, []byte(want)); !reflect.DeepEqual(g, w) {
		t.Errorf("%s:\n got %s\nwant %s", what, got.body, want)
	}
}

// result decodes a successful NEXUS3 response with id wantID.
func result(t *testing.T, what string, got curlReply, wantID float64) map[string]any {
	t.Helper()
	if got.status != http.StatusOK {
		t.Fatalf("%s: HTTP %d %s", what, got.status, got.body)
	}
	v, _ := jsonOf(t, got.body).(map[string]any)
	r, ok := v["result"].(map[string]any)
	if v["jsonrpc"] != "2.0" || v["id"] != wantID || !ok || len(v) != 3 {
		t.Fatalf("%s: %s; want {jsonrpc 2.0, id %v, result {...}}", what, got.body, wantID)
	}
	return r
}

// TestNexus3SeedExamples replays the NEXUS3 seed's curl examples literally
// (same paths, same bodies) over real HTTP and checks the answers the seed
// shows, ids and timestamps aside.
func TestNexus3SeedExamples(t *testing.T) {
	p := &testkit.EssayProvider{}
	p.Reply = nexus3SeedReplies
	m := testkit.StartNexus3With(t, p, nil)
	u := m.HTTP

	// Create an Agent.
	same(t, "create_agent", curl(t, u, "/", true, `{"jsonrpc":"2.0","method":"create_agent","params":{"agent_id":"worker-1"},"id":1}`),
		200, `{"jsonrpc":"2.0","id":1,"result":{"agent_id":"worker-1","url":"/agent/worker-1"}}`)
	// Create Agent with Custom System Prompt.
	same(t, "create_agent with system_prompt", curl(t, u, "/", false, `{"jsonrpc":"2.0","method":"create_agent","params":{"agent_id":"coder","system_prompt":"You are a coding assistant."},"id":1}`),
		200, `{"jsonrpc":"2.0","id":1,"result":{"agent_id":"coder","url":"/agent/coder"}}`)
	// A second create of the same id is INVALID_PARAMS.
	if r := curl(t, u, "/", false, `{"jsonrpc":"2.0","method":"create_agent","params":{"agent_id":"coder"},"id":9}`); !strings.Contains(string(r.body), `"code":-32602`) {
		t.Errorf("second create_agent of coder: %s; want -32602", r.body)
	}
	// An auto-generated id: 8 hex characters.
	if r := result(t, "create_agent without id", curl(t, u, "/", false, `{"jsonrpc":"2.0","method":"create_agent","id":7}`), 7); len(r["agent_id"].(string)) != 8 || r["url"] != "/agent/"+r["agent_id"].(string) {
		t.Errorf("create_agent without id = %v", r)
	}

	// Send Message to Agent.
	r := result(t, "send", curl(t, u, "/agent/worker-1", true, `{"jsonrpc":"2.0","method":"send","params":{"content":"Hello"},"id":2}`), 2)
	// {"content":"Hello! How can I help you?","request_id":"a1b2c3d4"}
	if !reflect.DeepEqual(testkit.Keys(r), []string{"content", "request_id"}) || r["content"] != "Hello! How can I help you?" || r["request_id"] == "" {
		t.Errorf("send result = %v; want the seed's {content: Hello! How can I help you?, request_id}", r)
	}

	// List All Agents.
	r = result(t, "list_agents", curl(t, u, "/", false, `{"jsonrpc":"2.0","method":"list_agents","id":3}`), 3)
	list, _ := r["agents"].([]any)
	var w1 map[string]any
	for _, a := range list {
		if a := a.(map[string]any); a["agent_id"] == "worker-1" {
			w1 = a
		}
	}
	if len(list) != 3 || w1 == nil {
		t.Fatalf("list_agents = %v", r)
	}
	if ts, err := time.Parse(time.RFC3339Nano, w1["created_at"].(string)); err != nil || time.Since(ts) > time.Minute {
		t.Errorf("created_at %v is not a recent ISO 8601 time: %v", w1["created_at"], err)
	}
	delete(w1, "created_at")
	if want := map[string]any{"agent_id": "worker-1", "message_count": 2.0, "should_shutdown": false}; !reflect.DeepEqual(w1, want) {
		t.Errorf("list_agents entry = %v; want %v (and created_at)", w1, want)
	}

	// Multi-Turn Conversation.
	same(t, "create chat", curl(t, u, "/", false, `{"jsonrpc":"2.0","method":"create_agent","params":{"agent_id":"chat"},"id":1}`),
		200, `{"jsonrpc":"2.0","id":1,"result":{"agent_id":"chat","url":"/agent/chat"}}`)
	r = result(t, "first message", curl(t, u, "/agent/chat", false, `{"jsonrpc":"2.0","method":"send","params":{"content":"My name is Alice"},"id":2}`), 2)
	if r["content"] != "Nice to meet you, Alice!" || r["request_id"] == "" {
		t.Errorf("first message = %v; want the seed's Nice to meet you, Alice!", r)
	}
	r = result(t, "second message", curl(t, u, "/agent/chat", false, `{"jsonrpc":"2.0","method":"send","params":{"content":"What is my name?"},"id":3}`), 3)
	if r["content"] != "Your name is Alice." { // the agent keeps the context
		t.Errorf("second message = %v; want the seed's Your name is Alice.", r)
	}
	same(t, "destroy chat", curl(t, u, "/", false, `{"jsonrpc":"2.0","method":"destroy_agent","params":{"agent_id":"chat"},"id":4}`),
		200, `{"jsonrpc":"2.0","id":4,"result":{"success":true,"agent_id":"chat"}}`)

	// Cancel a Request: terminal 1 starts a long one, terminal 2 cancels it.
	term1 := make(chan curlReply, 1)
	go func() {
		term1 <- curl(t, u, "/agent/worker-1", false, `{"jsonrpc":"2.0","method":"send","params":{"content":"Write a long essay","request_id":"req-1"},"id":1}`)
	}()
	meshtest.WaitFor(t, 10*time.Second, func() bool {
		r := curl(t, u, "/agent/worker-1", false, `{"jsonrpc":"2.0","method":"get_context","id":8}`)
		return strings.Contains(string(r.body), `"busy":true`)
	})
	same(t, "cancel", curl(t, u, "/agent/worker-1", false, `{"jsonrpc":"2.0","method":"cancel","params":{"request_id":"req-1"},"id":2}`),
		200, `{"jsonrpc":"2.0","id":2,"result":{"cancelled":true,"request_id":"req-1"}}`)
	select {
	case got := <-term1:
		v, _ := jsonOf(t, got.body).(map[string]any)
		// NEXUS3's error table has no code for it: -32000 SERVER_ERROR,
		// the mesh code in the message and data.
		if e, ok := v["error"].(map[string]any); got.status != 200 || v["id"] != 1.0 || !ok || e["code"] != -32000.0 || meshCode(e) != "CANCELLED" {
			t.Errorf("the cancelled send answered HTTP %d %s; want a JSON-RPC error -32000 (data.code CANCELLED) for id 1", got.status, got.body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the cancelled send did not end")
	}
	same(t, "cancel (not found)", curl(t, u, "/agent/worker-1", false, `{"jsonrpc":"2.0","method":"cancel","params":{"request_id":"req-1"},"id":2}`),
		200, `{"jsonrpc":"2.0","id":2,"result":{"cancelled":false,"request_id":"req-1","reason":"not_found_or_completed"}}`)

	// Get Token Usage.
	r = result(t, "get_tokens", curl(t, u, "/agent/worker-1", false, `{"jsonrpc":"2.0","method":"get_tokens","id":5}`), 5)
	if !reflect.DeepEqual(testkit.Keys(r), []string{"available", "budget", "messages", "system", "tools", "total"}) ||
		r["total"] != r["system"].(float64)+r["tools"].(float64)+r["messages"].(float64) || r["messages"].(float64) == 0 ||
		r["available"].(float64) > r["budget"].(float64) {
		t.Errorf("get_tokens = %v", r)
	}
	// get_context: {"message_count": N, ...}
	r = result(t, "get_context", curl(t, u, "/agent/worker-1", false, `{"jsonrpc":"2.0","method":"get_context","id":5}`), 5)
	if r["message_count"] != 4.0 || r["agent_id"] != "worker-1" { // Hello, its answer, the essay, its aborted answer
		t.Errorf("get_context = %v; want message_count 4", r)
	}

	// Shutdown an Agent.
	same(t, "shutdown", curl(t, u, "/agent/worker-1", false, `{"jsonrpc":"2.0","method":"shutdown","id":6}`),
		200, `{"jsonrpc":"2.0","id":6,"result":{"success":true}}`)
	r = result(t, "list after shutdown", curl(t, u, "/", false, `{"jsonrpc":"2.0","method":"list_agents","id":3}`), 3)
	if !strings.Contains(testkit.MustJSON(t, r), `"agent_id":"worker-1","created_at":`) || !strings.Contains(testkit.MustJSON(t, r), `"should_shutdown":true`) {
		t.Errorf("list_agents after shutdown = %v; want worker-1 with should_shutdown true", r)
	}

	// Error Responses.
	same(t, "agent not found", curl(t, u, "/agent/nonexistent", false, `{"jsonrpc":"2.0","method":"send","params":{"content":"Hi"},"id":1}`),
		404, `{"error": "Agent not found: nonexistent"}`)
	same(t, "method not found", curl(t, u, "/agent/worker-1", false, `{"jsonrpc":"2.0","method":"unknown","id":1}`),
		200, `{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"Method not found: unknown"}}`)
	same(t, "invalid params", curl(t, u, "/agent/worker-1", false, `{"jsonrpc":"2.0","method":"send","params":{},"id":1}`),
		200, `{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"Missing required parameter: content"}}`)
	// The agent is looked up first: an unknown method of an unknown agent is a 404 too.
	same(t, "unknown method of an unknown agent", curl(t, u, "/agent/nonexistent", false, `{"jsonrpc":"2.0","method":"unknown","id":1}`),
		404, `{"error": "Agent not found: nonexistent"}`)
	same(t, "unknown global method", curl(t, u, "/", false, `{"jsonrpc":"2.0","method":"send","id":1}`),
		200, `{"jsonrpc":"2.0","id":1,"error":{"code":-32601,"message":"Method not found: send"}}`)
	same(t, "destroy_agent without agent_id", curl(t, u, "/", false, `{"jsonrpc":"2.0","method":"destroy_agent","id":1}`),
		200, `{"jsonrpc":"2.0","id":1,"error":{"code":-32602,"message":"Missing required parameter: agent_id"}}`)
	// Protocol errors: -32700 for what is not JSON, -32600 for what is not a request.
	for _, tc := range []struct{ body, code string }{
		{`{"jsonrpc":"2.0","method":`, "-32700"},
		{`[{"jsonrpc":"2.0","method":"list_agents","id":1}]`, "-32600"},
		{`{"jsonrpc":"1.0","method":"list_agents","id":1}`, "-32600"},
		{`{"jsonrpc":"2.0","method":"list_agents","params":[1],"id":1}`, "-32602"},
	} {
		if r := curl(t, u, "/", false, tc.body); r.status != 200 || !strings.Contains(string(r.body), `"code":`+tc.code) {
			t.Errorf("%s: HTTP %d %s; want error %s", tc.body, r.status, r.body, tc.code)
		}
	}

	// Notifications get no response, but run.
	for _, tc := range []struct{ path, body string }{
		{"/agent/coder", `{"jsonrpc":"2.0","method":"send","params":{"content":"note"}}`},
		{"/agent/coder", `{"jsonrpc":"2.0","method":"unknown"}`}, // no error response either
		{"/", `{"jsonrpc":"2.0","method":"create_agent","params":{"agent_id":"quiet"},"id":null}`},
	} {
		if r := curl(t, u, tc.path, false, tc.body); r.status != http.StatusNoContent || len(r.body) != 0 {
			t.Errorf("notification %s %s: HTTP %d %q; want 204 and no body", tc.path, tc.body, r.status, r.body)
		}
	}
	r = result(t, "get_context after the notification", curl(t, u, "/agent/coder", false, `{"jsonrpc":"2.0","method":"get_context","id":5}`), 5)
	if r["message_count"] != 2.0 || r["system_prompt"] != "You are a coding assistant." {
		t.Errorf("the notified send did not run: message_count %v; want 2", r["message_count"])
	}
	if r := curl(t, u, "/agent/nonexistent", false, `{"jsonrpc":"2.0","method":"send","params":{"content":"Hi"}}`); r.status != 404 {
		t.Errorf("notification to an unknown agent: HTTP %d %s; want 404", r.status, r.body)
	}

	// POST /rpc: the seed's alias of / for the global methods; the
	// mesh's own methods are still served there in the mesh's shape.
	same(t, "destroy_agent on /rpc", curl(t, u, "/rpc", false, `{"jsonrpc":"2.0","method":"destroy_agent","params":{"agent_id":"quiet"},"id":4}`),
		200, `{"jsonrpc":"2.0","id":4,"result":{"success":true,"agent_id":"quiet"}}`)
	same(t, "create_agent on /rpc", curl(t, u, "/rpc", true, `{"jsonrpc":"2.0","method":"create_agent","params":{"agent_id":"worker-2"},"id":1}`),
		200, `{"jsonrpc":"2.0","id":1,"result":{"agent_id":"worker-2","url":"/agent/worker-2"}}`)
	if r := curl(t, u, "/rpc", true, `{"jsonrpc":"2.0","method":"chat.create","params":{"agent_id":"worker-3"},"id":1}`); r.status != 200 ||
		!strings.Contains(string(r.body), `"resumed":false`) {
		t.Errorf("chat.create on /rpc: HTTP %d %s; want the mesh's answer", r.status, r.body)
	}
	if r := curl(t, u, "/rpc", true, `{"jsonrpc":"2.0","method":"chat.send","params":{"agentId":"nobody","content":"x"},"id":1}`); r.status != 200 ||
		!strings.Contains(string(r.body), `"code":"AGENT_NOT_FOUND"`) {
		t.Errorf("chat.send of an unknown agent on /rpc: HTTP %d %s; want the mesh's error", r.status, r.body)
	}

	// Destroy an Agent.
	same(t, "destroy_agent", curl(t, u, "/", false, `{"jsonrpc":"2.0","method":"destroy_agent","params":{"agent_id":"worker-1"},"id":4}`),
		200, `{"jsonrpc":"2.0","id":4,"result":{"success":true,"agent_id":"worker-1"}}`)
	same(t, "destroy_agent again", curl(t, u, "/", false, `{"jsonrpc":"2.0","method":"destroy_agent","params":{"agent_id":"worker-1"},"id":4}`),
		200, `{"jsonrpc":"2.0","id":4,"result":{"success":false,"agent_id":"worker-1"}}`)
	same(t, "send to a destroyed agent", curl(t, u, "/agent/worker-1", false, `{"jsonrpc":"2.0","method":"send","params":{"content":"Hi"},"id":1}`),
		404, `{"error": "Agent not found: worker-1"}`)

	// Other methods or paths: 404/405.
	for _, tc := range []struct {
		method, path string
		status       int
	}{{"GET", "/", 405}, {"GET", "/agent/x", 405}, {"POST", "/agent/", 404}, {"POST", "/nope", 404}} {
		req, _ := http.NewRequestWithContext(t.Context(), tc.method, u+tc.path, nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != tc.status {
			t.Errorf("%s %s: HTTP %d; want %d", tc.method, tc.path, res.StatusCode, tc.status)
		}
	}
}

// TestNexus3MetricsLikeNative: a call entering by the NEXUS3 surface is
// counted in rpc_server_call_duration_seconds under the chat method, as
// the same call made natively, success and failure alike.
func TestNexus3MetricsLikeNative(t *testing.T) {
	var hb *hub.Hub
	metrics := telemetry.NewMetrics(telemetry.NewLabeler(func(m string) bool { return hb.KnownMethod(m) }))
	m := testkit.StartNexus3(t, &hb, hub.WithTelemetry(telemetry.New(nil, metrics)))
	c := m.Client(t, mesh.WithoutReliability())
	if err := c.Call(t.Context(), "chat.create", map[string]any{"agent_id": "w"}, nil); err != nil {
		t.Fatal(err)
	}
	count := func(method, status string) uint64 {
		return testkit.HistCount(t, metrics, "rpc_server_call_duration_seconds", map[string]string{"rpc_method": method, "rpc_response_status_code": status})
	}
	for _, tc := range []struct {
		name, method, status string
		native               func() error
		nexus3               func() curlReply
		wantStatus           int
	}{
		{"get_tokens", "chat.get_tokens", "",
			func() error { return c.Call(t.Context(), "chat.get_tokens", map[string]any{"agentId": "w"}, nil) },
			func() curlReply {
				return curl(t, m.HTTP, "/agent/w", false, `{"jsonrpc":"2.0","method":"get_tokens","id":5}`)
			}, 200},
		{"send", "chat.send", "",
			func() error {
				return c.Call(t.Context(), "chat.send", map[string]any{"agentId": "w", "content": "Hello"}, nil)
			},
			func() curlReply {
				return curl(t, m.HTTP, "/agent/w", false, `{"jsonrpc":"2.0","method":"send","params":{"content":"Hello"},"id":2}`)
			}, 200},
		{"list_agents", "chat.list_agents", "",
			func() error { return c.Call(t.Context(), "chat.list_agents", nil, nil) },
			func() curlReply {
				return curl(t, m.HTTP, "/", false, `{"jsonrpc":"2.0","method":"list_agents","id":3}`)
			}, 200},
		{"unknown agent", "chat.send", "-32001",
			func() error {
				if err := c.Call(t.Context(), "chat.send", map[string]any{"agentId": "nonexistent", "content": "Hi"}, nil); err == nil {
					t.Error("native send to an unknown agent succeeded")
				}
				return nil
			},
			func() curlReply {
				return curl(t, m.HTTP, "/agent/nonexistent", false, `{"jsonrpc":"2.0","method":"send","params":{"content":"Hi"},"id":1}`)
			}, 404},
	} {
		before := count(tc.method, tc.status)
		if err := tc.native(); err != nil {
			t.Fatalf("%s native: %v", tc.name, err)
		}
		afterNative := count(tc.method, tc.status)
		if r := tc.nexus3(); r.status != tc.wantStatus {
			t.Fatalf("%s via NEXUS3: HTTP %d %s", tc.name, r.status, r.body)
		}
		afterNexus3 := count(tc.method, tc.status)
		t.Logf("%s: %s{status=%q} count %d → native %d → NEXUS3 %d", tc.name, tc.method, tc.status, before, afterNative, afterNexus3)
		if afterNative-before != 1 || afterNexus3-afterNative != 1 {
			t.Errorf("%s: %s status %q counted %d natively and %d via NEXUS3; want 1 and 1", tc.name, tc.method, tc.status, afterNative-before, afterNexus3-afterNative)
		}
	}
}

// TestNexus3TraceLikeNative: a NEXUS3 call carrying a W3C traceparent
// HTTP header makes the same spans in the hub (names, kinds, status) as
// the native call of the chat method carrying one in meta, each under its
// caller's trace and parent span.
func TestNexus3TraceLikeNative(t *testing.T) {
	exp, p := testkit.Tracing(t, "hub")
	m := testkit.StartNexus3(t, nil, hub.WithTelemetry(telemetry.New(p, nil)))
	same(t, "create_agent", curl(t, m.HTTP, "/", true, `{"jsonrpc":"2.0","method":"create_agent","params":{"agent_id":"worker-1"},"id":1}`),
		200, `{"jsonrpc":"2.0","id":1,"result":{"agent_id":"worker-1","url":"/agent/worker-1"}}`)
	const (
		nativeTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
		nexusTrace  = "5bf92f3577b34da6a3ce929d0e0e4737"
		parent      = "00f067aa0ba902b7"
	)
	body := `{"jsonrpc":"2.0","id":1,"method":"chat.send","params":{"agentId":"worker-1","content":"Hello"},"meta":{"traceparent":"00-` + nativeTrace + `-` + parent + `-01"}}`
	res, err := http.Post(m.HTTP+"/rpc", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, m.HTTP+"/agent/worker-1",
		strings.NewReader(`{"jsonrpc":"2.0","method":"send","params":{"content":"Hello"},"id":2}`))
	req.Header.Set("traceparent", "00-"+nexusTrace+"-"+parent+"-01")
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("send via NEXUS3: HTTP %d", res.StatusCode)
	}
	if err := p.ForceFlush(t.Context()); err != nil {
		t.Fatal(err)
	}
	native, viaNexus3 := testkit.SpanShapes(t, exp, nativeTrace, parent), testkit.SpanShapes(t, exp, nexusTrace, parent)
	t.Logf("spans: native %v, NEXUS3 %v", native, viaNexus3)
	if len(native) == 0 || !slices.Contains(native, "chat.send/server/Unset") || !slices.Equal(native, viaNexus3) {
		t.Errorf("spans of the native call %v, of the NEXUS3 call %v; want the same, with the chat.send server span", native, viaNexus3)
	}
}

// TestNexus3Auth: on a hub with a key the NEXUS3 surface authenticates and
// authorises like /rpc: no token is 401; a role the method's pattern does
// not allow is a PERMISSION_DENIED error, in NEXUS3's shape.
func TestNexus3Auth(t *testing.T) {
	m := testkit.SecuredHub(t, hub.Security{Roles: map[string][]string{"chat.destroy": {"writer"}, "chat.destroy_agent": {"writer"}}})
	rt := chat.NewRuntime(chat.Config{DataDir: t.TempDir()}, &chat.Scripted{}, nil)
	t.Cleanup(func() { rt.Close(context.Background()) })
	m.RunAgent(t, chat.NewService(rt, agents.WithToken(testkit.Token(t, auth.Claims{Subject: "chat", Serve: []string{"chat.*"}}, time.Hour))))
	post := func(path, tok, body string) curlReply {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, m.HTTP+path, strings.NewReader(body))
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return curlReply{res.StatusCode, b}
	}
	create := `{"jsonrpc":"2.0","method":"create_agent","params":{"agent_id":"worker-1"},"id":1}`
	destroy := `{"jsonrpc":"2.0","method":"destroy_agent","params":{"agent_id":"worker-1"},"id":4}`
	for _, path := range []string{"/", "/rpc"} {
		if r := post(path, "", create); r.status != http.StatusUnauthorized {
			t.Errorf("create_agent on %s without a token: HTTP %d %s; want 401", path, r.status, r.body)
		}
	}
	if r := post("/agent/worker-1", "", `{"jsonrpc":"2.0","method":"get_tokens","id":5}`); r.status != http.StatusUnauthorized {
		t.Errorf("get_tokens without a token: HTTP %d %s; want 401", r.status, r.body)
	}
	reader := testkit.Token(t, auth.Claims{Subject: "r", Roles: []string{"reader"}}, time.Hour)
	writer := testkit.Token(t, auth.Claims{Subject: "w", Roles: []string{"writer"}}, time.Hour)
	same(t, "reader's create_agent", post("/", reader, create), 200, `{"jsonrpc":"2.0","id":1,"result":{"agent_id":"worker-1","url":"/agent/worker-1"}}`)
	r := post("/", reader, destroy)
	v, _ := jsonOf(t, r.body).(map[string]any)
	if e, _ := v["error"].(map[string]any); r.status != 200 || e == nil || e["code"] != -32000.0 || meshCode(e) != "PERMISSION_DENIED" {
		t.Errorf("reader's destroy_agent: HTTP %d %s; want error -32000 (data.code PERMISSION_DENIED)", r.status, r.body)
	}
	same(t, "writer's destroy_agent", post("/", writer, destroy), 200, `{"jsonrpc":"2.0","id":4,"result":{"success":true,"agent_id":"worker-1"}}`)
}

// TestNexus3DuplicateKeys: an agent's params, which the surface adds
// agentId to, are refused with a key given twice, where the last one used
// to win (see the hub's TestDialectDuplicateKeys for the other dialects).
func TestNexus3DuplicateKeys(t *testing.T) {
	m := testkit.StartNexus3(t, nil)
	// The agent's params, which the surface adds agentId to, are no
	// longer decoded into a map where the last "content" won.
	got := curl(t, m.HTTP, "/agent/nobody-there", true, `{"jsonrpc":"2.0","method":"send","params":{"content":"a","content":"b"},"id":1}`)
	same(t, "duplicate param of an unknown agent", got, 404, `{"error":"Agent not found: nobody-there"}`)
	if got := curl(t, m.HTTP, "/", true, `{"jsonrpc":"2.0","method":"create_agent","params":{"agent_id":"dupper"},"id":1}`); got.status != 200 {
		t.Fatalf("create_agent: HTTP %d %s", got.status, got.body)
	}
	got = curl(t, m.HTTP, "/agent/dupper", true, `{"jsonrpc":"2.0","method":"get_tokens","params":{"x":1,"x":2},"id":2}`)
	same(t, "duplicate param", got, 200, `{"jsonrpc":"2.0","id":2,"error":{"code":-32602,"message":"Invalid params: duplicate key \"x\""}}`)
	got = curl(t, m.HTTP, "/agent/dupper", true, `{"jsonrpc":"2.0","method":"get_tokens","params":{"agentId":"someone-else"},"id":3}`)
	if r := result(t, "agentId of the path wins", got, 3); r == nil {
		t.Errorf("get_tokens: %s", got.body)
	}
}

// meshCode is the mesh code a NEXUS3 error carries in its data.
func meshCode(e map[string]any) string {
	d, _ := e["data"].(map[string]any)
	c, _ := d["code"].(string)
	return c
}
