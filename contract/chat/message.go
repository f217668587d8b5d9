package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Roles of a Message (the Multica AgentMessage union).
const (
	RoleUser       = "user"
	RoleAssistant  = "assistant"
	RoleToolResult = "toolResult"
)

// Content block types.
const (
	BlockText     = "text"
	BlockThinking = "thinking"
	BlockToolCall = "toolCall"
	BlockImage    = "image"
)

// Stop reasons of assistant messages. end_turn, tool_use and max_tokens
// follow the seed's example (Anthropic's names); aborted marks a turn that
// was cancelled, error one whose provider failed.
const (
	StopEndTurn   = "end_turn"
	StopToolUse   = "tool_use"
	StopMaxTokens = "max_tokens"
	StopAborted   = "aborted"
	StopError     = "error"
)

// ImageSource is an image block's data.
type ImageSource struct {
	Type      string `json:"type"` // "base64"
	MediaType string `json:"media_type"`
	Data      string `json:"data"`
}

// ContentBlock is one of TextContent {type, text}, ThinkingContent {type,
// thinking}, ToolCall {type, id, name, arguments} and ImageContent {type,
// source}; it marshals to exactly its type's fields.
type ContentBlock struct {
	Type      string
	Text      string
	Thinking  string
	ID        string
	Name      string
	Arguments json.RawMessage // a JSON object
	Source    *ImageSource
}

// Text returns a text block.
func Text(s string) ContentBlock { return ContentBlock{Type: BlockText, Text: s} }

// blockSchema is the JSON Schema of a content block as MarshalJSON
// writes it: one of the four block shapes.
const blockSchema = `{"oneOf":[` +
	`{"type":"object","properties":{"type":{"const":"text"},"text":{"type":"string"}},"required":["type","text"],"additionalProperties":false},` +
	`{"type":"object","properties":{"type":{"const":"thinking"},"thinking":{"type":"string"}},"required":["type","thinking"],"additionalProperties":false},` +
	`{"type":"object","properties":{"type":{"const":"toolCall"},"id":{"type":"string"},"name":{"type":"string"},"arguments":{"type":"object"}},"required":["type","id","name","arguments"],"additionalProperties":false},` +
	`{"type":"object","properties":{"type":{"const":"image"},"source":{"type":"object","properties":{"type":{"type":"string"},"media_type":{"type":"string"},"data":{"type":"string"}},"required":["type","media_type","data"],"additionalProperties":false}},"required":["type","source"],"additionalProperties":false}` +
	`]}`

// JSONSchema is the schema of the block on the wire (control.Schemer):
// one of text, thinking, toolCall and image, with their fields.
func (ContentBlock) JSONSchema() json.RawMessage { return json.RawMessage(blockSchema) }

// JSONSchema is the schema of content on the wire (control.Schemer): an
// array of blocks, never null.
func (Content) JSONSchema() json.RawMessage {
	return json.RawMessage(`{"type":"array","items":` + blockSchema + `}`)
}

// MarshalJSON implements json.Marshaler.
func (b ContentBlock) MarshalJSON() ([]byte, error) {
	switch b.Type {
	case BlockText:
		return json.Marshal(struct {
			Type string `json:"type"`
			Text string `json:"text"`
		}{b.Type, b.Text})
	case BlockThinking:
		return json.Marshal(struct {
			Type     string `json:"type"`
			Thinking string `json:"thinking"`
		}{b.Type, b.Thinking})
	case BlockToolCall:
		args := b.Arguments
		if len(args) == 0 {
			args = json.RawMessage("{}")
		}
		return json.Marshal(struct {
			Type      string          `json:"type"`
			ID        string          `json:"id"`
			Name      string          `json:"name"`
			Arguments json.RawMessage `json:"arguments"`
		}{b.Type, b.ID, b.Name, args})
	case BlockImage:
		src := b.Source
		if src == nil {
			src = &ImageSource{Type: "base64"}
		}
		return json.Marshal(struct {
			Type   string       `json:"type"`
			Source *ImageSource `json:"source"`
		}{b.Type, src})
	}
	return nil, fmt.Errorf("chat: unknown content block type %q", b.Type)
}

