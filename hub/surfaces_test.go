package hub_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/agents/chat"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/telemetry"
)

// TestSurfaces makes the same calls through every surface of the hub and
// checks that each one leaves the same trace and the same metrics as the
// native call: the same span shapes (spanShapes: name/kind/status, the
// server span a child of the caller's span) under the trace id the caller
// sent, and the same increments of the hub's call-duration histograms
// (rpc_server_call_duration_seconds and rpc_client_call_duration_seconds
// counts, by rpc_method and rpc_response_status_code). "One core, thin
// dialects at the edge": a surface that called other methods, called
// twice, lost the trace or counted under another code would fail here.
//
// The calls (surfaceOps) are the native call of a method with its params,
// an expected outcome and the mesh code. Each surface (surfaceRows) says
// which of them it can carry: the generic ones (native, /rpc, JSON-RPC
// over /ws, MCP) carry them all, and so do Multica (a device's request,
// the trace in its payload's meta) and agentick (POST /invoke, the trace
// in its traceparent header; its WebSocket carries none); NEXUS3 and
// OpenAI carry the chat calls their dialect has.
//
// Adding a surface is one entry of surfaceRows:
//
//	{name: "mine", ops: []string{"echo", "echo-fail"},
//	    open: func(t *testing.T, k *surfaceKit) surfaceCall {
//	        // connect once here (what connecting costs is not measured)
//	        return func(ctx context.Context, op surfaceOp, tp string) (envelope.Code, error) {
//	            // make op.method(op.params) in the surface's dialect, carrying
//	            // the W3C traceparent tp where the dialect carries it; answer
//	            // the mesh code the dialect's reply stands for (CodeOK for a
//	            // result), or an error for a reply the dialect should not give
//	        }
//	    }},
//
// and, if the surface has calls of its own worth comparing, an entry of
// surfaceOps (k.chatAgent is a chat agent that exists, for chat calls).
func TestSurfaces(t *testing.T) {
	exp, p := testkit.Tracing(t, "hub")
	var hb *hub.Hub
	metrics := telemetry.NewMetrics(telemetry.NewLabeler(func(m string) bool { return hb.KnownMethod(m) }))
	m := meshtest.Start(t, hub.Config{}, hub.WithTelemetry(telemetry.New(p, metrics)))
	hb = m.Hub
	m.RunAgent(t, agents.NewEcho())
	rt := chat.NewRuntime(chat.Config{DataDir: t.TempDir()}, &chat.Scripted{}, nil)
	t.Cleanup(func() { rt.Close(context.Background()) })
	m.RunAgent(t, chat.NewService(rt))
	k := &surfaceKit{m: m, chatAgent: "surf"}
	if err := m.Client(t).Call(t.Context(), "chat.create", map[string]any{"agent_id": k.chatAgent}, nil); err != nil {
		t.Fatal(err)
	}

	const parent = "00f067aa0ba902b7"
	type observed struct {
		code   envelope.Code
		spans  []string
		counts map[string]uint64
	}
	// measure makes one call through a surface and returns what it left.
	measure := func(call surfaceCall, op surfaceOp) (observed, error) {
		var tid [16]byte
		_, _ = rand.Read(tid[:])
		trace := hex.EncodeToString(tid[:])
		before := callCounts(t, metrics)
		ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
		code, err := call(ctx, op, "00-"+trace+"-"+parent+"-01")
		cancel()
		if err != nil {
			return observed{}, err
		}
		after := callCounts(t, metrics)
		if err := p.ForceFlush(t.Context()); err != nil {
			t.Fatal(err)
		}
		return observed{code, testkit.SpanShapes(t, exp, trace, parent), diffCounts(before, after)}, nil
	}

	native := map[string]observed{}
	for _, row := range surfaceRows {
		call := row.open(t, k)
		for _, op := range surfaceOps(k) {
			if !slices.Contains(row.ops, op.name) {
				continue
			}
			got, err := measure(call, op)
			if err != nil {
				t.Errorf("%s %s: %v", row.name, op.name, err)
				continue
			}
			if row.followsChat && op.method == "chat.send" {
				var follow []string
				for k := range got.counts {
					if strings.HasPrefix(k, "server chat.events ") || strings.HasPrefix(k, "client chat.events ") {
						follow = append(follow, fmt.Sprint(k, ":", got.counts[k]))
						delete(got.counts, k)
					}
				}
				slices.Sort(follow)
				t.Logf("%-8s %-12s following the turn: %v (left out)", row.name, op.name, follow)
			}
			t.Logf("%-8s %-12s code %-15s spans %v counts %v", row.name, op.name, got.code, got.spans, got.counts)
			if got.code != op.want {
				t.Errorf("%s %s: answered %s; want %s", row.name, op.name, got.code, op.want)
			}
			ref, ok := native[op.name]
			if !ok {
				// The first row, the native client, is the reference; it
				// must itself show the call: its server span and one count.
				want := op.method + "/server/" + map[bool]string{true: "Unset", false: "Error"}[op.want == envelope.CodeOK]
				if row.name != "native" || !slices.Contains(got.spans, want) || got.counts["server "+op.method+" "+statusLabel(op.want)] != 1 {
					t.Fatalf("%s %s as the reference: spans %v counts %v; want the native call with span %s and one server count", row.name, op.name, got.spans, got.counts, want)
				}
				native[op.name] = got
				continue
			}
			if !slices.Equal(got.spans, ref.spans) {
				t.Errorf("%s %s: spans %v; native %v", row.name, op.name, got.spans, ref.spans)
			}
			if !maps.Equal(got.counts, ref.counts) {
				t.Errorf("%s %s: metric increments %v; native %v", row.name, op.name, got.counts, ref.counts)
			}
		}
	}
}

