package chat

import (
	"time"

	wire "github.com/agentmesh/agentmesh/contract/chat"
)

// The chat agent's messages, content blocks, events and results are its
// wire contract, declared in package contract/chat (which the surfaces
// relaying a chat agent import too); the names below keep this package's
// API.

// Roles of a Message (the Multica AgentMessage union).
const (
	RoleUser       = wire.RoleUser
	RoleAssistant  = wire.RoleAssistant
	RoleToolResult = wire.RoleToolResult
)

// Content block types.
const (
	BlockText     = wire.BlockText
	BlockThinking = wire.BlockThinking
	BlockToolCall = wire.BlockToolCall
	BlockImage    = wire.BlockImage
)

// Stop reasons of assistant messages (see contract/chat).
const (
	StopEndTurn   = wire.StopEndTurn
	StopToolUse   = wire.StopToolUse
	StopMaxTokens = wire.StopMaxTokens
	StopAborted   = wire.StopAborted
	StopError     = wire.StopError
)

type (
	// ImageSource is an image block's data.
	ImageSource = wire.ImageSource
	// ContentBlock is one block of a message's content.
	ContentBlock = wire.ContentBlock
	// Content is a message's content.
	Content = wire.Content
	// Usage is an assistant message's token counts.
	Usage = wire.Usage
	// Message is one AgentMessage.
	Message = wire.Message
	// MessagesPage is the answer of getAgentMessages.
	MessagesPage = wire.MessagesPage

	// AgentInfo is one row of list.
	AgentInfo = wire.AgentInfo
	// CreateResult is the answer of create.
	CreateResult = wire.CreateResult
	// ResetResult is the answer of reset.
	ResetResult = wire.ResetResult
	// Tokens is the answer of get_tokens.
	Tokens = wire.Tokens
	// ContextInfo is the answer of get_context.
	ContextInfo = wire.ContextInfo
	// SendResult is the answer of send.
	SendResult = wire.SendResult
)

// Text returns a text block.
func Text(s string) ContentBlock { return wire.Text(s) }

// TextOf joins the text blocks of c.
func TextOf(c Content) string { return wire.TextOf(c) }

// ToolCalls returns the toolCall blocks of c.
func ToolCalls(c Content) []ContentBlock { return wire.ToolCalls(c) }

func nowMs() int64 { return time.Now().UnixMilli() }

func boolPtr(b bool) *bool { return &b }

// cloneContent copies c deep enough for a snapshot sent to subscribers.
func cloneContent(c Content) Content {
	out := make(Content, len(c))
	copy(out, c)
	return out
}
