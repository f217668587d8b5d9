package agentick

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/surface"
)

// agSchemaMethod is one method of the agentick schema.
type agSchemaMethod struct {
	Description string          `json:"description"`
	Builtin     bool            `json:"builtin"`
	Params      json.RawMessage `json:"params,omitempty"`
	Response    json.RawMessage `json:"response,omitempty"`
	Errors      []string        `json:"errors,omitempty"`
	Roles       []string        `json:"roles,omitempty"`
	// Streaming: the seed's "streaming methods", whose chunks arrive as
	// method:chunk events, then method:end.
	Streaming bool `json:"streaming,omitempty"`
}

// agentickBacking names the mesh method behind each built-in whose
// authorisation it inherits (see the method table at the top).
var agentickBacking = map[string]string{
	"send": "chat.send", "abort": "chat.cancel", "history": "chat.getAgentMessages", "reset": "chat.reset",
	"close": "chat.destroy", "sessions": "chat.list", "status": "chat.list", "subscribe": "chat.events",
	"channel": "chat.get_context", "channel-subscribe": "chat.get_context",
}

// agentickBuiltins describe the seed's built-in methods.
var agentickBuiltins = func() map[string]agSchemaMethod {
	obj := func(props string, required ...string) json.RawMessage {
		r, _ := json.Marshal(required)
		if len(required) == 0 {
			r = []byte("[]")
		}
		return json.RawMessage(`{"type":"object","properties":{` + props + `},"required":` + string(r) + `}`)
	}
	sid := `"sessionId":{"type":"string"}`
	ok := obj(`"ok":{"type":"boolean"}`, "ok")
	nf := []string{agNotFoundResource, agValidationReq, agValidationType, agGuardDenied, agInternalError}
	return map[string]agSchemaMethod{
		"send": {Description: "Send message to session (created on first use); the turn's events follow on the event stream", Builtin: true,
			Params:   obj(sid+`,"message":{"type":"string"},"attachments":{"type":"array","maxItems":0}`, "sessionId", "message"),
			Response: obj(`"messageId":{"type":"string"}`, "messageId"), Errors: nf},
		"abort": {Description: "Abort current execution", Builtin: true, Params: obj(sid, "sessionId"),
			Errors: append(slices.Clone(nf), agStateComplete, agMethodError)},
		"status": {Description: "Get status", Builtin: true, Params: obj(sid),
			Response: obj(`"gateway":{"type":"object"},"session":{"type":"object"}`, "gateway"), Errors: nf},
		"history": {Description: "Get history", Builtin: true,
			Params:   obj(sid+`,"limit":{"type":"integer","minimum":1,"maximum":1000},"before":{"type":"string"}`, "sessionId"),
			Response: obj(`"messages":{"type":"array"},"hasMore":{"type":"boolean"}`, "messages", "hasMore"), Errors: nf},
		"reset": {Description: "Reset session: cancel its running and waiting sends, move its history aside (chat.reset) and start it empty", Builtin: true,
			Params: obj(sid, "sessionId"), Response: ok, Errors: append(slices.Clone(nf), agStateComplete, agMethodError)},
		"close": {Description: "Close session", Builtin: true, Params: obj(sid, "sessionId"), Response: ok,
			Errors: append(slices.Clone(nf), agStateComplete)},
		"apps":        {Description: "List apps", Builtin: true, Response: obj(`"apps":{"type":"array"}`, "apps"), Errors: []string{agGuardDenied, agInternalError}},
		"sessions":    {Description: "List sessions", Builtin: true, Response: obj(`"sessions":{"type":"array"}`, "sessions"), Errors: []string{agGuardDenied, agInternalError}},
		"subscribe":   {Description: "Subscribe to events", Builtin: true, Params: obj(sid, "sessionId"), Response: ok, Errors: nf},
		"unsubscribe": {Description: "Unsubscribe", Builtin: true, Params: obj(sid, "sessionId"), Response: ok, Errors: nf},
		"channel": {Description: "Publish to channel", Builtin: true,
			Params: obj(sid+`,"channel":{"type":"string"},"payload":{}`, "sessionId", "channel"), Response: ok, Errors: nf},
		"channel-subscribe": {Description: "Subscribe to channel", Builtin: true,
			Params: obj(sid+`,"channel":{"type":"string"}`, "sessionId", "channel"), Response: ok, Errors: nf},
		"schema": {Description: "Protocol discovery", Builtin: true,
			Response: obj(`"protocolVersion":{"type":"string"},"methods":{"type":"object"},"events":{"type":"array"},"errors":{"type":"object"}`, "protocolVersion", "methods", "events", "errors"),
			Errors:   []string{agGuardDenied, agInternalError}},
		"tool-catalog": {Description: "List session tools: the mesh methods a session reaches with its mesh_call tool", Builtin: true,
			Params: obj(sid, "sessionId"), Response: obj(`"tools":{"type":"array"}`, "tools"), Errors: nf},
		"tool-confirm": {Description: "Respond to tool confirmation. Always NOT_FOUND_RESOURCE here: the chat runtime runs its tools without asking for confirmation, so no tool call ever awaits one", Builtin: true,
			Params:   obj(sid+`,"callId":{"type":"string"},"confirmed":{"type":"boolean"},"reason":{"type":"string"}`, "sessionId", "callId", "confirmed"),
			Response: ok, Errors: nf},
		"tool-dispatch": {Description: "Dispatch tool directly: call the mesh method named tool with input", Builtin: true,
			Params:   obj(sid+`,"tool":{"type":"string"},"input":{"type":"object"}`, "sessionId", "tool", "input"),
			Response: obj(`"content":{"type":"array"}`, "content"), Errors: append(slices.Clone(nf), agNotFoundTool, agMethodError)},
	}
}()

