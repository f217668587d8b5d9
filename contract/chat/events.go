package chat

import "encoding/json"

// Event types of the Multica client streaming protocol.
const (
	EventMessageStart       = "message_start"
	EventMessageUpdate      = "message_update"
	EventMessageEnd         = "message_end"
	EventToolExecutionStart = "tool_execution_start"
	EventToolExecutionEnd   = "tool_execution_end"
	EventCompactionStart    = "compaction_start"
	EventCompactionEnd      = "compaction_end"
)

// StreamMessage is the message carried by message_* events: the full
// accumulated content so far, and the stop reason on message_end.
type StreamMessage struct {
	Role       string  `json:"role"`
	Content    Content `json:"content"`
	StopReason string  `json:"stopReason,omitempty"`
}

// Event is an AgentEvent or a CompactionEvent; each type carries only its
// fields (pointers keep a zero that must be sent, such as isError:false or
// removed:0).
type Event struct {
	Type string `json:"type"`
	// message_start, message_update, message_end
	Message *StreamMessage `json:"message,omitempty"`
	// tool_execution_start, tool_execution_end
	ToolCallID string          `json:"toolCallId,omitempty"`
	ToolName   string          `json:"toolName,omitempty"`
	Args       json.RawMessage `json:"args,omitempty"`
	Result     *string         `json:"result,omitempty"`
	IsError    *bool           `json:"isError,omitempty"`
	// compaction_end; tokensRemoved and tokensKept are absent in count mode
	Removed       *int   `json:"removed,omitempty"`
	Kept          *int   `json:"kept,omitempty"`
	TokensRemoved *int   `json:"tokensRemoved,omitempty"`
	TokensKept    *int   `json:"tokensKept,omitempty"`
	Reason        string `json:"reason,omitempty"`
}

// StreamPayload is the envelope of every streamed event. Each assistant
// message has its own streamId (the id a client keys its bubble by); a
// tool execution carries the streamId of the message that called it;
// compaction events use "compaction:{agentId}".
type StreamPayload struct {
	StreamID string `json:"streamId"`
	AgentID  string `json:"agentId"`
	Event    Event  `json:"event"`
}

// SeqEvent is a StreamPayload with its position in the agent's event log.
type SeqEvent struct {
	Seq uint64 `json:"seq"`
	StreamPayload
	// RequestID is the request_id of the send whose turn emitted the
	// event (compaction events included), so that a follower relays its
	// own turn's events and no other's on an agent shared by callers.
	RequestID string `json:"request_id,omitempty"`
}

// EventsPage is the answer of chat.events.
type EventsPage struct {
	Events  []SeqEvent `json:"events"`
	NextSeq uint64     `json:"next_seq"` // pass as after_seq next time
	Dropped uint64     `json:"dropped"`  // events after after_seq no longer held
	Closed  bool       `json:"closed,omitempty"`
}

// EventsParams are the params of chat.events as a follower sends them:
// the events after AfterSeq, waiting up to WaitMs for the first; Tail
// answers where the log stands instead (no events).
type EventsParams struct {
	AgentID  string `json:"agentId"`
	AfterSeq uint64 `json:"after_seq"`
	WaitMs   int64  `json:"wait_ms"`
	Max      int    `json:"max,omitempty"`
	Tail     bool   `json:"tail,omitempty"`
}

// RawEvent is a SeqEvent as a relay reads it: its event kept raw, to be
// passed on as the agent wrote it (a relay that needs its fields decodes
// it into an Event).
type RawEvent struct {
	Seq      uint64          `json:"seq"`
	StreamID string          `json:"streamId"`
	AgentID  string          `json:"agentId"`
	Event    json.RawMessage `json:"event"`
	// RequestID is the request_id of the send whose turn emitted it.
	RequestID string `json:"request_id,omitempty"`
}

// RawEventsPage is EventsPage as a relay reads it.
type RawEventsPage struct {
	Events  []RawEvent `json:"events"`
	NextSeq uint64     `json:"next_seq"`
	Dropped uint64     `json:"dropped"`
	Closed  bool       `json:"closed"`
}
