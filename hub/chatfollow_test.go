package hub_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/surface"
)

// TestFollowChat follows a chat agent's events through the hub while a
// turn runs: they arrive in order, from message_start to message_end,
// with the streamId of the turn, and nothing from before the tail.
func TestFollowChat(t *testing.T) {
	var hb *hub.Hub
	m := testkit.StartNexus3(t, &hb)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var created struct {
		AgentID string `json:"agent_id"`
	}
	if err := m.Client(t).Call(ctx, "chat.create", map[string]any{"agent_id": "f1"}, &created); err != nil {
		t.Fatal(err)
	}
	send := func(text string) {
		t.Helper()
		if err := m.Client(t).Call(ctx, "chat.send", map[string]any{"agentId": "f1", "content": text}, nil); err != nil {
			t.Fatal(err)
		}
	}
	send("first turn") // its events are before the tail
	tail, err := surface.ChatTail(ctx, hb, "f1")
	if err != nil || tail == 0 {
		t.Fatalf("ChatTail = %d, %v; want the seq of the first turn's last event", tail, err)
	}
	type got struct {
		seq    uint64
		stream string
		typ    string
	}
	events := make(chan got, 256)
	done := make(chan error, 1)
	fctx, stop := context.WithCancel(ctx)
	go func() {
		_, err := surface.FollowChat(fctx, hb, "f1", tail, func(e surface.ChatEvent) bool {
			var ev struct {
				Type string `json:"type"`
			}
			_ = json.Unmarshal(e.Event, &ev)
			events <- got{e.Seq, e.StreamID, ev.Type}
			return ev.Type != "message_end"
		})
		done <- err
	}()
	send("second turn")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	stop()
	close(events)
	var seq []got
	for e := range events {
		seq = append(seq, e)
	}
	if len(seq) < 2 || seq[0].typ != "message_start" || seq[len(seq)-1].typ != "message_end" {
		t.Fatalf("events = %+v; want message_start … message_end", seq)
	}
	for i, e := range seq {
		if e.seq != tail+uint64(i)+1 || e.stream != seq[0].stream || e.stream == "" {
			t.Fatalf("event %d = %+v; want seq %d, one streamId", i, e, tail+uint64(i)+1)
		}
	}
	// A follower of an unknown agent gets the coded error.
	if _, err := surface.FollowChat(ctx, hb, "nope", 0, func(surface.ChatEvent) bool { return true }); err == nil {
		t.Fatal("FollowChat of an unknown agent: no error")
	}
}
