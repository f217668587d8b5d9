package mcp_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/telemetry"
)

func toolNames(r *mcp.ListToolsResult) []string {
	var out []string
	for _, t := range r.Tools {
		out = append(out, t.Name)
	}
	return out
}

func textOf(t *testing.T, r *mcp.CallToolResult) string {
	t.Helper()
	if len(r.Content) != 1 {
		t.Fatalf("tool result has %d content items; want 1", len(r.Content))
	}
	tc, ok := r.Content[0].(*mcp.TextContent)
	if !ok {
		t.Fatalf("tool result content is %T; want text", r.Content[0])
	}
	return tc.Text
}

// TestMCPServer: the official MCP Go SDK's client, over Streamable HTTP,
// lists the mesh's agent methods as tools (with the schemas the agents
// declared, no built-ins), calls echo.echo and gets its result as text
// JSON and structured content, and gets a failing call back as an error
// result carrying the mesh code. The tool call goes through the hub's
// ingress: it is counted in the same server metrics as a native call.
func TestMCPServer(t *testing.T) {
	var hb *hub.Hub
	metrics := telemetry.NewMetrics(telemetry.NewLabeler(func(m string) bool { return hb.KnownMethod(m) }))
	m := meshtest.Start(t, hub.Config{}, hub.WithTelemetry(telemetry.New(nil, metrics)))
	hb = m.Hub
	m.RunAgent(t, agents.NewEcho())
	m.RunAgent(t, agents.NewKV())
	plain := agents.New("plain") // declares no schema: its tool has no outputSchema
	plain.Handle("plain.fail", func(context.Context, json.RawMessage) (any, error) {
		return nil, envelope.NewError(envelope.CodeInvalidParams, "plain.fail always fails")
	})
	m.RunAgent(t, plain)
	s, err := testkit.MCPConnect(t, m, "")
	if err != nil {
		t.Fatalf("MCP connect: %v", err)
	}
	if init := s.InitializeResult(); init == nil || init.Capabilities == nil || init.Capabilities.Tools == nil || init.ServerInfo.Name != "agentmesh" {
		t.Errorf("initialize result %+v; want agentmesh with tools", init)
	}
	tools, err := s.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatalf("tools/list: %v", err)
	}
	want := []string{"echo.echo", "echo.sleep", "memory.delete", "memory.get", "memory.put", "memory.query", "plain.fail"}
	if got := toolNames(tools); !slices.Equal(got, want) {
		t.Errorf("tools/list = %v; want %v (agent methods only)", got, want)
	}
	for _, tool := range tools.Tools {
		in, _ := json.Marshal(tool.InputSchema)
		var sch testkit.JSONSchema
		_ = json.Unmarshal(in, &sch)
		if sch.Type != "object" || (tool.Description == "" && tool.Name != "plain.fail") {
			t.Errorf("tool %s: input schema %s, description %q; want an object schema and a description", tool.Name, in, tool.Description)
		}
		if tool.Name == "memory.put" && !slices.Equal(sch.Required, []string{"key", "value"}) {
			t.Errorf("tool memory.put input schema %s; want key and value required (the kv agent's declared schema)", in)
		}
	}

	before := testkit.HistCount(t, metrics, "rpc_server_call_duration_seconds", map[string]string{"rpc_method": "echo.echo", "rpc_response_status_code": ""})
	res, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "echo.echo", Arguments: map[string]any{"hello": "mcp", "n": 7}})
	if err != nil {
		t.Fatalf("tools/call echo.echo: %v", err)
	}
	var echoed map[string]any
	if res.IsError || json.Unmarshal([]byte(textOf(t, res)), &echoed) != nil || echoed["hello"] != "mcp" || echoed["n"] != 7.0 {
		t.Errorf("tools/call echo.echo = error %v, text %q; want the arguments back as JSON", res.IsError, textOf(t, res))
	}
	if sc, ok := res.StructuredContent.(map[string]any); !ok || sc["hello"] != "mcp" {
		t.Errorf("tools/call echo.echo structured content = %#v; want the result object", res.StructuredContent)
	}
	if after := testkit.HistCount(t, metrics, "rpc_server_call_duration_seconds", map[string]string{"rpc_method": "echo.echo", "rpc_response_status_code": ""}); after != before+1 {
		t.Errorf("echo.echo server calls counted %d -> %d; want one more for the MCP call", before, after)
	}

	res, err = s.CallTool(t.Context(), &mcp.CallToolParams{Name: "memory.put", Arguments: map[string]any{"key": "k", "value": []int{1, 2}}})
	if err != nil || res.IsError {
		t.Fatalf("tools/call memory.put = %+v, %v", res, err)
	}
	res, err = s.CallTool(t.Context(), &mcp.CallToolParams{Name: "memory.get", Arguments: map[string]any{"key": "k"}})
	if err != nil || res.IsError || !strings.Contains(textOf(t, res), `"value":[1,2]`) {
		t.Errorf("tools/call memory.get = %+v, %v; want the value stored through MCP", res, err)
	}

	// Failures are tool results with isError and the mesh code, in the
	// text and in _meta; as structured content too, unless the tool
	// declares an outputSchema (memory.get does: a client validates
	// structured content against it, error results included).
	listed, err := s.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	declares := map[string]bool{} // the tool has an outputSchema
	for _, tool := range listed.Tools {
		declares[tool.Name] = tool.OutputSchema != nil
	}
	if !declares["memory.get"] {
		t.Fatal("memory.get lists no outputSchema; the cases below need one that does")
	}
	for _, c := range []struct {
		name string
		args any
		code string
	}{
		{"echo.sleep", map[string]any{"ms": -1}, "INVALID_PARAMS"}, // refused by the agent
		{"memory.get", map[string]any{"key": 5}, "INVALID_PARAMS"},
		{"memory.get", map[string]any{}, "INVALID_PARAMS"},
		{"plain.fail", map[string]any{}, "INVALID_PARAMS"},
	} {
		c := struct {
			name, code string
			args       any
			structured bool
		}{c.name, c.code, c.args, !declares[c.name]}
		res, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: c.name, Arguments: c.args})
		if err != nil {
			t.Errorf("tools/call %s: protocol error %v; want an error result", c.name, err)
			continue
		}
		coded, _ := res.Meta["agentmesh/error"].(map[string]any)
		sc, _ := res.StructuredContent.(map[string]any)
		if !res.IsError || !strings.HasPrefix(textOf(t, res), c.code+": ") || coded["code"] != c.code {
			t.Errorf("tools/call %s %v = isError %v, text %q, _meta %v; want an error result with code %s", c.name, c.args, res.IsError, textOf(t, res), res.Meta, c.code)
		}
		if c.structured != (sc != nil) || (sc != nil && sc["code"] != c.code) {
			t.Errorf("tools/call %s %v: structured content %v; want it %v", c.name, c.args, sc, map[bool]string{true: "the coded error", false: "absent (the tool declares an outputSchema)"}[c.structured])
		}
	}
	// A tool no agent serves, or a built-in, is the specification's
	// protocol error: -32602 "Unknown tool: NAME".
	for _, name := range []string{"nobody.serves", "mesh.agents"} {
		res, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: name, Arguments: map[string]any{}})
		var we *jsonrpc.Error
		if !errors.As(err, &we) || we.Code != jsonrpc.CodeInvalidParams || we.Message != "Unknown tool: "+name {
			t.Errorf("tools/call %s = %+v, %v; want the protocol error -32602 \"Unknown tool: %s\"", name, res, err, name)
		}
	}
	if got := testkit.HistCount(t, metrics, "rpc_server_call_duration_seconds", map[string]string{"rpc_method": "echo.sleep", "rpc_response_status_code": "-32602"}); got != 1 {
		t.Errorf("echo.sleep INVALID_PARAMS counted %d; want 1 (the MCP call)", got)
	}
}

