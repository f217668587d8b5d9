package chat

import (
	"context"
	"encoding/json"
	"sync"
	"time"
)

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
	size      int    // its JSON size, measured once when published
}

// MaxPageBytes bounds the JSON size of one chat.events page. Every
// message_update carries the whole text so far, so a page of a long
// answer's events could otherwise pass a link's 1 MiB message limit, and
// the answer would cost the chat agent its link. A page always holds at
// least one event.
const MaxPageBytes = 256 << 10

// eventLog is an agent's bounded ring of events. Seq numbers start at 1
// and never repeat; a reader that falls behind by more than the ring's
// size is told how many it missed.
type eventLog struct {
	mu      sync.Mutex
	ring    []SeqEvent
	start   int    // index of the oldest event in ring
	n       int    // events held
	next    uint64 // seq of the next event
	changed chan struct{}
	closed  bool
	subs    map[int]func(SeqEvent)
	subID   int
}

func newEventLog(size int) *eventLog {
	if size <= 0 {
		size = 1024
	}
	return &eventLog{ring: make([]SeqEvent, size), next: 1, changed: make(chan struct{}), subs: map[int]func(SeqEvent){}}
}

// publish appends p and wakes the readers; in-process subscribers are
// called synchronously, in order.
func (l *eventLog) publish(p StreamPayload, requestID string) {
	size := 64
	if b, err := json.Marshal(p); err == nil {
		size += len(b)
	}
	l.mu.Lock()
	ev := SeqEvent{Seq: l.next, StreamPayload: p, RequestID: requestID, size: size + len(requestID) + 16}
	l.next++
	if l.n < len(l.ring) {
		l.ring[(l.start+l.n)%len(l.ring)] = ev
		l.n++
	} else {
		l.ring[l.start] = ev
		l.start = (l.start + 1) % len(l.ring)
	}
	close(l.changed)
	l.changed = make(chan struct{})
	subs := make([]func(SeqEvent), 0, len(l.subs))
	for _, f := range l.subs {
		subs = append(subs, f)
	}
	l.mu.Unlock()
	for _, f := range subs {
		f(ev)
	}
}

// subscribe calls f with every event published from now on, until the
// returned function is called. f must not block.
func (l *eventLog) subscribe(f func(SeqEvent)) (cancel func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	id := l.subID
	l.subID++
	l.subs[id] = f
	return func() {
		l.mu.Lock()
		delete(l.subs, id)
		l.mu.Unlock()
	}
}

// close wakes the readers for good.
func (l *eventLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.closed = true
		close(l.changed)
	}
}

// EventsPage is the answer of chat.events.
type EventsPage struct {
	Events  []SeqEvent `json:"events"`
	NextSeq uint64     `json:"next_seq"` // pass as after_seq next time
	Dropped uint64     `json:"dropped"`  // events after after_seq no longer held
	Closed  bool       `json:"closed,omitempty"`
}

// read returns the events after afterSeq (at most max), waiting up to
// wait for the first one.
func (l *eventLog) read(ctx context.Context, afterSeq uint64, max int, wait time.Duration) EventsPage {
	if max <= 0 {
		max = 256
	}
	var t *time.Timer
	for {
		l.mu.Lock()
		page := EventsPage{Events: []SeqEvent{}, NextSeq: afterSeq, Closed: l.closed}
		if afterSeq >= l.next {
			// A seq from the future (an earlier process): start over.
			afterSeq = 0
		}
		oldest := l.next - uint64(l.n)
		if afterSeq+1 < oldest {
			page.Dropped = oldest - afterSeq - 1
		}
		bytes := 0
		for i := 0; i < l.n && len(page.Events) < max; i++ {
			ev := l.ring[(l.start+i)%len(l.ring)]
			if ev.Seq > afterSeq {
				if bytes += ev.size; bytes > MaxPageBytes && len(page.Events) > 0 {
					break
				}
				page.Events = append(page.Events, ev)
			}
		}
		if len(page.Events) > 0 {
			page.NextSeq = page.Events[len(page.Events)-1].Seq
		} else if page.Dropped > 0 || afterSeq == 0 {
			page.NextSeq = l.next - 1
		}
		ch := l.changed
		l.mu.Unlock()
		if len(page.Events) > 0 || page.Closed || wait <= 0 {
			return page
		}
		if t == nil {
			t = time.NewTimer(wait)
			defer t.Stop()
		}
		select {
		case <-ch:
		case <-t.C:
			return page
		case <-ctx.Done():
			return page
		}
	}
}

// tail is where the log stands: no events, next_seq the last seq.
func (l *eventLog) tail() EventsPage {
	l.mu.Lock()
	defer l.mu.Unlock()
	return EventsPage{Events: []SeqEvent{}, NextSeq: l.next - 1, Closed: l.closed}
}

func intPtr(n int) *int { return &n }

func strPtr(s string) *string { return &s }
