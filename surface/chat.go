package surface

import (
	"context"
	"encoding/json"
	"time"

	"github.com/agentmesh/agentmesh/contract/chat"
	"github.com/agentmesh/agentmesh/envelope"
)

// ChatEvent is one streamed event of a chat agent as chat.events returns
// it: a Multica StreamPayload {streamId, agentId, event} with its place
// in the agent's event log (contract/chat's RawEvent). The event is kept
// raw: the hub passes it on, it does not interpret it (a surface that
// needs its fields decodes it into a chat.Event).
type ChatEvent = chat.RawEvent

// WithRequestID returns req's chat.send request_id, giving req one first
// when it has none, so that a surface can tell its own turn's events from
// those of other callers of the same agent. Params that are not an object
// are left as they are (the chat agent answers INVALID_PARAMS).
func WithRequestID(req *envelope.Request) string {
	var p map[string]json.RawMessage
	if json.Unmarshal(req.Params, &p) != nil || p == nil {
		return ""
	}
	var id string
	if raw, ok := p["request_id"]; ok {
		if json.Unmarshal(raw, &id) != nil {
			return "" // not a string: the chat agent answers INVALID_PARAMS
		}
		if id != "" {
			return id
		}
	}
	id = envelope.NewID()
	p["request_id"] = quote(id)
	if b, err := json.Marshal(p); err == nil {
		req.Params = b
		return id
	}
	return ""
}

// chatPollWait is how long one chat.events long poll waits for an event.
const chatPollWait = 10 * time.Second

// ChatTail returns the seq of the last event agentID has emitted, so that
// a follower started with it sees only what comes next.
func ChatTail(ctx context.Context, h Invoker, agentID string) (uint64, error) {
	p, err := chatEvents(ctx, h, agentID, 0, true, 0)
	if err != nil {
		return 0, err
	}
	return p.NextSeq, nil
}

func chatEvents(ctx context.Context, h Invoker, agentID string, after uint64, tail bool, wait time.Duration) (*chat.RawEventsPage, error) {
	params, _ := json.Marshal(chat.EventsParams{AgentID: agentID, AfterSeq: after, WaitMs: wait.Milliseconds(), Tail: tail})
	cctx, cancel := context.WithTimeout(ctx, wait+5*time.Second)
	defer cancel()
	res, err := h.Invoke(cctx, &envelope.Request{Method: "chat.events", Params: params,
		Timestamp: time.Now().UnixMilli(), Version: envelope.Version})
	if err != nil {
		return nil, err
	}
	var p chat.RawEventsPage
	if err := json.Unmarshal(res.Result, &p); err != nil {
		return nil, envelope.Errorf(envelope.CodeInternal, "chat.events: unexpected answer: %v", err)
	}
	return &p, nil
}

// FollowChat calls fn with every event agentID emits after seq after, in
// order, by long polls of chat.events through h (the hub's ingress)
// (so the caller's principal in ctx is checked as for any call). It
// returns when ctx ends (nil), when fn returns false (nil), when the
// agent is closed (nil), or on an error of chat.events. Events the agent's
// ring dropped before they were read are skipped; dropped counts them.
func FollowChat(ctx context.Context, h Invoker, agentID string, after uint64, fn func(ChatEvent) bool) (dropped uint64, err error) {
	for ctx.Err() == nil {
		p, err := chatEvents(ctx, h, agentID, after, false, chatPollWait)
		if err != nil {
			if ctx.Err() != nil {
				return dropped, nil
			}
			if e := envelope.AsError(err); e.Code == envelope.CodeOverloaded && e.NotSent() {
				// A rate limit (the hub's, the identity's, the
				// connection's) refused this poll: the follow goes on
				// from the same seq after the limiter's hint instead of
				// ending the subscription; the agent's ring keeps the
				// events meanwhile (what it drops is counted).
				t := time.NewTimer(min(max(e.RetryAfter(), 50*time.Millisecond), 5*time.Second))
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
					return dropped, nil
				}
				continue
			}
			return dropped, err
		}
		dropped += p.Dropped
		for _, e := range p.Events {
			if !fn(e) {
				return dropped, nil
			}
		}
		if p.NextSeq > after {
			after = p.NextSeq
		}
		if p.Closed && len(p.Events) == 0 {
			return dropped, nil
		}
	}
	return dropped, nil
}

// Invoker is the part of Host the chat relay needs.
type Invoker interface {
	Invoke(ctx context.Context, req *envelope.Request) (*envelope.Response, error)
}

// quote is s as a JSON string.
func quote(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}
