package chat

import (
	"encoding/json"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
)

// The params of the chat methods accept agentId (Multica's spelling) or
// agent_id (NEXUS3's), so they are written by hand; the results are
// derived from the Go types the methods answer with.

const agentIDProps = `"agentId":{"type":"string","description":"the chat agent (agent_id also accepted)"},
	"agent_id":{"type":"string","description":"the chat agent (agentId also accepted)"}`

func paramsWith(extra string, required ...string) json.RawMessage {
	props := agentIDProps
	if extra != "" {
		props += "," + extra
	}
	req, _ := json.Marshal(required)
	if len(required) == 0 {
		req = []byte("[]")
	}
	return json.RawMessage(`{"type":"object","properties":{` + props + `},"required":` + string(req) + `}`)
}

func resultOf[T any]() json.RawMessage {
	s, err := control.SchemaFor[T]()
	if err != nil {
		panic("chat: schema: " + err.Error())
	}
	return s
}

// declareSchemas declares the schema of every chat method on a, so that
// the hub's schema, rpc.discover, MCP tools/list and agentick's
// tool-catalog describe them.
func declareSchemas(a *agents.Agent) {
	notFound := []string{envelope.CodeInvalidParams.String(), envelope.CodeAgentNotFound.String()}
	create := control.MethodSchema{
		Description: "Create a chat agent (id optional: 8 hex digits are chosen; a closed agent's session file is resumed), with an optional system prompt.",
		Params: json.RawMessage(`{"type":"object","properties":{` + agentIDProps + `,
			"system_prompt":{"type":"string","description":"system prompt of a new agent"}},"required":[]}`),
		Result: resultOf[CreateResult](),
		Errors: []string{envelope.CodeInvalidParams.String()},
	}
	destroy := control.MethodSchema{
		Description: "Destroy a chat agent: its running turn is cancelled; its session file stays.",
		Params:      paramsWith(""),
		Result:      json.RawMessage(`{"type":"object","properties":{"success":{"type":"boolean"},"agent_id":{"type":"string"}},"required":["success","agent_id"]}`),
		Errors:      []string{envelope.CodeInvalidParams.String()},
	}
	list := control.MethodSchema{
		Description: "List the agents of the pool.",
		Params:      json.RawMessage(`{"type":"object","properties":{}}`),
		Result:      json.RawMessage(`{"type":"object","properties":{"agents":` + string(resultOf[[]AgentInfo]()) + `},"required":["agents"]}`),
		Idempotent:  true,
	}
	for _, m := range []string{"chat.create", "chat.create_agent"} {
		a.SetSchema(m, create)
	}
	for _, m := range []string{"chat.destroy", "chat.destroy_agent"} {
		a.SetSchema(m, destroy)
	}
	for _, m := range []string{"chat.list", "chat.list_agents"} {
		a.SetSchema(m, list)
	}
	a.SetSchema("chat.send", control.MethodSchema{
		Description: "Run one turn: the message goes to the provider (and the tools it calls); the answer is returned whole. Called as a stream (mesh.Client.Stream; the Multica and OpenAI surfaces do), the turn's events (those of chat.events) are its chunks, then the answer; a follower that joins late reads them with chat.events. Sends to one agent run one at a time, in order.",
		Params: paramsWith(`"content":{"type":"string","description":"the user's message"},
			"request_id":{"type":"string","description":"names the turn for chat.cancel and in its events (default: a new id)"},
			"conversation":{"type":"integer","minimum":0,"description":"the conversation the message is meant for (chat.get_context's): after a chat.reset since, the send is CANCELLED without running"}`, "content"),
		Result: resultOf[SendResult](),
		Errors: append(notFound, envelope.CodeCancelled.String(), envelope.CodeOverloaded.String(), envelope.CodeUnavailable.String(), envelope.CodeRPCError.String()),
	})
	a.SetSchema("chat.cancel", control.MethodSchema{
		Description: "Cancel a queued or running turn by its request_id.",
		Params:      paramsWith(`"request_id":{"type":"string"}`, "request_id"),
		Result: json.RawMessage(`{"type":"object","properties":{"cancelled":{"type":"boolean"},"request_id":{"type":"string"},
			"reason":{"type":"string","enum":["not_found_or_completed"]}},"required":["cancelled","request_id"]}`),
		Errors:     notFound,
		Idempotent: true,
	})
	a.SetSchema("chat.reset", control.MethodSchema{
		Description: "Clear the agent's conversation: the sends in flight are cancelled, the session file is moved aside (ID.jsonl.reset-UNIXMS, kept) and an empty history starts, with the same id and system prompt and no compaction state.",
		Params:      paramsWith(""),
		Result:      resultOf[ResetResult](),
		Errors:      append(notFound, envelope.CodeCancelled.String(), envelope.CodeInternal.String()),
	})
	a.SetSchema("chat.shutdown", control.MethodSchema{
		Description: "Mark the agent to shut down: it takes no more sends.",
		Params:      paramsWith(""),
		Result:      json.RawMessage(`{"type":"object","properties":{"success":{"type":"boolean"}},"required":["success"]}`),
		Errors:      notFound,
		Idempotent:  true,
	})
	a.SetSchema("chat.get_tokens", control.MethodSchema{
		Description: "Token use of the agent's context (estimates, about 4 bytes a token).",
		Params:      paramsWith(""),
		Result:      resultOf[Tokens](),
		Errors:      notFound,
		Idempotent:  true,
	})
	a.SetSchema("chat.get_context", control.MethodSchema{
		Description: "The agent's context: message counts, summary, compactions, budget.",
		Params:      paramsWith(""),
		Result:      resultOf[ContextInfo](),
		Errors:      notFound,
		Idempotent:  true,
	})
	a.SetSchema("chat.getAgentMessages", control.MethodSchema{
		Description: "A page of an agent's history, also of a closed agent whose session file exists.",
		Params: paramsWith(`"offset":{"type":"integer","minimum":0,"description":"default 0"},
			"limit":{"type":"integer","minimum":0,"description":"default 50"}`),
		Result:     resultOf[MessagesPage](),
		Errors:     notFound,
		Idempotent: true,
	})
	a.SetSchema("chat.events", control.MethodSchema{
		Description: "The agent's stream events after after_seq (a long poll of up to wait_ms), each a StreamPayload with its seq and the request_id of its turn; tail: true answers where the log stands.",
		Params: paramsWith(`"after_seq":{"type":"integer","minimum":0},"wait_ms":{"type":"integer","minimum":0},
			"max":{"type":"integer","minimum":0,"maximum":1024},"tail":{"type":"boolean"}`),
		Result:     resultOf[EventsPage](),
		Errors:     notFound,
		Idempotent: true,
	})
}