// surfaceOp is one call the surfaces are compared on: the native call
// of method with params, and the mesh code it ends with.
type surfaceOp struct {
	name   string
	method string
	params map[string]any
	want   envelope.Code
}

func surfaceOps(k *surfaceKit) []surfaceOp {
	return []surfaceOp{
		{"echo", "echo.echo", map[string]any{"x": 1}, envelope.CodeOK},
		{"echo-fail", "echo.sleep", map[string]any{"ms": -1}, envelope.CodeInvalidParams},
		{"list-agents", "chat.list_agents", map[string]any{}, envelope.CodeOK},
		{"send", "chat.send", map[string]any{"agentId": k.chatAgent, "content": "Hello"}, envelope.CodeOK},
		{"send-nobody", "chat.send", map[string]any{"agentId": "nobody", "content": "Hello"}, envelope.CodeAgentNotFound},
		// Calls the Multica and agentick seeds have methods of their own
		// for (getAgentMessages; sessions and history).
		{"sessions", "chat.list", map[string]any{}, envelope.CodeOK},
		{"history", "chat.getAgentMessages", map[string]any{"agentId": k.chatAgent, "offset": 0, "limit": 1}, envelope.CodeOK},
		{"history-nobody", "chat.getAgentMessages", map[string]any{"agentId": "nobody", "offset": 0, "limit": 1}, envelope.CodeAgentNotFound},
	}
}

// surfaceKit is what rows connect with.
type surfaceKit struct {
	m         *meshtest.Mesh
	chatAgent string
}

// surfaceCall makes op through one surface carrying traceparent tp and
// answers the mesh code the surface's reply stands for (CodeOK for a
// result); an error is a reply the surface's dialect should not give.
type surfaceCall func(ctx context.Context, op surfaceOp, tp string) (envelope.Code, error)

// allOps are the names of every surfaceOp, for the surfaces that carry
// any method of the mesh with its params.
var allOps = []string{"echo", "echo-fail", "list-agents", "send", "send-nobody", "sessions", "history", "history-nobody"}

