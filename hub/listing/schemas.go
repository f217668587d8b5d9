package listing

import (
	"encoding/json"
	"iter"
	"slices"
	"strings"

	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/registry"
)

// The hub's own contract: its built-ins' schemas, the chat agents' stream
// events, the codes any routed call may end with (the hub's Schema puts
// them together with what the agents declared).

func mustSchema[T any]() json.RawMessage {
	s, err := control.SchemaFor[T]()
	if err != nil {
		panic(err)
	}
	return s
}

// BuiltinSchemas describe the hub's own methods.
var BuiltinSchemas = func() map[string]control.MethodSchema {
	none := json.RawMessage(`{"type":"object","additionalProperties":false}`)
	link := []string{"INVALID_PARAMS", "INVALID_REQUEST", "AGENT_NOT_FOUND", "UNAVAILABLE"}
	return map[string]control.MethodSchema{
		"agent.register": {Description: "Register this WebSocket link as an agent instance serving methods",
			Params: mustSchema[control.RegisterParams](), Result: mustSchema[control.RegisterResult](),
			Errors: append(link, "PERMISSION_DENIED")},
		"agent.heartbeat": {Description: "Report that the agent is alive, with its state and load",
			Params: mustSchema[control.HeartbeatParams](), Result: json.RawMessage(`{"type":"object","properties":{"acknowledged":{"type":"boolean"}}}`),
			Errors: link},
		"agent.deregister": {Description: "Deregister the agent before it leaves",
			Params: mustSchema[control.DeregisterParams](), Result: json.RawMessage(`{"type":"object","properties":{"acknowledged":{"type":"boolean"},"gracePeriod":{"type":"number"}}}`),
			Errors: link},
		"mesh.ping": {Description: "Liveness of the hub", Idempotent: true,
			Result: json.RawMessage(`{"type":"object","properties":{"pong":{"type":"boolean"},"hub":{"type":"string"},"time":{"type":"integer"}}}`)},
		"mesh.agents":   {Description: "List the registered agent instances", Params: none, Result: mustSchema[[]control.AgentInfo](), Errors: []string{"INVALID_PARAMS"}, Idempotent: true},
		"mesh.methods":  {Description: "List the methods served by agents, with their instances", Params: none, Result: mustSchema[[]control.MethodInfo](), Errors: []string{"INVALID_PARAMS"}, Idempotent: true},
		"mesh.breakers": {Description: "List the circuit breakers per (method, instance)", Params: none, Errors: []string{"INVALID_PARAMS"}, Idempotent: true},
		"mesh.schema":   {Description: "Protocol discovery: every method with its schemas, error codes and roles, and every error code", Params: none, Result: mustSchema[control.SchemaPayload](), Errors: []string{"INVALID_PARAMS"}, Idempotent: true},
		"schema":        {Description: "Protocol discovery (the agentick name of mesh.schema)", Params: none, Result: mustSchema[control.SchemaPayload](), Errors: []string{"INVALID_PARAMS"}, Idempotent: true},
		"rpc.discover":  {Description: "The mesh's methods as an OpenRPC 1.3 document", Params: none, Result: json.RawMessage(`{"type":"object","required":["openrpc","info","methods"]}`), Errors: []string{"INVALID_PARAMS"}, Idempotent: true},
	}
}()

// ChatStreamEvents are the stream events of chat agents (chat.events, and
// Multica's "stream" messages: StreamPayload {streamId, agentId, event}),
// as the Multica streaming seed names them, with their categories.
var ChatStreamEvents = []control.SchemaEvent{
	{Type: "message_start", Category: "model"},
	{Type: "message_update", Category: "model"},
	{Type: "message_end", Category: "model"},
	{Type: "tool_execution_start", Category: "orchestration"},
	{Type: "tool_execution_end", Category: "orchestration"},
	{Type: "compaction_start", Category: "orchestration"},
	{Type: "compaction_end", Category: "orchestration"},
}

// AgentErrors are the codes any routed call may end with, whatever the
// agent declared.
var AgentErrors = []string{"METHOD_NOT_FOUND", "UNAVAILABLE", "TIMEOUT", "CIRCUIT_OPEN", "OVERLOADED", "CANCELLED", "RPC_ERROR"}

// Schema builds the mesh's contract: the built-ins, then every method
// the instances serve; the first instance, in the order given (the
// snapshot's, by id), that declared a schema for a method wins. roles
// gives the roles a call to a method needs (declared: what the agent
// said), idempotent whether the hub's policy marks it idempotent.
func Schema(builtins iter.Seq[string], instances []*registry.Instance, roles func(m string, declared []string) []string, idempotent func(m string) bool) control.SchemaPayload {
	out := control.SchemaPayload{ProtocolVersion: envelope.Version, Methods: map[string]control.SchemaMethod{}, Events: slices.Clone(ChatStreamEvents), Errors: envelope.CodeTable()}
	for m := range builtins {
		s := BuiltinSchemas[m]
		out.Methods[m] = control.SchemaMethod{Description: s.Description, Builtin: true, Params: s.Params, Response: s.Result,
			Errors: s.Errors, Roles: roles(m, nil), Idempotent: s.Idempotent}
	}
	for _, in := range instances {
		var decl map[string]control.MethodSchema
		if len(in.Schemas) > 0 {
			_ = json.Unmarshal(in.Schemas, &decl)
		}
		add := func(m string, s control.MethodSchema, declared bool) {
			cur, seen := out.Methods[m]
			if seen && (cur.Builtin || cur.Params != nil || cur.Response != nil || !declared) {
				if !slices.Contains(cur.Agents, in.Name) {
					cur.Agents = append(cur.Agents, in.Name)
					out.Methods[m] = cur
				}
				return
			}
			errs := slices.Clone(s.Errors)
			for _, e := range AgentErrors {
				if !slices.Contains(errs, e) {
					errs = append(errs, e)
				}
			}
			ms := control.SchemaMethod{Description: s.Description, Params: s.Params, Response: s.Result, Errors: errs,
				Roles: roles(m, s.Roles), Idempotent: s.Idempotent || idempotent(m), Streaming: s.Streaming,
				Pattern: strings.HasSuffix(m, "*"), Agents: []string{in.Name}}
			if seen {
				ms.Agents = append(cur.Agents, in.Name)
				slices.Sort(ms.Agents)
				ms.Agents = slices.Compact(ms.Agents)
			}
			out.Methods[m] = ms
		}
		for m, s := range decl {
			add(m, s, true)
		}
		for _, c := range in.Capabilities {
			if _, ok := decl[c]; !ok {
				add(c, control.MethodSchema{}, false)
			}
		}
	}
	return out
}
