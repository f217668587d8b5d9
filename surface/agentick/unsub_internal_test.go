package agentick

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/surface"
)

// TestAgentickUnsubscribeStopsDelivery: once unsubscribe returns, the
// subscription delivers nothing: not the rest of a page of chat events
// its follower already holds, not a gateway event offered later, not the
// gateway events that were waiting for their barrier; the follower is
// told to stop and the session no longer lists it. (Over a socket that
// window is too short to hit reliably; TestAgentickUnsubscribe checks
// the behaviour end to end.)
func TestAgentickUnsubscribeStopsDelivery(t *testing.T) {
	gw := &gateway{clients: map[string]*agClient{}, sessions: map[string]*agSession{}, activity: map[string]time.Time{}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	var got []string
	c := &agClient{gw: gw, id: "c", ctx: ctx, cancel: cancel, subs: map[string]*agSub{}, channels: map[string]struct{}{},
		push: func(b []byte) bool {
			var v struct{ Event string }
			_ = json.Unmarshal(b, &v)
			mu.Lock()
			got = append(got, v.Event)
			mu.Unlock()
			return true
		}}
	sctx, scancel := context.WithCancel(ctx)
	s := &agSub{c: c, session: "s", cancel: scancel, text: map[string]string{}}
	c.subs["s"] = s
	gw.session("s").subs[s] = struct{}{}
	chatEv := func(seq uint64) surface.ChatEvent {
		return surface.ChatEvent{Seq: seq, StreamID: "x", AgentID: "s", Event: json.RawMessage(`{"type":"message_start"}`)}
	}
	delivered := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}

	if !s.onChat(chatEv(1)) || len(delivered()) != 1 {
		t.Fatalf("before unsubscribe: onChat delivered %v", delivered())
	}
	s.offer(agentickEventFrame("result", "s", nil), 5) // waits for seq 5
	gw.unsubscribe(c, "s")
	if sctx.Err() == nil {
		t.Error("the follower's context is not cancelled")
	}
	if s.onChat(chatEv(2)) {
		t.Error("onChat after unsubscribe asks the follower for more")
	}
	s.offer(agentickEventFrame("execution_end", "s", nil), 0)
	s.onChat(chatEv(6)) // would pass the pending result's barrier
	s.end()             // the follower's exit flushes what is pending
	if d := delivered(); len(d) != 1 || d[0] != "message_start" {
		t.Errorf("delivered %v; want only the message_start before unsubscribe", d)
	}
	gw.mu.Lock()
	left := gw.sessions["s"]
	gw.mu.Unlock()
	if left != nil {
		t.Errorf("the session still lists %d subscribers after unsubscribe", len(left.subs))
	}
	c.mu.Lock()
	if c.subs["s"] != nil {
		t.Error("the client still has the subscription")
	}
	c.mu.Unlock()
}