// surfaceRows are the hub's surfaces; the first is the native client,
// the reference the others are compared with.
var surfaceRows = []struct {
	name string
	ops  []string
	open func(t *testing.T, k *surfaceKit) surfaceCall
	// followsChat: the surface streams a chat.send's events by long polls
	// of chat.events through the hub's ingress (Hub.ChatTail, FollowChat),
	// which the call-duration histograms count like any call; for chat.send
	// those chat.events counts are left out of the comparison (the spans,
	// which are not under the caller's trace, are still compared).
	followsChat bool
}{
	{name: "native", ops: allOps, open: func(t *testing.T, k *surfaceKit) surfaceCall {
		c := k.m.Client(t, mesh.WithoutReliability())
		if err := c.Call(t.Context(), "echo.echo", nil, nil); err != nil { // connects
			t.Fatal(err)
		}
		return func(ctx context.Context, op surfaceOp, tp string) (envelope.Code, error) {
			err := c.Call(ctx, op.method, op.params, nil, mesh.WithHeaders(func(h *envelope.Headers) { h.Traceparent = tp }))
			return envelope.CodeOf(err), nil
		}
	}},
	{name: "/rpc", ops: allOps, open: func(t *testing.T, k *surfaceKit) surfaceCall {
		return func(ctx context.Context, op surfaceOp, tp string) (envelope.Code, error) {
			body := jsonRPCBody(op, tp)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, k.m.HTTP+"/rpc", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				return 0, err
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			if res.StatusCode != 200 {
				return 0, fmt.Errorf("HTTP %d %s", res.StatusCode, b)
			}
			return jsonRPCCode(b)
		}
	}},
	{name: "/ws json-rpc", ops: allOps, open: func(t *testing.T, k *surfaceKit) surfaceCall {
		ws, _, err := websocket.DefaultDialer.DialContext(t.Context(), k.m.WS, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ws.Close() })
		return func(ctx context.Context, op surfaceOp, tp string) (envelope.Code, error) {
			dl, _ := ctx.Deadline()
			_ = ws.SetWriteDeadline(dl)
			_ = ws.SetReadDeadline(dl)
			if err := ws.WriteMessage(websocket.TextMessage, []byte(jsonRPCBody(op, tp))); err != nil {
				return 0, err
			}
			_, b, err := ws.ReadMessage()
			if err != nil {
				return 0, err
			}
			return jsonRPCCode(b)
		}
	}},
	{name: "mcp", ops: allOps, open: func(t *testing.T, k *surfaceKit) surfaceCall {
		s, err := testkit.MCPConnect(t, k.m, "")
		if err != nil {
			t.Fatal(err)
		}
		return func(ctx context.Context, op surfaceOp, tp string) (envelope.Code, error) {
			r, err := s.CallTool(ctx, &mcp.CallToolParams{Name: op.method, Arguments: op.params, Meta: mcp.Meta{"traceparent": tp}})
			var we *jsonrpc.Error
			if errors.As(err, &we) && strings.HasPrefix(we.Message, "Unknown tool: ") {
				return envelope.CodeMethodNotFound, nil // MCP's protocol error for a tool nobody serves
			}
			if err != nil {
				return 0, err
			}
			if !r.IsError {
				return envelope.CodeOK, nil
			}
			coded, _ := r.Meta["agentmesh/error"].(map[string]any)
			name, _ := coded["code"].(string)
			if c, ok := envelope.ParseCode(name); ok {
				return c, nil
			}
			return 0, fmt.Errorf("error result without a mesh code: %+v", r)
		}
	}},
	{name: "nexus3", ops: []string{"list-agents", "send", "send-nobody"}, open: func(t *testing.T, k *surfaceKit) surfaceCall {
		return func(ctx context.Context, op surfaceOp, tp string) (envelope.Code, error) {
			path, method, params := "/", "list_agents", map[string]any{}
			if op.method == "chat.send" {
				path, method, params = "/agent/"+op.params["agentId"].(string), "send", map[string]any{"content": op.params["content"]}
			}
			body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, k.m.HTTP+path, strings.NewReader(string(body)))
			req.Header.Set("traceparent", tp)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				return 0, err
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			if res.StatusCode == http.StatusNotFound && strings.Contains(string(b), "Agent not found") {
				return envelope.CodeAgentNotFound, nil // NEXUS3's answer for an unknown agent
			}
			if res.StatusCode != 200 {
				return 0, fmt.Errorf("HTTP %d %s", res.StatusCode, b)
			}
			return jsonRPCCode(b)
		}
	}},
	{name: "openai", ops: []string{"send", "send-nobody"}, open: func(t *testing.T, k *surfaceKit) surfaceCall {
		return func(ctx context.Context, op surfaceOp, tp string) (envelope.Code, error) {
			body, _ := json.Marshal(map[string]any{"model": "chat/" + op.params["agentId"].(string),
				"messages": []map[string]any{{"role": "user", "content": op.params["content"]}}})
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, k.m.HTTP+"/v1/chat/completions", strings.NewReader(string(body)))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("traceparent", tp)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				return 0, err
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			var v struct {
				Object string `json:"object"`
				Error  *struct {
					Code string `json:"code"`
				} `json:"error"`
			}
			if err := json.Unmarshal(b, &v); err != nil {
				return 0, fmt.Errorf("HTTP %d %s", res.StatusCode, b)
			}
			switch {
			case res.StatusCode == 200 && v.Object == "chat.completion":
				return envelope.CodeOK, nil
			case res.StatusCode == 404 && v.Error != nil && v.Error.Code == "model_not_found":
				return envelope.CodeAgentNotFound, nil // the surface's answer for an unknown agent
			case v.Error != nil:
				if c, ok := envelope.ParseCode(strings.ToUpper(v.Error.Code)); ok {
					return c, nil
				}
			}
			return 0, fmt.Errorf("HTTP %d %s", res.StatusCode, b)
		}
	}},
	// Multica (/multica): a device's "request" to the hub, the trace
	// context in its payload's meta (an addition to the seed, whose
	// RoutedMessage has no field for it). Every method of the mesh is
	// callable by its own name, so it carries every op; the history ops go
	// by the seed's name, getAgentMessages. A chat.send's "stream" messages
	// come before its response and are skipped.
	{name: "multica", ops: allOps, open: func(t *testing.T, k *surfaceKit) surfaceCall {
		d := testkit.ConnectDevice(t, k.m, "surfaces")
		var n atomic.Int64
		return func(ctx context.Context, op surfaceOp, tp string) (envelope.Code, error) {
			method := op.method
			if method == "chat.getAgentMessages" {
				method = "getAgentMessages"
			}
			rid := fmt.Sprint("surf-", n.Add(1))
			d.Write(testkit.MustJSON(t, map[string]any{"id": envelope.NewID(), "uid": nil, "from": d.ID, "to": d.Hub, "action": "request",
				"payload": map[string]any{"requestId": rid, "method": method, "params": op.params, "meta": map[string]string{"traceparent": tp}}}))
			dl, _ := ctx.Deadline()
			for {
				v, err := d.Read(time.Until(dl))
				if err != nil {
					return 0, err
				}
				if v["action"] == "stream" {
					continue
				}
				p, _ := v["payload"].(map[string]any)
				if v["action"] != "response" || p["requestId"] != rid {
					return 0, fmt.Errorf("got %v; want the response to %s", v, rid)
				}
				return multicaCode(p)
			}
		}
	}, followsChat: true},
	// agentick: POST /invoke, whose traceparent header carries the trace
	// context. Its WebSocket (GET / upgrade) cannot carry one for any op:
	// the seed's req frame is {type, id, method, params} and the gateway
	// reads no trace field from it, so it is not a row. echo, echo-fail,
	// list-agents, send and send-nobody go as custom methods (a method the
	// seed does not list is the mesh method of that name); sessions and
	// history are the seed's own methods (chat.list; chat.getAgentMessages,
	// given "before" so that it is one page call — without it history first
	// asks for the total, two calls). The seed's own "send" is not the
	// native chat.send and is not compared: it calls chat.get_context
	// (chat.create on first use) and runs chat.send in the background,
	// answering {messageId} before the turn ends.
	{name: "agentick", ops: allOps, open: func(t *testing.T, k *surfaceKit) surfaceCall {
		return func(ctx context.Context, op surfaceOp, tp string) (envelope.Code, error) {
			method, params := op.method, op.params
			switch op.name {
			case "sessions":
				method, params = "sessions", map[string]any{}
			case "history", "history-nobody":
				method, params = "history", map[string]any{"sessionId": op.params["agentId"], "before": "msg-1", "limit": 1}
			}
			body, _ := json.Marshal(map[string]any{"method": method, "params": params})
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, k.m.HTTP+"/invoke", strings.NewReader(string(body)))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("traceparent", tp)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				return 0, err
			}
			defer res.Body.Close()
			b, _ := io.ReadAll(res.Body)
			return agentickCode(res.StatusCode, b)
		}
	}},
}

