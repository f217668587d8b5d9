package listing

import (
	"encoding/json"

	"github.com/agentmesh/agentmesh/contract/control"
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