// UnmarshalJSON implements json.Unmarshaler; it refuses unknown types and
// tool-call arguments that are not an object.
func (b *ContentBlock) UnmarshalJSON(data []byte) error {
	var w struct {
		Type      string          `json:"type"`
		Text      *string         `json:"text"`
		Thinking  *string         `json:"thinking"`
		ID        string          `json:"id"`
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
		Source    *ImageSource    `json:"source"`
	}
	if err := json.Unmarshal(data, &w); err != nil {
		return err
	}
	*b = ContentBlock{Type: w.Type}
	switch w.Type {
	case BlockText:
		if w.Text == nil {
			return errors.New("chat: text block without text")
		}
		b.Text = *w.Text
	case BlockThinking:
		if w.Thinking == nil {
			return errors.New("chat: thinking block without thinking")
		}
		b.Thinking = *w.Thinking
	case BlockToolCall:
		if w.ID == "" || w.Name == "" {
			return errors.New("chat: toolCall block without id or name")
		}
		b.ID, b.Name = w.ID, w.Name
		args := bytes.TrimSpace(w.Arguments)
		if len(args) == 0 || string(args) == "null" {
			args = []byte("{}")
		}
		if args[0] != '{' {
			return errors.New("chat: toolCall arguments must be an object")
		}
		b.Arguments = append(json.RawMessage(nil), args...)
	case BlockImage:
		if w.Source == nil {
			return errors.New("chat: image block without source")
		}
		b.Source = w.Source
	default:
		return fmt.Errorf("chat: unknown content block type %q", w.Type)
	}
	return nil
}

// Content is a message's content: always marshalled as an array of blocks;
// a plain string (the seed's historical user messages) is accepted and
// read as one text block.
type Content []ContentBlock

// MarshalJSON implements json.Marshaler ([] rather than null when empty).
func (c Content) MarshalJSON() ([]byte, error) {
	if c == nil {
		return []byte("[]"), nil
	}
	return json.Marshal([]ContentBlock(c))
}

// UnmarshalJSON implements json.Unmarshaler.
func (c *Content) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	if len(data) > 0 && data[0] == '"' {
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return err
		}
		*c = Content{Text(s)}
		return nil
	}
	var bs []ContentBlock
	if err := json.Unmarshal(data, &bs); err != nil {
		return err
	}
	*c = bs
	return nil
}

// Usage is an assistant message's token counts.
type Usage struct {
	Input       int `json:"input"`
	Output      int `json:"output"`
	TotalTokens int `json:"totalTokens"`
}

// Message is one AgentMessage: a UserMessage, an AssistantMessage (model,
// provider, usage, stopReason) or a ToolResultMessage (toolCallId,
// toolName, isError). Timestamp is in Unix milliseconds.
type Message struct {
	Role         string  `json:"role"`
	Content      Content `json:"content"`
	Model        string  `json:"model,omitempty"`
	Provider     string  `json:"provider,omitempty"`
	Usage        *Usage  `json:"usage,omitempty"`
	StopReason   string  `json:"stopReason,omitempty"`
	ErrorMessage string  `json:"errorMessage,omitempty"`
	ToolCallID   string  `json:"toolCallId,omitempty"`
	ToolName     string  `json:"toolName,omitempty"`
	IsError      *bool   `json:"isError,omitempty"`
	Timestamp    int64   `json:"timestamp"`
}

// Validate checks the fields a role requires.
func (m *Message) Validate() error {
	switch m.Role {
	case RoleUser, RoleAssistant:
	case RoleToolResult:
		if m.ToolCallID == "" {
			return errors.New("chat: toolResult message without toolCallId")
		}
		if m.IsError == nil {
			return errors.New("chat: toolResult message without isError")
		}
	default:
		return fmt.Errorf("chat: unknown role %q", m.Role)
	}
	return nil
}

// TextOf joins the text blocks of c.
func TextOf(c Content) string {
	var b bytes.Buffer
	for _, bl := range c {
		if bl.Type == BlockText {
			b.WriteString(bl.Text)
		}
	}
	return b.String()
}

// ToolCalls returns the toolCall blocks of c.
func ToolCalls(c Content) []ContentBlock {
	var out []ContentBlock
	for _, bl := range c {
		if bl.Type == BlockToolCall {
			out = append(out, bl)
		}
	}
	return out
}

// MessagesPage is the answer of chat.getAgentMessages: a page of an
// agent's history.
type MessagesPage struct {
	Messages []Message `json:"messages"`
	Total    int       `json:"total"`
	Offset   int       `json:"offset"`
	Limit    int       `json:"limit"`
}
