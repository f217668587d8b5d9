package chat

import (
	"context"
	"errors"
	"fmt"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/telemetry"
)

func (a *Agent) send(ctx context.Context, content, requestID string, conversation *int) (*SendResult, error) {
	if requestID == "" {
		requestID = newHexID() + newHexID()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a.mu.Lock()
	switch {
	case a.closed:
		a.mu.Unlock()
		return nil, agentNotFound(a.id)
	case a.shouldShutdown:
		a.mu.Unlock()
		return nil, envelope.Errorf(envelope.CodeUnavailable, "agent %s is shutting down", a.id)
	case a.running[requestID] != nil:
		a.mu.Unlock()
		return nil, envelope.Errorf(envelope.CodeInvalidParams, "request_id %q is already in flight", requestID)
	}
	a.running[requestID] = cancel
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		delete(a.running, requestID)
		a.mu.Unlock()
	}()
	if int(a.waiting.Add(1)) > a.rt.cfg.MaxQueue {
		a.waiting.Add(-1)
		return nil, envelope.Errorf(envelope.CodeOverloaded, "agent %s has %d sends waiting already", a.id, a.rt.cfg.MaxQueue)
	}
	for {
		select {
		case a.turn <- struct{}{}:
		case <-ctx.Done():
			a.waiting.Add(-1)
			return nil, envelope.Errorf(envelope.CodeCancelled, "request %s cancelled before it ran", requestID)
		}
		a.mu.Lock()
		done := a.resetDone
		a.mu.Unlock()
		if done == nil {
			break
		}
		// A reset is under way (this send came after it cancelled the
		// sends in flight): it goes first, this send runs after it.
		<-a.turn
		select {
		case <-done:
		case <-ctx.Done():
			a.waiting.Add(-1)
			return nil, envelope.Errorf(envelope.CodeCancelled, "request %s cancelled before it ran", requestID)
		}
	}
	a.waiting.Add(-1)
	defer func() { <-a.turn }()
	a.mu.Lock()
	closed, conv := a.closed, a.conversation
	a.mu.Unlock()
	if closed {
		return nil, agentNotFound(a.id)
	}
	if ctx.Err() != nil {
		return nil, envelope.Errorf(envelope.CodeCancelled, "request %s cancelled before it ran", requestID)
	}
	if conversation != nil && *conversation != conv {
		return nil, envelope.Errorf(envelope.CodeCancelled, "request %s was sent to conversation %d of %s, which was reset (now %d); not run", requestID, *conversation, a.id, conv)
	}
	a.turnReq = requestID // read by publish, on this goroutine, while the token is held
	defer func() { a.turnReq = "" }()
	// The turn's span (invoke_agent) covers the turn's work, from the
	// moment it holds the turn: its wait in the queue is the RPC's.
	g := a.rt.genai.Load()
	tctx, turn := g.StartInvokeAgent(ctx, telemetry.GenAIAgent{
		Name: a.id, ID: a.id, ConversationID: a.id, Provider: a.rt.provider.Name(),
		RequestModel: requestModel(a.rt.provider), RequestID: requestID,
	})
	text, err := a.runTurn(tctx, g, &turn, content)
	turn.End(err)
	if err != nil {
		if ctx.Err() != nil {
			return nil, envelope.Errorf(envelope.CodeCancelled, "request %s cancelled", requestID)
		}
		var e *envelope.Error
		if errors.As(err, &e) {
			return nil, e
		}
		return nil, envelope.Errorf(envelope.CodeRPCError, "%v", err)
	}
	return &SendResult{Content: text, RequestID: requestID}, nil
}

// record appends m to the history and the session file.
func (a *Agent) record(m Message) error {
	if m.Timestamp == 0 {
		m.Timestamp = nowMs()
	}
	if err := a.file.append(entry{Type: entryMessage, Message: &m}); err != nil {
		return envelope.WrapError(envelope.CodeInternal, "cannot write the session file", err)
	}
	a.mu.Lock()
	a.history = append(a.history, m)
	a.mu.Unlock()
	return nil
}

func (a *Agent) publish(streamID string, ev Event) {
	a.events.publish(StreamPayload{StreamID: streamID, AgentID: a.id, Event: ev}, a.turnReq)
}

// request builds the provider's request from the context.
func (a *Agent) request() *Request {
	a.mu.Lock()
	defer a.mu.Unlock()
	req := &Request{System: a.systemPrompt, Tools: a.rt.tools.Specs()}
	if a.summary != "" {
		req.Messages = append(req.Messages, Message{Role: RoleUser, Content: Content{Text("[Summary of the earlier conversation]\n" + a.summary)}})
	}
	req.Messages = append(req.Messages, a.history[a.firstKept:]...)
	return req
}