// agentickCodeOf maps a mesh code name to the seed's code.
func agentickCodeOf(name string) string {
	c, ok := envelope.ParseCode(name)
	if !ok {
		return agInternalError
	}
	return agentickFromMesh(envelope.NewError(c, ""), false).Code
}

func (gw *gateway) meshSchema(ctx context.Context) (*control.SchemaPayload, *agError) {
	var s control.SchemaPayload
	if err := gw.callInto(ctx, "mesh.schema", nil, &s); err != nil {
		return nil, agentickFromMesh(err, false)
	}
	return &s, nil
}

func (gw *gateway) schema(ctx context.Context) (any, *agError) {
	ms, e := gw.meshSchema(ctx)
	if e != nil {
		return nil, e
	}
	methods := map[string]agSchemaMethod{}
	for name, m := range agentickBuiltins {
		// The role table may guard the agentick method itself; else the
		// mesh method behind it decides (the ingress checks it on every
		// call the gateway makes).
		m.Roles, _ = gw.h.RequiredRoles("agentick." + name)
		if back := agentickBacking[name]; m.Roles == nil && back != "" {
			m.Roles, _ = gw.h.RequiredRoles(back)
		}
		methods[name] = m
	}
	for name, m := range ms.Methods {
		// The mesh's own built-ins are callable here as custom methods
		// (mesh.agents, mesh.methods, …): listed, builtin true. Agent
		// control (agent.register, …) is not reachable from a gateway.
		if m.Pattern || strings.HasPrefix(name, "agent.") {
			continue
		}
		if _, ok := methods[name]; ok {
			continue
		}
		var errs []string
		for _, c := range m.Errors {
			if a := agentickCodeOf(c); !slices.Contains(errs, a) {
				errs = append(errs, a)
			}
		}
		slices.Sort(errs)
		methods[name] = agSchemaMethod{Description: m.Description, Builtin: m.Builtin, Params: m.Params, Response: m.Response, Errors: errs, Roles: m.Roles, Streaming: m.Streaming}
	}
	return map[string]any{"protocolVersion": agentickVersion, "methods": methods, "events": agentickEvents, "errors": agentickErrors}, nil
}

func (gw *gateway) toolCatalog(ctx context.Context, p *agParams) (any, *agError) {
	name, e := p.session()
	if e != nil {
		return nil, e
	}
	if _, e := gw.ensureSession(ctx, name, false); e != nil {
		return nil, e
	}
	ms, e := gw.meshSchema(ctx)
	if e != nil {
		return nil, e
	}
	who, _ := gw.h.Caller(ctx)
	tools := []map[string]any{}
	for m, s := range ms.Methods {
		if s.Builtin || s.Pattern || !gw.h.MayCall(who, m) {
			continue
		}
		in := surface.ObjectSchema(s.Params)
		if in == nil {
			in = json.RawMessage(`{"type":"object"}`)
		}
		tools = append(tools, map[string]any{"name": m, "description": s.Description, "input": in, "type": "mesh"})
	}
	sort.Slice(tools, func(i, j int) bool { return tools[i]["name"].(string) < tools[j]["name"].(string) })
	return map[string]any{"tools": tools}, nil
}

