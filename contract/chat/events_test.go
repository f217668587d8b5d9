package chat_test

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/agentmesh/agentmesh/contract/chat"
)

func ptr[T any](v T) *T { return &v }

// TestRawEventReadsSeqEvent: what the chat agent answers (EventsPage of
// SeqEvents) reads as the relays read it (RawEventsPage of RawEvents),
// every field in place and the raw event decoding to the event sent; a
// page a relay passes on reads back as the agent's. The two views of one
// page are declared side by side; this keeps their tags in step.
func TestRawEventReadsSeqEvent(t *testing.T) {
	sent := chat.EventsPage{NextSeq: 9, Dropped: 2, Closed: true, Events: []chat.SeqEvent{
		{Seq: 7, RequestID: "r1", StreamPayload: chat.StreamPayload{StreamID: "s1", AgentID: "a1", Event: chat.Event{
			Type: chat.EventMessageEnd, Message: &chat.StreamMessage{Role: chat.RoleAssistant, StopReason: chat.StopEndTurn,
				Content: chat.Content{chat.Text("hi"), {Type: chat.BlockToolCall, ID: "t1", Name: "mesh_call", Arguments: json.RawMessage(`{"x":1}`)}}}}}},
		{Seq: 9, StreamPayload: chat.StreamPayload{StreamID: "compaction:a1", AgentID: "a1", Event: chat.Event{
			Type: chat.EventCompactionEnd, Removed: ptr(0), Kept: ptr(4), Reason: "summary"}}},
		{Seq: 8, RequestID: "r1", StreamPayload: chat.StreamPayload{StreamID: "s1", AgentID: "a1", Event: chat.Event{
			Type: chat.EventToolExecutionEnd, ToolCallID: "t1", Result: ptr("ok"), IsError: ptr(false)}}},
	}}
	b, err := json.Marshal(sent)
	if err != nil {
		t.Fatal(err)
	}
	var raw chat.RawEventsPage
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	if raw.NextSeq != sent.NextSeq || raw.Dropped != sent.Dropped || raw.Closed != sent.Closed || len(raw.Events) != len(sent.Events) {
		t.Fatalf("raw page %+v; want the page sent %s", raw, b)
	}
	for i, r := range raw.Events {
		s := sent.Events[i]
		if r.Seq != s.Seq || r.StreamID != s.StreamID || r.AgentID != s.AgentID || r.RequestID != s.RequestID {
			t.Errorf("event %d read raw as %+v; want seq, streamId, agentId, request_id of %+v", i, r, s)
		}
		var ev chat.Event
		if err := json.Unmarshal(r.Event, &ev); err != nil || !reflect.DeepEqual(ev, s.Event) {
			t.Errorf("event %d: raw %s decodes to %+v (%v); want %+v", i, r.Event, ev, err, s.Event)
		}
	}
	b2, err := json.Marshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	var back chat.EventsPage
	if err := json.Unmarshal(b2, &back); err != nil || !reflect.DeepEqual(back, sent) {
		t.Errorf("the relayed page %s reads back as %+v (%v); want %+v", b2, back, err, sent)
	}
}
