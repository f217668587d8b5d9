package agentick

import (
	"context"
	"encoding/json"
	"strings"
	"sync"

	"github.com/agentmesh/agentmesh/contract/chat"
	"github.com/agentmesh/agentmesh/surface"
)

// ---- subscriptions ----

// agSub follows one session's chat events for one client and merges the
// gateway's own events for that session into them: a gateway event waits
// until the chat events before it (seq ≤ its barrier) are delivered.
type agSub struct {
	c       *agClient
	session string
	cancel  context.CancelFunc

	mu      sync.Mutex
	last    uint64 // seq of the last chat event delivered
	ended   bool
	stopped bool // unsubscribed: deliver nothing more
	pending []agPending
	text    map[string]string // streamId → text delivered so far
}

type agPending struct {
	barrier uint64
	frame   []byte
}

// offer delivers a gateway event once the chat events up to barrier are.
func (s *agSub) offer(frame []byte, barrier uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended || barrier <= s.last {
		s.deliver(frame)
		return
	}
	s.pending = append(s.pending, agPending{barrier, frame})
}

// deliver pushes frame to the client (s.mu held).
func (s *agSub) deliver(frame []byte) {
	if s.stopped {
		return
	}
	if frame != nil && !s.c.push(frame) {
		go s.c.kill() // too slow: its queue is full
	}
}

// flush delivers the pending events whose barrier is passed (s.mu held).
func (s *agSub) flush() {
	keep := s.pending[:0]
	for _, p := range s.pending {
		if s.ended || p.barrier <= s.last {
			s.deliver(p.frame)
		} else {
			keep = append(keep, p)
		}
	}
	s.pending = keep
}

func (s *agSub) end() {
	s.mu.Lock()
	s.ended = true
	s.flush()
	s.mu.Unlock()
}

// onChat translates one chat event into agentick events.
func (s *agSub) onChat(e surface.ChatEvent) bool {
	var ev chat.Event
	_ = json.Unmarshal(e.Event, &ev)
	var frames [][]byte
	add := func(event string, data any) {
		frames = append(frames, agentickEventFrame(event, s.session, data))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch ev.Type {
	case chat.EventMessageStart:
		s.text[e.StreamID] = ""
		add("message_start", map[string]any{"streamId": e.StreamID, "role": "assistant"})
	case chat.EventMessageUpdate:
		if ev.Message != nil {
			t := chat.TextOf(ev.Message.Content)
			prev := s.text[e.StreamID]
			if d, ok := strings.CutPrefix(t, prev); ok && d != "" {
				add("content_delta", map[string]any{"streamId": e.StreamID, "blockType": "text", "delta": d})
			} else if !ok {
				add("content_delta", map[string]any{"streamId": e.StreamID, "blockType": "text", "delta": t, "replace": true})
			}
			s.text[e.StreamID] = t
		}
	case chat.EventMessageEnd:
		delete(s.text, e.StreamID)
		msg := map[string]any{"role": "assistant"}
		stop := ""
		if ev.Message != nil {
			msg["content"] = ev.Message.Content
			stop = ev.Message.StopReason
			msg["stopReason"] = stop
		}
		add("message", map[string]any{"streamId": e.StreamID, "message": msg})
		add("tick_end", map[string]any{"streamId": e.StreamID, "stopReason": stop})
	case chat.EventToolExecutionStart:
		add("tool_call_start", map[string]any{"streamId": e.StreamID, "callId": ev.ToolCallID, "name": ev.ToolName, "input": ev.Args})
	case chat.EventToolExecutionEnd:
		d := map[string]any{"streamId": e.StreamID, "callId": ev.ToolCallID, "isError": ev.IsError != nil && *ev.IsError}
		if ev.Result != nil {
			d["result"] = *ev.Result
		}
		add("tool_result", d)
	case chat.EventCompactionStart:
		add("compaction_start", map[string]any{})
	case chat.EventCompactionEnd:
		add("compaction_end", map[string]any{"removed": ev.Removed, "kept": ev.Kept, "reason": ev.Reason})
	}
	for _, f := range frames {
		s.deliver(f)
	}
	if e.Seq > s.last {
		s.last = e.Seq
	}
	s.flush()
	return s.c.ctx.Err() == nil && !s.stopped
}

// subscribe starts following session for c (a no-op when it does already).
func (gw *gateway) subscribe(c *agClient, session string) *agError {
	c.mu.Lock()
	_, ok := c.subs[session]
	c.mu.Unlock()
	if ok {
		return nil
	}
	tail, err := surface.ChatTail(c.ctx, gw.h, session)
	if err != nil {
		return agentickFromMesh(err, false)
	}
	ctx, cancel := context.WithCancel(c.ctx)
	s := &agSub{c: c, session: session, cancel: cancel, last: tail, text: map[string]string{}}
	c.mu.Lock()
	if c.ctx.Err() != nil || c.subs[session] != nil {
		c.mu.Unlock()
		cancel()
		return nil
	}
	c.subs[session] = s
	c.wg.Add(1)
	c.mu.Unlock()
	gw.mu.Lock()
	gw.session(session).subs[s] = struct{}{}
	gw.mu.Unlock()
	go func() {
		defer c.wg.Done()
		_, _ = surface.FollowChat(ctx, gw.h, session, tail, s.onChat)
		s.end()
		cancel()
		gw.mu.Lock()
		if ss := gw.sessions[session]; ss != nil {
			delete(ss.subs, s)
			gw.tidy(session)
		}
		gw.mu.Unlock()
		c.mu.Lock()
		if c.subs[session] == s {
			delete(c.subs, session)
		}
		c.mu.Unlock()
	}()
	return nil
}

// unsubscribe stops following session for c. Nothing of the session is
// delivered after it returns: the follower may still hold a page of
// events, and the gateway's events may be waiting for their barrier, so
// the subscription is stopped under its lock (what it delivered before
// is queued ahead of unsubscribe's answer) and leaves the session's
// subscribers at once.
func (gw *gateway) unsubscribe(c *agClient, session string) {
	c.mu.Lock()
	s := c.subs[session]
	delete(c.subs, session)
	c.mu.Unlock()
	if s == nil {
		return
	}
	s.mu.Lock()
	s.stopped = true
	s.pending = nil
	s.mu.Unlock()
	s.cancel()
	gw.mu.Lock()
	if ss := gw.sessions[session]; ss != nil {
		delete(ss.subs, s)
		gw.tidy(session)
	}
	gw.mu.Unlock()
}

// emit sends a gateway event of session to its subscribers here, after
// the chat events up to barrier.
func (gw *gateway) emit(session, event string, data any, barrier uint64) {
	frame := agentickEventFrame(event, session, data)
	gw.mu.Lock()
	var subs []*agSub
	if s := gw.sessions[session]; s != nil {
		for sub := range s.subs {
			subs = append(subs, sub)
		}
	}
	gw.mu.Unlock()
	for _, s := range subs {
		s.offer(frame, barrier)
	}
}