func (gw *gateway) toolConfirm(ctx context.Context, p *agParams) (any, *agError) {
	name, e := p.session()
	if e != nil {
		return nil, e
	}
	callID, e := p.str("callId", true)
	if e != nil {
		return nil, e
	}
	if !p.has("confirmed") {
		return nil, agErr(agValidationReq, "confirmed is required")
	}
	var b bool
	if json.Unmarshal(p.m["confirmed"], &b) != nil {
		return nil, agErr(agValidationType, "confirmed must be a boolean")
	}
	if _, e := p.str("reason", false); e != nil {
		return nil, e
	}
	if _, e := gw.ensureSession(ctx, name, false); e != nil {
		return nil, e
	}
	return nil, agErr(agNotFoundResource, "no tool call %s awaits confirmation in session %s: the chat runtime runs its tools without confirmation", callID, name)
}

func (gw *gateway) toolDispatch(ctx context.Context, p *agParams) (any, *agError) {
	name, e := p.session()
	if e != nil {
		return nil, e
	}
	tool, e := p.str("tool", true)
	if e != nil {
		return nil, e
	}
	if !p.has("input") {
		return nil, agErr(agValidationReq, "input is required")
	}
	input := bytes.TrimSpace(p.m["input"])
	if len(input) == 0 || input[0] != '{' {
		return nil, agErr(agValidationType, "input must be an object")
	}
	if _, e := gw.ensureSession(ctx, name, false); e != nil {
		return nil, e
	}
	if gw.h.IsBuiltin(tool) || !surface.ToolName(tool) {
		return nil, agErr(agNotFoundTool, "tool not found: %s", tool)
	}
	res, err := gw.call(ctx, tool, json.RawMessage(input))
	if err != nil {
		return nil, agentickFromMesh(err, true)
	}
	return map[string]any{"content": []map[string]string{{"type": "text", "text": string(res)}}}, nil
}

// answer runs a decoded req and encodes its res.
func (gw *gateway) answer(ctx context.Context, c *agClient, f *agFrame) (out []byte, ae *agError) {
	defer func() {
		if p := recover(); p != nil {
			gw.h.Logger().Error("agentick: method panicked", "method", f.Method, "panic", fmt.Sprint(p))
			ae = agErr(agInternalError, "unexpected failure in %s", f.Method)
			out = agentickRes(f.ID, nil, ae)
		}
	}()
	v, e := gw.invoke(context.WithValue(ctx, agReqKey{}, f.ID), c, f.Method, f.Params)
	if e != nil {
		return agentickRes(f.ID, nil, e), e
	}
	var payload json.RawMessage
	switch v := v.(type) {
	case nil:
	case json.RawMessage:
		payload = v
	default:
		b, err := json.Marshal(v)
		if err != nil {
			e := agErr(agInternalError, "cannot encode the answer")
			return agentickRes(f.ID, nil, e), e
		}
		payload = b
	}
	return agentickRes(f.ID, payload, nil), nil
}

// connected is the answer to connect, and an event stream's first frame.
// resumed, when not nil, says whether a stream opened with Last-Event-ID
// resumed its client (serveEvents); the WebSocket's has no such field.
func (gw *gateway) connected(ctx context.Context, resumed *bool) []byte {
	apps, err := gw.apps(ctx)
	if err != nil {
		apps = []string{}
	}
	sessions := []string{}
	if l, err := gw.listSessions(ctx); err == nil {
		for _, a := range l {
			sessions = append(sessions, a.AgentID)
		}
	}
	b, _ := json.Marshal(struct {
		Type            string   `json:"type"`
		GatewayID       string   `json:"gatewayId"`
		ProtocolVersion string   `json:"protocolVersion"`
		Apps            []string `json:"apps"`
		Sessions        []string `json:"sessions"`
		Resumed         *bool    `json:"resumed,omitempty"`
	}{"connected", gw.id, agentickVersion, apps, sessions, resumed})
	return b
}
