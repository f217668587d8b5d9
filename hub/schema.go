package hub

import (
	"context"
	"encoding/json"
	"slices"
	"strings"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub/guard"
	"github.com/agentmesh/agentmesh/internal/openrpc"
	"github.com/agentmesh/agentmesh/link"
)

func mustSchema[T any]() json.RawMessage {
	s, err := control.SchemaFor[T]()
	if err != nil {
		panic(err)
	}
	return s
}

// builtinSchemas describe the hub's own methods.
var builtinSchemas = func() map[string]control.MethodSchema {
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

// chatStreamEvents are the stream events of chat agents (chat.events, and
// Multica's "stream" messages: StreamPayload {streamId, agentId, event}),
// as the Multica streaming seed names them, with their categories.
var chatStreamEvents = []control.SchemaEvent{
	{Type: "message_start", Category: "model"},
	{Type: "message_update", Category: "model"},
	{Type: "message_end", Category: "model"},
	{Type: "tool_execution_start", Category: "orchestration"},
	{Type: "tool_execution_end", Category: "orchestration"},
	{Type: "compaction_start", Category: "orchestration"},
	{Type: "compaction_end", Category: "orchestration"},
}

// agentErrors are the codes any routed call may end with, whatever the
// agent declared.
var agentErrors = []string{"METHOD_NOT_FOUND", "UNAVAILABLE", "TIMEOUT", "CIRCUIT_OPEN", "OVERLOADED", "CANCELLED", "RPC_ERROR"}

// Schema returns the mesh's contract as it stands now: the built-ins and
// every method an agent serves (the first instance, by id, that declared
// a schema for it wins).
func (h *Hub) Schema() control.SchemaPayload {
	out := control.SchemaPayload{ProtocolVersion: envelope.Version, Methods: map[string]control.SchemaMethod{}, Events: slices.Clone(chatStreamEvents), Errors: envelope.CodeTable()}
	for m := range h.builtins {
		s := builtinSchemas[m]
		out.Methods[m] = control.SchemaMethod{Description: s.Description, Builtin: true, Params: s.Params, Response: s.Result,
			Errors: s.Errors, Roles: h.rolesOf(m, nil), Idempotent: s.Idempotent}
	}
	for _, in := range h.reg.Snapshot().Instances() {
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
			for _, e := range agentErrors {
				if !slices.Contains(errs, e) {
					errs = append(errs, e)
				}
			}
			ms := control.SchemaMethod{Description: s.Description, Params: s.Params, Response: s.Result, Errors: errs,
				Roles: h.rolesOf(m, s.Roles), Idempotent: s.Idempotent || h.policies.For(m).Idempotent, Streaming: s.Streaming,
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

// rolesOf returns the roles a call to m needs: the hub's when it
// authenticates, else those declared.
func (h *Hub) rolesOf(m string, declared []string) []string {
	if !h.guard.On() {
		return declared
	}
	if guard.AdminMethods[m] {
		return []string{auth.RoleAdmin}
	}
	if r, ok := h.guard.Roles.Lookup(m); ok {
		return r
	}
	return nil
}

func (h *Hub) meshSchema(ctx context.Context, _ *link.Link, raw json.RawMessage) (any, error) {
	if err := control.DecodeParams("schema", raw, &struct{}{}); err != nil {
		return nil, err
	}
	return h.Schema(), nil
}

func (h *Hub) rpcDiscover(ctx context.Context, _ *link.Link, raw json.RawMessage) (any, error) {
	if err := control.DecodeParams("rpc.discover", raw, &struct{}{}); err != nil {
		return nil, err
	}
	return openrpc.FromSchema(h.Schema()), nil
}

// Streaming reports whether an agent declared method a streaming one (its
// schema's "streaming"): surfaces without a stream call of their own
// (JSON-RPC, agentick, Multica) call it as a stream. The snapshot counts
// the declarations as instances come and go (Snapshot.Streaming).
func (h *Hub) Streaming(method string) bool { return h.reg.Snapshot().Streaming(method) }
