package chat

import (
	"context"
	"encoding/json"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/stream"
)

// Methods the chat agent serves. The pool's (NEXUS3's GlobalDispatcher):
//
//	chat.create   {agent_id?, system_prompt?}  → {agent_id, created_at, resumed, message_count}
//	chat.destroy  {agent_id}                   → {success, agent_id}
//	chat.list     {}                           → {agents: [{agent_id, created_at, message_count, should_shutdown}]}
//
// An agent's (NEXUS3's Dispatcher, plus Multica's getAgentMessages and the
// event long poll); each takes agentId (or agent_id):
//
//	chat.send             {agentId, content, request_id?, conversation?} → {content, request_id}
//	chat.cancel           {agentId, request_id}             → {cancelled, request_id[, reason]}
//	chat.reset            {agentId}                         → {agent_id, removed, cancelled, moved_to}: an empty conversation
//	chat.shutdown         {agentId}                         → {success}
//	chat.get_tokens       {agentId}                         → {system, tools, messages, total, budget, available}
//	chat.get_context      {agentId}                         → {message_count, history_count, …}
//	chat.getAgentMessages {agentId, offset?, limit?}        → {messages, total, offset, limit}
//	chat.events           {agentId, after_seq?, wait_ms?, max?} → {events: [{seq, streamId, agentId, event, request_id}], next_seq, dropped}
//	chat.events           {agentId, tail: true}             → {events: [], next_seq}: where to start following
//
// The NEXUS3 names chat.create_agent, chat.destroy_agent and
// chat.list_agents are aliases. Agent ids name agents of this runtime
// (conversations), not mesh instances: one chat agent process serves the
// whole pool, so run one per mesh (or address one with mesh.To).
var Methods = []string{
	"chat.create", "chat.destroy", "chat.list", "chat.send", "chat.cancel", "chat.reset", "chat.shutdown",
	"chat.get_tokens", "chat.get_context", "chat.getAgentMessages", "chat.events",
}

// MaxEventWait bounds chat.events' wait_ms, under the mesh's default call
// timeout so that a long poll never times out on its way.
const MaxEventWait = 25 * time.Second

func decode(method string, params json.RawMessage, v any) error {
	if len(params) == 0 || string(params) == "null" {
		params = []byte("{}")
	}
	if err := json.Unmarshal(params, v); err != nil {
		return control.ParamsError(method, err)
	}
	return nil
}

// NewService returns an agent (name "chat") serving rt's methods on the
// mesh. Run it with Run; close rt when it returns.
func NewService(rt *Runtime, opts ...agents.Option) *agents.Agent {
	a := agents.New("chat", opts...)
	create := func(ctx context.Context, p json.RawMessage) (any, error) {
		var in struct {
			AgentID      string `json:"agent_id"`
			AgentID2     string `json:"agentId"`
			SystemPrompt string `json:"system_prompt"`
		}
		if err := decode("chat.create", p, &in); err != nil {
			return nil, err
		}
		if in.AgentID == "" {
			in.AgentID = in.AgentID2
		}
		return rt.Create(in.AgentID, in.SystemPrompt)
	}
	destroy := func(ctx context.Context, p json.RawMessage) (any, error) {
		var in idParams
		if err := decode("chat.destroy", p, &in); err != nil {
			return nil, err
		}
		id := in.agentID()
		if id == "" {
			return nil, envelope.NewError(envelope.CodeInvalidParams, "Missing required parameter: agent_id")
		}
		return map[string]any{"success": rt.Destroy(ctx, id), "agent_id": id}, nil
	}
	list := func(ctx context.Context, p json.RawMessage) (any, error) {
		return map[string]any{"agents": rt.List()}, nil
	}
	a.Handle("chat.create", create)
	a.Handle("chat.create_agent", create)
	a.Handle("chat.destroy", destroy)
	a.Handle("chat.destroy_agent", destroy)
	a.Handle("chat.list", list)
	a.Handle("chat.list_agents", list)

	// per decodes an agent method's params and finds its agent.
	per := func(method string, p json.RawMessage, v interface{ agentID() string }) (*Agent, error) {
		if err := decode(method, p, v); err != nil {
			return nil, err
		}
		return rt.agent(v.agentID())
	}
	a.Handle("chat.send", func(ctx context.Context, p json.RawMessage) (any, error) {
		var in sendParams
		ag, err := per("chat.send", p, &in)
		if err != nil {
			return nil, err
		}
		if in.Content == nil {
			return nil, envelope.NewError(envelope.CodeInvalidParams, "Missing required parameter: content")
		}
		if snd := stream.SenderFrom(ctx); snd != nil {
			return streamTurn(ctx, ag, &in, snd)
		}
		return in.send(ctx, ag)
	})
	a.Handle("chat.cancel", func(ctx context.Context, p json.RawMessage) (any, error) {
		var in cancelParams
		ag, err := per("chat.cancel", p, &in)
		if err != nil {
			return nil, err
		}
		if in.RequestID == "" {
			return nil, envelope.NewError(envelope.CodeInvalidParams, "Missing required parameter: request_id")
		}
		if ag.Cancel(in.RequestID) {
			return map[string]any{"cancelled": true, "request_id": in.RequestID}, nil
		}
		return map[string]any{"cancelled": false, "request_id": in.RequestID, "reason": "not_found_or_completed"}, nil
	})
	a.Handle("chat.reset", func(ctx context.Context, p json.RawMessage) (any, error) {
		var in idParams
		ag, err := per("chat.reset", p, &in)
		if err != nil {
			return nil, err
		}
		return ag.Reset(ctx)
	})
	a.Handle("chat.shutdown", func(ctx context.Context, p json.RawMessage) (any, error) {
		var in idParams
		ag, err := per("chat.shutdown", p, &in)
		if err != nil {
			return nil, err
		}
		ag.Shutdown()
		return map[string]bool{"success": true}, nil
	})
	a.Handle("chat.get_tokens", func(ctx context.Context, p json.RawMessage) (any, error) {
		var in idParams
		ag, err := per("chat.get_tokens", p, &in)
		if err != nil {
			return nil, err
		}
		return ag.Tokens(), nil
	})
	a.Handle("chat.get_context", func(ctx context.Context, p json.RawMessage) (any, error) {
		var in idParams
		ag, err := per("chat.get_context", p, &in)
		if err != nil {
			return nil, err
		}
		return ag.Context(), nil
	})
	a.Handle("chat.getAgentMessages", func(ctx context.Context, p json.RawMessage) (any, error) {
		var in struct {
			idParams
			Offset int `json:"offset"`
			Limit  int `json:"limit"`
		}
		if err := decode("chat.getAgentMessages", p, &in); err != nil {
			return nil, err
		}
		return rt.Messages(in.agentID(), in.Offset, in.Limit)
	})
	a.Handle("chat.events", func(ctx context.Context, p json.RawMessage) (any, error) {
		var in struct {
			idParams
			AfterSeq uint64 `json:"after_seq"`
			WaitMs   int64  `json:"wait_ms"`
			Max      int    `json:"max"`
			Tail     bool   `json:"tail"`
		}
		ag, err := per("chat.events", p, &in)
		if err != nil {
			return nil, err
		}
		if in.Tail {
			return ag.events.tail(), nil
		}
		if in.WaitMs < 0 || in.Max < 0 || in.Max > 1024 {
			return nil, envelope.NewError(envelope.CodeInvalidParams, "wait_ms must not be negative and max must be within 0..1024")
		}
		wait := min(time.Duration(in.WaitMs)*time.Millisecond, MaxEventWait)
		if dl, ok := ctx.Deadline(); ok {
			// Answer before the caller gives up.
			wait = min(wait, time.Until(dl)*3/4)
		}
		return ag.Events(ctx, in.AfterSeq, in.Max, wait), nil
	})
	declareSchemas(a)
	return a
}