var rpcIDs atomic.Int64

// jsonRPCBody is op as a JSON-RPC 2.0 request carrying tp in meta.
func jsonRPCBody(op surfaceOp, tp string) string {
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": rpcIDs.Add(1), "method": op.method, "params": op.params,
		"meta": map[string]string{"traceparent": tp}})
	return string(b)
}

// jsonRPCCode reads a JSON-RPC response: CodeOK for a result, the mesh
// code of its error's code.
func jsonRPCCode(b []byte) (envelope.Code, error) {
	var v struct {
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Code int `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return 0, fmt.Errorf("not a JSON-RPC response: %s", b)
	}
	if v.Error == nil && len(v.Result) > 0 {
		return envelope.CodeOK, nil
	}
	if v.Error != nil {
		if c, ok := envelope.CodeFromJSONRPC(v.Error.Code); ok {
			return c, nil
		}
	}
	return 0, fmt.Errorf("not a JSON-RPC response: %s", b)
}

// statusLabel is rpc_response_status_code's value for c.
func statusLabel(c envelope.Code) string {
	if c == envelope.CodeOK {
		return ""
	}
	return fmt.Sprint(c.JSONRPC())
}

// callCounts snapshots the hub's call-duration histogram counts, keyed
// "server|client METHOD STATUS". The hub's own bookkeeping (agent.*
// heartbeats and registrations, which may fall in any window) is left out.
func callCounts(t *testing.T, m *telemetry.Metrics) map[string]uint64 {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, f := range fams {
		side, ok := map[string]string{"rpc_server_call_duration_seconds": "server", "rpc_client_call_duration_seconds": "client"}[f.GetName()]
		if !ok {
			continue
		}
		for _, s := range f.Metric {
			var method, status string
			for _, lp := range s.Label {
				switch lp.GetName() {
				case "rpc_method":
					method = lp.GetValue()
				case "rpc_response_status_code":
					status = lp.GetValue()
				}
			}
			if strings.HasPrefix(method, "agent.") {
				continue
			}
			out[side+" "+method+" "+status] = s.GetHistogram().GetSampleCount()
		}
	}
	return out
}

// diffCounts is what grew from before to after.
func diffCounts(before, after map[string]uint64) map[string]uint64 {
	d := map[string]uint64{}
	for k, v := range after {
		if v > before[k] {
			d[k] = v - before[k]
		}
	}
	return d
}

// multicaCode reads a Multica response payload: CodeOK for ok, else the
// mesh code its error stands for (RPC_ERROR's meshCode when it has one).
func multicaCode(p map[string]any) (envelope.Code, error) {
	if p["ok"] == true {
		return envelope.CodeOK, nil
	}
	e, _ := p["error"].(map[string]any)
	code, _ := e["code"].(string)
	switch code {
	case "METHOD_NOT_FOUND":
		return envelope.CodeMethodNotFound, nil
	case "INVALID_PARAMS":
		return envelope.CodeInvalidParams, nil
	case "AGENT_NOT_FOUND":
		return envelope.CodeAgentNotFound, nil
	case "RPC_ERROR":
		mc, _ := e["meshCode"].(string)
		if mc == "" {
			return envelope.CodeRPCError, nil
		}
		if c, ok := envelope.ParseCode(mc); ok {
			return c, nil
		}
	}
	return 0, fmt.Errorf("not a Multica response payload: %v", p)
}

// agentickCode reads an /invoke answer {type: "res", ok, payload|error}:
// CodeOK for ok, else the mesh code in error.details.meshCode, or the one
// the seed's code stands for. NOT_FOUND_RESOURCE is the seed's code for an
// unknown agent and an unknown method alike; it is read as the agent's
// (the call-count comparison would show a METHOD_NOT_FOUND).
func agentickCode(status int, b []byte) (envelope.Code, error) {
	var v struct {
		Type  string `json:"type"`
		OK    bool   `json:"ok"`
		Error *struct {
			Code    string         `json:"code"`
			Details map[string]any `json:"details"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &v); err != nil || v.Type != "res" {
		return 0, fmt.Errorf("HTTP %d %s: not an agentick res", status, b)
	}
	if v.OK && v.Error == nil && status == 200 {
		return envelope.CodeOK, nil
	}
	if v.Error != nil && !v.OK && status != 200 {
		if mc, ok := v.Error.Details["meshCode"].(string); ok {
			if c, ok := envelope.ParseCode(mc); ok {
				return c, nil
			}
		}
		switch v.Error.Code {
		case "NOT_FOUND_RESOURCE":
			return envelope.CodeAgentNotFound, nil
		case "VALIDATION_TYPE", "VALIDATION_REQUIRED":
			return envelope.CodeInvalidParams, nil
		case "GUARD_DENIED":
			return envelope.CodePermissionDenied, nil
		case "METHOD_ERROR":
			return envelope.CodeRPCError, nil
		}
	}
	return 0, fmt.Errorf("HTTP %d %s: not an agentick res", status, b)
}
