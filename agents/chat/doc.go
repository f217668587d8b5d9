// Package chat is the chat-agent runtime: a pool of conversational agents
// (NEXUS3's AgentPool: create, destroy, list, shutdown) whose turns run
// through a Provider (an offline scripted one, or any OpenAI-compatible
// chat-completions endpoint), stream events as the Multica client
// streaming protocol specifies (StreamPayload {streamId, agentId, event}),
// call tools (among them mesh_call, which calls another method through the
// mesh: agents talking to agents), compact their context when it passes
// its token or message budget, and keep their history in one JSON-lines
// session file per agent, so that it survives restarts.
//
// NewService exposes a Runtime on the mesh as an agents.Agent serving
// chat.* methods. The mesh's links are request/response, so events reach
// clients by long poll: chat.events {agentId, after_seq, wait_ms} answers
// the events after after_seq from a bounded ring buffer per agent, waiting
// up to wait_ms for the first one.
package chat
