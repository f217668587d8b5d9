// Package chat is the wire contract of the chat agent (agents/chat): its
// messages and content blocks, the events its turns stream (Multica's
// StreamPayload {streamId, agentId, event}), the pages chat.events and
// chat.getAgentMessages answer, and the results of its methods. The chat
// runtime answers with these types and the protocol surfaces that relay
// a chat agent (agentick, OpenAI, Multica) read them, so that each field
// is declared once. It imports nothing of the project.
//
// The package is named chat, as its directory: contract/control set the
// rule (a contract is named for what it describes), and the one importer
// that is itself named chat, the runtime, imports it under another name.
package chat
