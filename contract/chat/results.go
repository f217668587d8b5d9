package chat

// The results of the chat agent's methods (see agents/chat's service for
// the methods and their params).

// AgentInfo is one row of chat.list.
type AgentInfo struct {
	AgentID        string `json:"agent_id"`
	CreatedAt      string `json:"created_at"`
	MessageCount   int    `json:"message_count"`
	ShouldShutdown bool   `json:"should_shutdown"`
}

// CreateResult is the answer of chat.create.
type CreateResult struct {
	AgentID      string `json:"agent_id"`
	CreatedAt    string `json:"created_at"`
	Resumed      bool   `json:"resumed"`       // an existing session file was loaded
	MessageCount int    `json:"message_count"` // messages in its history
}

// ResetResult is the answer of chat.reset.
type ResetResult struct {
	AgentID string `json:"agent_id"`
	// Removed is the number of messages the history held.
	Removed int `json:"removed"`
	// Cancelled is the number of sends (running or queued) reset cancelled.
	Cancelled int `json:"cancelled"`
	// MovedTo is the base name the old session file was renamed to, in
	// the same directory ("" when there was nothing to move).
	MovedTo string `json:"moved_to,omitempty"`
}

// Tokens is the answer of chat.get_tokens.
type Tokens struct {
	System    int `json:"system"`
	Tools     int `json:"tools"`
	Messages  int `json:"messages"`
	Total     int `json:"total"`
	Budget    int `json:"budget"`
	Available int `json:"available"`
}

// ContextInfo is the answer of chat.get_context.
type ContextInfo struct {
	AgentID        string `json:"agent_id"`
	MessageCount   int    `json:"message_count"` // messages in the context
	HistoryCount   int    `json:"history_count"` // messages in the session file
	SystemPrompt   string `json:"system_prompt"`
	Summary        string `json:"summary,omitempty"`
	Compactions    int    `json:"compactions"`
	MaxMessages    int    `json:"max_messages"`
	CreatedAt      string `json:"created_at"`
	ShouldShutdown bool   `json:"should_shutdown"`
	Busy           bool   `json:"busy"` // a turn is running
	Tokens         Tokens `json:"tokens"`
	// Conversation counts the resets of the agent since it joined the
	// pool: a send may name the conversation it was meant for (SendIn).
	Conversation int `json:"conversation"`
}

// SendResult is the answer of chat.send.
type SendResult struct {
	Content   string `json:"content"`
	RequestID string `json:"request_id"`
}