// TestMCPRoles: on a hub with a key, /mcp needs a token; tools/list shows
// only the tools the caller's roles allow, and tools/call of another is
// refused with PERMISSION_DENIED.
func TestMCPRoles(t *testing.T) {
	m := testkit.SecuredHub(t, hub.Security{Roles: map[string][]string{"memory.*": {"writer"}}})
	m.RunAgent(t, agents.NewEcho(agents.WithToken(testkit.Token(t, auth.Claims{Subject: "echo", Serve: []string{"echo.*"}}, time.Hour))))
	m.RunAgent(t, agents.NewKV(agents.WithToken(testkit.Token(t, auth.Claims{Subject: "kv", Serve: []string{"memory.*"}}, time.Hour))))

	if _, err := testkit.MCPConnect(t, m, ""); err == nil {
		t.Errorf("MCP connect without a token succeeded; want 401")
	}
	res, err := http.Post(m.HTTP+"/mcp", "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized {
		t.Errorf("POST /mcp without a token: HTTP %d; want 401", res.StatusCode)
	}

	reader, err := testkit.MCPConnect(t, m, testkit.Token(t, auth.Claims{Subject: "r", Roles: []string{"reader"}}, time.Hour))
	if err != nil {
		t.Fatalf("reader connect: %v", err)
	}
	writer, err := testkit.MCPConnect(t, m, testkit.Token(t, auth.Claims{Subject: "w", Roles: []string{"writer"}}, time.Hour))
	if err != nil {
		t.Fatalf("writer connect: %v", err)
	}
	rt, err := reader.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := toolNames(rt); !slices.Equal(got, []string{"echo.echo", "echo.sleep"}) {
		t.Errorf("reader's tools = %v; want only echo.echo, echo.sleep", got)
	}
	wt, err := writer.ListTools(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := toolNames(wt); len(got) != 6 || !slices.Contains(got, "memory.put") {
		t.Errorf("writer's tools = %v; want echo.* and memory.*", got)
	}
	cr, err := reader.CallTool(t.Context(), &mcp.CallToolParams{Name: "memory.put", Arguments: map[string]any{"key": "k", "value": 1}})
	if err != nil || !cr.IsError || !strings.HasPrefix(textOf(t, cr), "PERMISSION_DENIED: ") {
		t.Errorf("reader tools/call memory.put = %+v, %v; want a PERMISSION_DENIED error result", cr, err)
	}
	cw, err := writer.CallTool(t.Context(), &mcp.CallToolParams{Name: "memory.put", Arguments: map[string]any{"key": "k", "value": 1}})
	if err != nil || cw.IsError {
		t.Errorf("writer tools/call memory.put = %+v, %v; want success", cw, err)
	}
}

// TestMCPTraceLikeNative: a tool call carrying a W3C traceparent in its
// _meta makes the same spans in the hub (names, kinds, status) as a
// native JSON-RPC call carrying one in meta, each under its caller's
// trace and parent span.
func TestMCPTraceLikeNative(t *testing.T) {
	exp, p := testkit.Tracing(t, "hub")
	m := meshtest.Start(t, hub.Config{}, hub.WithTelemetry(telemetry.New(p, nil)))
	m.RunAgent(t, agents.NewEcho())
	const (
		nativeTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
		mcpTrace    = "5bf92f3577b34da6a3ce929d0e0e4737"
		parent      = "00f067aa0ba902b7"
	)
	body := `{"jsonrpc":"2.0","id":1,"method":"echo.echo","params":{"x":1},"meta":{"traceparent":"00-` + nativeTrace + `-` + parent + `-01"}}`
	res, err := http.Post(m.HTTP+"/rpc", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	s, err := testkit.MCPConnect(t, m, "")
	if err != nil {
		t.Fatal(err)
	}
	cr, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: "echo.echo", Arguments: map[string]any{"x": 1},
		Meta: mcp.Meta{"traceparent": "00-" + mcpTrace + "-" + parent + "-01"}})
	if err != nil || cr.IsError {
		t.Fatalf("tools/call echo.echo = %+v, %v", cr, err)
	}
	if err := p.ForceFlush(t.Context()); err != nil {
		t.Fatal(err)
	}
	native, viaMCP := testkit.SpanShapes(t, exp, nativeTrace, parent), testkit.SpanShapes(t, exp, mcpTrace, parent)
	t.Logf("spans: native %v, MCP %v", native, viaMCP)
	if len(native) == 0 || !slices.Contains(native, "echo.echo/server/Unset") || !slices.Equal(native, viaMCP) {
		t.Errorf("spans of the native call %v, of the MCP call %v; want the same, with the echo.echo server span", native, viaMCP)
	}
}