// runTurn runs one turn (the turn token held), instrumented by g: ctx
// carries the turn's span.
func (a *Agent) runTurn(ctx context.Context, g *telemetry.GenAI, turn *telemetry.AgentTurn, content string) (string, error) {
	if err := a.record(Message{Role: RoleUser, Content: Content{Text(content)}}); err != nil {
		return "", err
	}
	provider, model := a.rt.provider.Name(), requestModel(a.rt.provider)
	for round := 1; ; round++ {
		if err := a.compact(ctx, g); err != nil {
			return "", err
		}
		streamID := envelope.NewID()
		a.publish(streamID, Event{Type: EventMessageStart, Message: &StreamMessage{Role: RoleAssistant, Content: Content{}}})
		var last Content
		req := a.request()
		mctx, mc := g.StartChat(ctx, provider, model)
		msg, err := a.rt.provider.Stream(mctx, req, func(c Content) {
			last = cloneContent(c)
			a.publish(streamID, Event{Type: EventMessageUpdate, Message: &StreamMessage{Role: RoleAssistant, Content: last}})
		})
		if err != nil {
			if ctx.Err() != nil {
				mc.End(telemetry.ModelResult{}, ctx.Err())
			} else {
				mc.End(telemetry.ModelResult{}, providerError(err))
			}
		} else {
			r := telemetry.ModelResult{ResponseModel: msg.Model, FinishReason: msg.StopReason}
			if msg.Usage != nil {
				r.Usage, r.InputTokens, r.OutputTokens = true, msg.Usage.Input, msg.Usage.Output
			}
			mc.End(r, nil)
			turn.Add(&r)
		}
		if err != nil {
			stop, errText := StopError, err.Error()
			if ctx.Err() != nil {
				stop, errText = StopAborted, "cancelled"
			}
			a.publish(streamID, Event{Type: EventMessageEnd, Message: &StreamMessage{Role: RoleAssistant, Content: cloneContent(last), StopReason: stop}})
			if rerr := a.record(Message{Role: RoleAssistant, Content: last, Provider: a.rt.provider.Name(), StopReason: stop, ErrorMessage: errText}); rerr != nil {
				return "", rerr
			}
			if ctx.Err() != nil {
				return "", ctx.Err()
			}
			return "", providerError(err)
		}
		msg.Role = RoleAssistant
		if msg.Provider == "" {
			msg.Provider = a.rt.provider.Name()
		}
		a.publish(streamID, Event{Type: EventMessageEnd, Message: &StreamMessage{Role: RoleAssistant, Content: cloneContent(msg.Content), StopReason: msg.StopReason}})
		if err := a.record(*msg); err != nil {
			return "", err
		}
		calls := ToolCalls(msg.Content)
		if len(calls) == 0 || round >= a.rt.cfg.MaxToolRounds {
			return TextOf(msg.Content), nil
		}
		asked := mc.SpanContext()
		for _, call := range calls {
			a.publish(streamID, Event{Type: EventToolExecutionStart, ToolCallID: call.ID, ToolName: call.Name, Args: call.Arguments})
			tctx, tr := g.StartTool(ctx, call.Name, call.ID, asked)
			result, errType := a.runTool(tctx, call)
			tr.End(errType, result)
			isErr := errType != ""
			a.publish(streamID, Event{Type: EventToolExecutionEnd, ToolCallID: call.ID, Result: strPtr(result), IsError: boolPtr(isErr)})
			if err := a.record(Message{Role: RoleToolResult, ToolCallID: call.ID, ToolName: call.Name, Content: Content{Text(result)}, IsError: boolPtr(isErr)}); err != nil {
				return "", err
			}
			if ctx.Err() != nil {
				return "", ctx.Err()
			}
		}
	}
}

// providerError keeps a provider's coded error, else makes it RPC_ERROR.
func providerError(err error) error {
	var e *envelope.Error
	if errors.As(err, &e) {
		return e
	}
	return envelope.Errorf(envelope.CodeRPCError, "provider: %v", err)
}

// runTool runs one tool call; a panic or error is a result with isError,
// errType saying which (the error.type of its span): unknown_tool,
// panic, cancelled, the mesh code of a coded error in snake case
// (mesh_call's: method_not_found, timeout, ...), else tool_error. It is
// "" on success.
func (a *Agent) runTool(ctx context.Context, call ContentBlock) (result, errType string) {
	t, ok := a.rt.tools.Get(call.Name)
	if !ok {
		return fmt.Sprintf("unknown tool %q", call.Name), "unknown_tool"
	}
	defer func() {
		if p := recover(); p != nil {
			result, errType = fmt.Sprintf("tool %s panicked: %v", call.Name, p), "panic"
		}
	}()
	out, err := t.Run(ctx, ToolCall{AgentID: a.id, ID: call.ID}, call.Arguments)
	if err != nil {
		if ctx.Err() != nil {
			return "cancelled", "cancelled"
		}
		var e *envelope.Error
		if errors.As(err, &e) {
			return err.Error(), telemetry.ErrorType(e)
		}
		return err.Error(), "tool_error"
	}
	return out, ""
}