type idParams struct {
	AgentID  string `json:"agentId"`
	AgentID2 string `json:"agent_id"`
}

func (p *idParams) agentID() string {
	if p.AgentID != "" {
		return p.AgentID
	}
	return p.AgentID2
}

type sendParams struct {
	idParams
	Content      *string `json:"content"`
	RequestID    string  `json:"request_id"`
	Conversation *int    `json:"conversation"`
}

// send runs the turn on ag.
func (in *sendParams) send(ctx context.Context, ag *Agent) (*SendResult, error) {
	if in.Conversation != nil {
		return ag.SendIn(ctx, *in.Conversation, *in.Content, in.RequestID)
	}
	return ag.Send(ctx, *in.Content, in.RequestID)
}

// streamTurn is chat.send called as a stream: the turn's events, each
// a chunk (a chat.events event: {seq, streamId, agentId, event,
// request_id}), as they are published, then the turn's result. The events
// are read from the agent's log (its bounded ring), not pushed by
// the turn: a caller slow to read holds back its stream, never the turn;
// one that falls behind by more than the ring misses events, as a
// chat.events follower does.
func streamTurn(ctx context.Context, ag *Agent, in *sendParams, snd stream.Sender) (any, error) {
	if in.RequestID == "" {
		in.RequestID = newHexID() + newHexID()
	}
	after := ag.events.tail().NextSeq
	type outcome struct {
		res *SendResult
		err error
	}
	done := make(chan outcome, 1)
	turnCtx, cancelTurn := context.WithCancel(ctx)
	defer cancelTurn()
	running, turnEnded := context.WithCancel(ctx)
	defer turnEnded()
	go func() {
		res, err := in.send(turnCtx, ag)
		done <- outcome{res, err}
		turnEnded()
	}()
	var end *outcome
	for {
		// Until the turn ends, wait for its events; then read what the
		// log holds of it (every event of a turn is in the log before
		// its answer) and stop.
		page := ag.Events(running, after, 256, MaxEventWait)
		for _, e := range page.Events {
			if e.RequestID != in.RequestID {
				continue
			}
			b, err := json.Marshal(e)
			if err == nil {
				err = snd.Send(ctx, b)
			}
			if envelope.CodeOf(err) == envelope.CodeInvalidParams {
				// An event over the frame limit (a message_update holds
				// the whole message so far): skipped; the next ones, and
				// the answer, carry the rest.
				continue
			}
			if err != nil {
				cancelTurn() // the caller is gone: so is its turn
				if end == nil {
					<-done
				}
				return nil, err
			}
		}
		if page.NextSeq > after {
			after = page.NextSeq
		}
		if end != nil && len(page.Events) == 0 {
			return end.res, end.err
		}
		if end == nil && running.Err() != nil {
			o := <-done
			end = &o
		}
	}
}

type cancelParams struct {
	idParams
	RequestID string `json:"request_id"`
}
