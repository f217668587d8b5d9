package multica_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/agents/chat"
	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/telemetry"
	"github.com/gorilla/websocket"
)

// normalize applies the streaming seed's rule for historical messages:
// content as a plain string is [{type: text, text}].
func normalize(msgs []any) []any {
	for _, m := range msgs {
		m := m.(map[string]any)
		if s, ok := m["content"].(string); ok {
			m["content"] = []any{map[string]any{"type": "text", "text": s}}
		}
	}
	return msgs
}

// TestMulticaSeedRPC replays the hub RPC seed's getAgentMessages example
// and its error example literally over a real WebSocket and compares the
// responses with the payloads the seed shows (ids, timestamps and the
// provider's own figures aside).
func TestMulticaSeedRPC(t *testing.T) {
	var hb *hub.Hub
	// The provider scripted with the seed's answer and model; what it
	// cannot script is its own name ("scripted") and figures.
	sp := &testkit.EssayProvider{}
	sp.Model = "claude-sonnet-4-20250514"
	sp.Reply = func(req *chat.Request) (string, bool) {
		if n := len(req.Messages); n > 0 && chat.TextOf(req.Messages[n-1].Content) == "Hello" {
			return "Hi! How can I help?", true
		}
		return "", false
	}
	m := testkit.StartNexus3With(t, sp, &hb)
	const agent = "019abc12-3def-7000-8000-000000000001"
	c := m.Client(t)
	if err := c.Call(t.Context(), "chat.create", map[string]any{"agent_id": agent}, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Call(t.Context(), "chat.send", map[string]any{"agentId": agent, "content": "Hello"}, nil); err != nil {
		t.Fatal(err)
	}
	d := testkit.ConnectDevice(t, m, "my-client")

	// The seed's example request, as the SDK sends it.
	d.Write(`{"id":"019abc12-0000-7000-8000-0000000000aa","uid":null,"from":"my-client","to":"` + d.Hub + `","action":"request",
		"payload":{"requestId":"019abc12-0000-7000-8000-0000000000a1","method":"getAgentMessages","params":{"agentId":"019abc12-3def-7000-8000-000000000001","offset":0,"limit":10}}}`)
	r := d.Next("response")
	if id, _ := r["id"].(string); len(id) != 36 || r["uid"] != nil || r["from"] != d.Hub || r["to"] != "my-client" || len(r) != 6 {
		t.Errorf("response envelope %v: want {id (UUIDv7), uid null, from hub, to my-client, action, payload}", r)
	}
	got := r["payload"].(map[string]any)
	var want map[string]any
	_ = json.Unmarshal([]byte(`{
    "requestId": "019abc12-0000-7000-8000-0000000000a1",
    "ok": true,
    "payload": {
      "messages": [
        { "role": "user", "content": "Hello", "timestamp": 1700000000000 },
        {
          "role": "assistant",
          "content": [{ "type": "text", "text": "Hi! How can I help?" }],
          "model": "claude-sonnet-4-20250514",
          "provider": "anthropic",
          "usage": { "input": 10, "output": 15, "totalTokens": 25 },
          "stopReason": "end_turn",
          "timestamp": 1700000001000
        }
      ],
      "total": 42,
      "offset": 0,
      "limit": 10
    }
  }`), &want)
	gp, wp := got["payload"].(map[string]any), want["payload"].(map[string]any)
	gm, wm := normalize(gp["messages"].([]any)), normalize(wp["messages"].([]any))
	// What the seed's example cannot know: the total of its session (42
	// there, the 2 messages of this one here), the provider's name and
	// figures, the timestamps.
	wp["total"] = 2.0
	for i := range gm {
		g, w := gm[i].(map[string]any), wm[i].(map[string]any)
		if ts, ok := g["timestamp"].(float64); !ok || time.Since(time.UnixMilli(int64(ts))) > time.Minute {
			t.Errorf("message %d: timestamp %v is not a recent Unix ms time", i, g["timestamp"])
		}
		g["timestamp"] = w["timestamp"]
		if u, ok := g["usage"].(map[string]any); ok && len(u) == 3 && u["totalTokens"] == u["input"].(float64)+u["output"].(float64) {
			g["usage"] = w["usage"]
		}
		if g["provider"] == "scripted" {
			g["provider"] = w["provider"]
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("getAgentMessages:\n got %s\nwant %s", testkit.MustJSON(t, got), testkit.MustJSON(t, want))
	}

	// The seed's example error.
	want = nil
	d.Write(`{"id":"019abc12-0000-7000-8000-0000000000ab","uid":null,"from":"my-client","to":"` + d.Hub + `","action":"request",
		"payload":{"requestId":"019abc12-0000-7000-8000-0000000000a2","method":"getAgentMessages","params":{"agentId":"019abc12-bad-id","offset":0,"limit":10}}}`)
	got = d.Next("response")["payload"].(map[string]any)
	_ = json.Unmarshal([]byte(`{
  "requestId": "019abc12-0000-7000-8000-0000000000a2",
  "ok": false,
  "error": {
    "code": "AGENT_NOT_FOUND",
    "message": "No session found for agent: 019abc12-bad-id"
  }
}`), &want)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("getAgentMessages of an unknown agent:\n got %s\nwant %s", testkit.MustJSON(t, got), testkit.MustJSON(t, want))
	}

	// The offset and limit defaults (0 and 50), and a closed agent's
	// history read from its session file.
	if err := c.Call(t.Context(), "chat.destroy", map[string]any{"agent_id": agent}, nil); err != nil {
		t.Fatal(err)
	}
	p := d.Request("r3", "getAgentMessages", map[string]any{"agentId": agent})
	if pl, _ := p["payload"].(map[string]any); p["ok"] != true || pl["total"] != 2.0 || pl["offset"] != 0.0 || pl["limit"] != 50.0 || len(pl["messages"].([]any)) != 2 {
		t.Errorf("getAgentMessages of a closed agent, no offset or limit: %v", p)
	}
}

// TestMulticaErrorCodes: each of the seed's error codes, and the mesh code
// riding along under RPC_ERROR; messages the hub cannot take get an
// "error" answer and leave the connection usable.
func TestMulticaErrorCodes(t *testing.T) {
	var hb *hub.Hub
	m := testkit.StartNexus3(t, &hb)
	boom := agents.New("boom")
	boom.Handle("boom.fail", func(context.Context, json.RawMessage) (any, error) { return nil, errors.New("kaput") })
	m.RunAgent(t, boom)
	d := testkit.ConnectDevice(t, m, "dev-1")
	for _, tc := range []struct {
		name, method   string
		params         any
		code, meshCode string
	}{
		{"unknown method", "noSuchMethod", nil, "METHOD_NOT_FOUND", ""},
		{"missing agentId", "getAgentMessages", map[string]any{"offset": 0}, "INVALID_PARAMS", ""},
		{"negative offset", "getAgentMessages", map[string]any{"agentId": "x", "offset": -1}, "INVALID_PARAMS", ""},
		{"params not an object", "getAgentMessages", "abc", "INVALID_PARAMS", ""},
		{"unknown agent", "getAgentMessages", map[string]any{"agentId": "nope"}, "AGENT_NOT_FOUND", ""},
		{"handler failed", "boom.fail", nil, "RPC_ERROR", ""},
		{"admin built-in on an open hub", "mesh.agents", nil, "", ""},
	} {
		p := d.Request("req-"+tc.name, tc.method, tc.params)
		code, mc := testkit.MulticaErrorCode(t, p)
		t.Logf("%s: %s", tc.name, testkit.MustJSON(t, p))
		if code != tc.code || mc != tc.meshCode {
			t.Errorf("%s: code %q meshCode %q (%v); want %q %q", tc.name, code, mc, p, tc.code, tc.meshCode)
		}
	}
	// Answered with an "error": not JSON, a field of the wrong type, an
	// action the hub does not take, a forged sender.
	for _, tc := range []struct{ name, msg, code string }{
		{"not JSON", `{"id":`, "INVALID_PARAMS"},
		{"invalid UTF-8", "{\"id\":\"m0\",\"to\":\"dev-1\",\"action\":\"chat\",\"payload\":\"\xff\xfe\"}", "INVALID_PARAMS"},
		{"to not a string", `{"id":"m1","from":"dev-1","to":5,"action":"request","payload":{}}`, "INVALID_PARAMS"},
		{"no requestId", `{"id":"m2","from":"dev-1","to":"` + d.Hub + `","action":"request","payload":{"method":"getAgentMessages"}}`, "INVALID_PARAMS"},
		{"unknown action", `{"id":"m3","from":"dev-1","to":"` + d.Hub + `","action":"dance","payload":{}}`, "METHOD_NOT_FOUND"},
		{"forged from", `{"id":"m4","from":"someone-else","to":"` + d.Hub + `","action":"request","payload":{"requestId":"x","method":"mesh.agents"}}`, "INVALID_PARAMS"},
		{"too deep", `{"id":"m5","to":"x","action":"a","payload":` + strings.Repeat("[", 100) + strings.Repeat("]", 100) + `}`, "INVALID_PARAMS"},
	} {
		d.Write(tc.msg)
		e := d.Next("error")
		p := e["payload"].(map[string]any)
		t.Logf("%s: %s", tc.name, testkit.MustJSON(t, p))
		if p["code"] != tc.code || p["message"] == "" {
			t.Errorf("%s: error %v; want code %s", tc.name, p, tc.code)
		}
	}
	// A request to a device not connected: answered at once, RPC_ERROR
	// with the mesh's UNAVAILABLE.
	d.Write(`{"id":"m6","uid":"u-7","from":"dev-1","to":"nobody","action":"request","payload":{"requestId":"r6","method":"x"}}`)
	r := d.Next("response")
	if code, mc := testkit.MulticaErrorCode(t, r["payload"].(map[string]any)); code != "RPC_ERROR" || mc != "UNAVAILABLE" || r["uid"] != "u-7" {
		t.Errorf("request to an unknown device: %v; want RPC_ERROR, meshCode UNAVAILABLE, uid echoed", r)
	}
	// The connection still works.
	if p := d.Request("last", "getAgentMessages", map[string]any{"agentId": "nope"}); p["ok"] != false {
		t.Errorf("after the errors: %v", p)
	}
}

// TestMulticaRouting: device-to-device messages are delivered with their
// fields; a device that stops reading is disconnected once its queue is
// full, its sender is told, and nobody else waits on it meanwhile.
func TestMulticaRouting(t *testing.T) {
	m := meshtest.Start(t, hub.Config{Conn: link.Config{QueueSize: 8}})
	m.RunAgent(t, agents.NewEcho())
	a, b := testkit.ConnectDevice(t, m, "dev-a"), testkit.ConnectDevice(t, m, "dev-b")
	a.Write(`{"id":"msg-1","uid":"user-9","from":"dev-a","to":"dev-b","action":"chat","payload":{"text":"hi b","n":[1,2,3]}}`)
	got := b.Next("chat")
	want := map[string]any{"id": "msg-1", "uid": "user-9", "from": "dev-a", "to": "dev-b", "action": "chat", "payload": map[string]any{"text": "hi b", "n": []any{1.0, 2.0, 3.0}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("b got %v; want %v", got, want)
	}
	// from left out is filled in; a device's request to another device
	// is routed like any message, and so is its response.
	b.Write(`{"id":"msg-2","uid":null,"to":"dev-a","action":"request","payload":{"requestId":"q1","method":"ping"}}`)
	if got := a.Next("request"); got["from"] != "dev-b" || got["uid"] != nil || got["payload"].(map[string]any)["method"] != "ping" {
		t.Errorf("a got %v", got)
	}
	a.Write(`{"id":"msg-3","uid":null,"from":"dev-a","to":"dev-b","action":"response","payload":{"requestId":"q1","ok":true,"payload":"pong"}}`)
	if got := b.Next("response"); got["payload"].(map[string]any)["payload"] != "pong" {
		t.Errorf("b got %v", got)
	}
	// Unknown destination.
	a.Write(`{"id":"msg-4","uid":null,"from":"dev-a","to":"dev-zz","action":"chat","payload":1}`)
	if e := a.Next("error"); e["payload"].(map[string]any)["messageId"] != "msg-4" || e["payload"].(map[string]any)["meshCode"] != "UNAVAILABLE" {
		t.Errorf("to an unknown device: %v", e)
	}

	// dev-c never reads. dev-a floods it until the hub holds data for it
	// that it cannot deliver (seen in the kernel's queues, not guessed
	// from timing); the flood then pauses, and dev-c stays stuck for a
	// stall the test chooses while dev-b calls the hub. Then the flood
	// resumes until the hub cuts dev-c off.
	c := testkit.ConnectDevice(t, m, "dev-c")
	// held: the bytes for dev-c in the kernel, the hub's send queue and
	// dev-c's receive queue together (the kernel moves bytes between the
	// two as dev-c's window opens and shuts; what it holds in all is
	// what was not read and not sent since).
	held := func() (hubTx, cRx int) {
		t.Helper()
		hubTx, _, err := testkit.TCPQueues(m.Addr, c.WS.LocalAddr().String())
		if err != nil {
			t.Fatal(err)
		}
		_, cRx, err = testkit.TCPQueues(c.WS.LocalAddr().String(), m.Addr)
		if err != nil {
			t.Fatal(err)
		}
		return hubTx, cRx
	}
	aIn := make(chan string, 1024)
	go func() {
		defer close(aIn)
		for {
			_, msg, err := a.WS.ReadMessage()
			if err != nil {
				return
			}
			aIn <- string(msg)
		}
	}()
	big := strings.Repeat("x", 64<<10)
	sent := 0
	flood := func() {
		a.Write(`{"id":"f` + fmt.Sprint(sent) + `","from":"dev-a","to":"dev-c","action":"blob","payload":"` + big + `"}`)
		sent++
	}
	// Stuck: dev-c's receive buffer holds bytes it does not read, the
	// hub's socket holds bytes it cannot send, and one more message
	// leaves what the kernel holds unchanged (the hub keeps it queued).
	floodStart := time.Now()
	for stuck := false; !stuck; {
		if time.Since(floodStart) > 20*time.Second {
			t.Fatalf("dev-c did not fill after %d messages of 64 KiB", sent)
		}
		tx, rx := held()
		before := tx + rx
		flood()
		stuck = true
		for wait := time.Now(); stuck && time.Since(wait) < 300*time.Millisecond; time.Sleep(5 * time.Millisecond) {
			tx, rx = held()
			stuck = tx+rx == before && tx > 0 && rx > 0
		}
		select {
		case msg := <-aIn:
			t.Fatalf("a refused before the stall the test sets up (after %d messages): %s", sent, msg)
		default:
		}
	}
	heldTx, heldRx := held()
	stopB := make(chan struct{})
	bDone := make(chan []time.Duration, 1)
	go func() {
		var rtts []time.Duration
		for i := 0; ; i++ {
			select {
			case <-stopB:
				bDone <- rtts
				return
			default:
			}
			start := time.Now()
			b.Write(testkit.MustJSON(t, map[string]any{"id": fmt.Sprint("b", i), "to": b.Hub, "action": "request",
				"payload": map[string]any{"requestId": fmt.Sprint("rb", i), "method": "echo.echo", "params": map[string]any{"i": i}}}))
			v, err := b.Read(5 * time.Second)
			if err != nil || v["action"] != "response" || v["payload"].(map[string]any)["ok"] != true {
				t.Errorf("b's call %d while c is stuck: %v, %v", i, v, err)
				bDone <- rtts
				return
			}
			rtts = append(rtts, time.Since(start))
		}
	}()
	// The stall: dev-c stays stuck for half a second, dev-b calling.
	stallStart := time.Now()
	time.Sleep(500 * time.Millisecond)
	// A stuck link still takes a ping from the hub when its socket has
	// room for one: 2 bytes (a server's frame header, no payload), at
	// most one in the stall at the default 5 s interval. Nothing else may
	// move.
	if tx, rx := held(); tx+rx != heldTx+heldRx && tx+rx != heldTx+heldRx+2 {
		t.Errorf("the bytes held for dev-c moved during the stall (hub %d -> %d, dev-c %d -> %d): it was not stuck", heldTx, tx, heldRx, rx)
	}
	// The flood resumes, one message at a time: each message after the
	// cut would be refused too, and dev-a's own queue (8 frames) is
	// not the subject here.
	refused, why := false, ""
	for !refused && time.Since(stallStart) < 20*time.Second {
		flood()
		select {
		case msg := <-aIn:
			refused = strings.Contains(msg, `"action":"error"`) && strings.Contains(msg, "dev-c")
			why = msg
		case <-time.After(50 * time.Millisecond):
		}
	}
	stall := time.Since(stallStart)
	close(stopB)
	rtts := <-bDone
	_ = a.WS.Close()
	for range aIn {
	}
	if !refused {
		t.Fatalf("dev-c never refused after %d messages of 64 KiB in %v", sent, time.Since(floodStart))
	}
	// dev-c, reading at last, gets whole messages, then the close: 1008
	// "send queue full", as the surface documents.
	var delivered int
	_ = c.WS.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		_, msg, err := c.WS.ReadMessage()
		if err != nil {
			var ce *websocket.CloseError
			if !errors.As(err, &ce) || ce.Code != websocket.ClosePolicyViolation || ce.Text != "send queue full" {
				t.Errorf("dev-c, after %d messages: %v; want close 1008 \"send queue full\"", delivered, err)
			}
			break
		}
		if !strings.Contains(string(msg), big) {
			t.Fatalf("dev-c got a message cut short (%d bytes)", len(msg))
		}
		delivered++
	}
	a2 := testkit.ConnectDevice(t, m, "dev-a2")
	a2.Write(`{"id":"z","from":"dev-a2","to":"dev-c","action":"chat","payload":1}`)
	if e := a2.Next("error"); e["payload"].(map[string]any)["meshCode"] != "UNAVAILABLE" {
		t.Errorf("after the flood, to dev-c: %v; want it disconnected", e)
	}
	p99 := testkit.Pctl(rtts, 99)
	testkit.PrintSummary(t, map[string]any{"test": "TestMulticaRouting", "flood_messages": sent, "held_for_dev_c_bytes": heldTx + heldRx,
		"stall_ms": testkit.Ms(stall), "refusal": why, "other_device_calls": len(rtts), "other_p50_ms": testkit.Ms(testkit.Pctl(rtts, 50)),
		"other_p99_ms": testkit.Ms(p99), "other_max_ms": testkit.Ms(testkit.Pctl(rtts, 100))})
	if !strings.Contains(why, "does not read its messages") {
		t.Errorf("a's refusal %s; want the send-queue policy's (dev-c does not read)", why)
	}
	// Blocked behind dev-c, dev-b would have waited out the stall.
	if worst := testkit.Pctl(rtts, 100); worst > stall/2 {
		t.Errorf("dev-b's slowest call took %v while dev-c was stuck for %v: blocked behind it", worst, stall)
	}
	if len(rtts) == 0 || p99 > time.Second {
		t.Errorf("dev-b's calls while dev-c was stuck: %d, p99 %v; want them served (p99 under 1 s)", len(rtts), p99)
	}
}

// streamEvents reads "stream" messages until a message_end whose
// stopReason is not tool_use (the turn's last message), checking the
// envelope of each; it returns their payloads.
func streamEvents(t *testing.T, d *testkit.Device, agent string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for {
		v := d.Next("stream")
		if v["from"] != d.Hub || v["to"] != d.ID || v["uid"] != nil {
			t.Fatalf("stream message %v: want from the hub to %s", v, d.ID)
		}
		p := v["payload"].(map[string]any)
		if len(p) != 3 || p["agentId"] != agent || p["streamId"] == "" {
			t.Fatalf("stream payload %v: want {streamId, agentId %s, event}", p, agent)
		}
		out = append(out, p)
		ev := p["event"].(map[string]any)
		if ev["type"] == "message_end" && len(chatToolCalls(ev)) == 0 {
			return out
		}
	}
}

func chatToolCalls(ev map[string]any) []any {
	var out []any
	for _, b := range ev["message"].(map[string]any)["content"].([]any) {
		if b.(map[string]any)["type"] == "toolCall" {
			out = append(out, b)
		}
	}
	return out
}

// TestMulticaStream: a message to an agent, and a chat.send request, push
// the agent's events to the device as the streaming seed shows them, in
// order from message_start to message_end, tool executions between; the
// request's response comes after the last event.
func TestMulticaStream(t *testing.T) {
	m := testkit.StartNexus3(t, nil)
	c := m.Client(t)
	if err := c.Call(t.Context(), "chat.create", map[string]any{"agent_id": "019def34-0000-7000-8000-000000000001"}, nil); err != nil {
		t.Fatal(err)
	}
	const agent = "019def34-0000-7000-8000-000000000001"
	d := testkit.ConnectDevice(t, m, "web-1")

	d.Write(`{"id":"s1","uid":null,"from":"web-1","to":"` + d.Hub + `","action":"message","payload":{"agentId":"` + agent + `","content":"/long 12"}}`)
	evs := streamEvents(t, d, agent)
	var types []string
	for _, p := range evs {
		types = append(types, p["event"].(map[string]any)["type"].(string))
		if p["streamId"] != evs[0]["streamId"] {
			t.Errorf("streamId %v in a turn of one message; want %v throughout", p["streamId"], evs[0]["streamId"])
		}
	}
	t.Logf("message: %d events %v", len(evs), types)
	if len(types) < 3 || types[0] != "message_start" || types[len(types)-1] != "message_end" {
		t.Fatalf("events %v; want message_start, message_update…, message_end", types)
	}
	for _, ty := range types[1 : len(types)-1] {
		if ty != "message_update" {
			t.Fatalf("events %v; want only message_update between start and end", types)
		}
	}
	// The seed's fields: message_start {role assistant, content []};
	// updates the accumulated content; message_end the final content
	// and stopReason.
	first := evs[0]["event"].(map[string]any)
	if want := map[string]any{"type": "message_start", "message": map[string]any{"role": "assistant", "content": []any{}}}; !reflect.DeepEqual(first, want) {
		t.Errorf("message_start = %v; want %v", first, want)
	}
	var words []string
	for i := 1; i <= 12; i++ {
		words = append(words, fmt.Sprint("word", i))
	}
	end := evs[len(evs)-1]["event"].(map[string]any)
	if want := map[string]any{"type": "message_end", "message": map[string]any{"role": "assistant", "stopReason": "end_turn",
		"content": []any{map[string]any{"type": "text", "text": strings.Join(words, " ")}}}}; !reflect.DeepEqual(end, want) {
		t.Errorf("message_end = %v; want %v", end, want)
	}
	prev := 0
	for _, p := range evs[1 : len(evs)-1] {
		txt := p["event"].(map[string]any)["message"].(map[string]any)["content"].([]any)[0].(map[string]any)["text"].(string)
		if len(txt) < prev || !strings.HasPrefix(strings.Join(words, " "), txt) {
			t.Errorf("message_update text %q: want a growing prefix of the answer", txt)
		}
		prev = len(txt)
	}

	// A request of chat.send with a tool call: the events, tool execution
	// included, then the response.
	d.Write(`{"id":"s2","uid":null,"from":"web-1","to":"` + d.Hub + `","action":"request","payload":{"requestId":"q2","method":"chat.send","params":{"agentId":"` + agent + `","content":"/tool Bash {\"command\":\"ls -la\"}"}}}`)
	evs = streamEvents(t, d, agent)
	types = types[:0]
	var toolStart, toolEnd map[string]any
	for _, p := range evs {
		ev := p["event"].(map[string]any)
		types = append(types, ev["type"].(string))
		switch ev["type"] {
		case "tool_execution_start":
			toolStart = ev
		case "tool_execution_end":
			toolEnd = ev
		}
	}
	t.Logf("chat.send with a tool: %d events %v", len(evs), types)
	if toolStart == nil || toolEnd == nil {
		t.Fatalf("events %v: no tool execution", types)
	}
	callID, _ := toolStart["toolCallId"].(string)
	if want := map[string]any{"type": "tool_execution_start", "toolCallId": callID, "toolName": "Bash", "args": map[string]any{"command": "ls -la"}}; callID == "" || !reflect.DeepEqual(toolStart, want) {
		t.Errorf("tool_execution_start = %v; want %v", toolStart, want)
	}
	if want := map[string]any{"type": "tool_execution_end", "toolCallId": callID, "result": `unknown tool "Bash"`, "isError": true}; !reflect.DeepEqual(toolEnd, want) {
		t.Errorf("tool_execution_end = %v; want %v", toolEnd, want)
	}
	if types[0] != "message_start" || types[len(types)-1] != "message_end" || slices.Index(types, "tool_execution_start") > slices.Index(types, "tool_execution_end") {
		t.Errorf("events %v: want message_start … tool_execution_start, tool_execution_end … message_end", types)
	}
	r := d.Next("response")
	if p := r["payload"].(map[string]any); p["ok"] != true || p["payload"].(map[string]any)["content"] != `Tool Bash returned: unknown tool "Bash"` {
		t.Errorf("chat.send response = %v", r)
	}
	// A message to an unknown agent: an error, no stream.
	d.Write(`{"id":"s3","uid":null,"from":"web-1","to":"` + d.Hub + `","action":"message","payload":{"agentId":"nope","content":"hi"}}`)
	if e := d.Next("error"); e["payload"].(map[string]any)["code"] != "AGENT_NOT_FOUND" || e["payload"].(map[string]any)["messageId"] != "s3" {
		t.Errorf("message to an unknown agent: %v", e)
	}
}

// TestMulticaStreamCompaction: compaction events reach the device as the
// streaming seed shows them: streamId "compaction:{agentId}", then
// compaction_end with removed, kept and reason, the token figures absent
// in count mode.
func TestMulticaStreamCompaction(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	rt := chat.NewRuntime(chat.Config{DataDir: t.TempDir(), MaxMessages: 4, KeepMessages: 2}, &chat.Scripted{}, nil)
	t.Cleanup(func() { rt.Close(context.Background()) })
	m.RunAgent(t, chat.NewService(rt))
	const agent = "019def34-0000-7000-8000-0000000000c1"
	if err := m.Client(t).Call(t.Context(), "chat.create", map[string]any{"agent_id": agent}, nil); err != nil {
		t.Fatal(err)
	}
	d := testkit.ConnectDevice(t, m, "compactor")
	var got []map[string]any
	for i := 0; i < 4 && len(got) == 0; i++ {
		d.Write(`{"id":"c` + fmt.Sprint(i) + `","uid":null,"from":"compactor","to":"` + d.Hub + `","action":"message","payload":{"agentId":"` + agent + `","content":"turn ` + fmt.Sprint(i) + `"}}`)
		for _, p := range streamEvents(t, d, agent) {
			if ev := p["event"].(map[string]any); strings.HasPrefix(ev["type"].(string), "compaction_") {
				got = append(got, p)
			}
		}
	}
	if len(got) != 2 {
		t.Fatalf("compaction events %v; want compaction_start and compaction_end", got)
	}
	t.Logf("compaction: %s", testkit.MustJSON(t, got))
	// The third turn's user message makes 5 > 4; the cut falls before a
	// user message, so only that one is kept.
	var want []map[string]any
	_ = json.Unmarshal([]byte(`[{"streamId":"compaction:`+agent+`","agentId":"`+agent+`","event":{"type":"compaction_start"}},
		{"streamId":"compaction:`+agent+`","agentId":"`+agent+`","event":{"type":"compaction_end","removed":4,"kept":1,"reason":"count"}}]`), &want)
	if !reflect.DeepEqual(got, want) {
		t.Errorf("compaction events\n got %s\nwant %s", testkit.MustJSON(t, got), testkit.MustJSON(t, want))
	}
}

// TestMulticaNoLeak: a device that disconnects in the middle of a turn
// leaves no goroutine behind: its follower and its call end, and the
// chat agent's turn is cancelled.
func TestMulticaNoLeak(t *testing.T) {
	m := testkit.StartNexus3(t, nil)
	c := m.Client(t)
	if err := c.Call(t.Context(), "chat.create", map[string]any{"agent_id": "essay"}, nil); err != nil {
		t.Fatal(err)
	}
	// Warm up: a first device's whole life, so that lazily started
	// goroutines (pools, the client's) are there before the baseline.
	w := testkit.ConnectDevice(t, m, "warm")
	w.Request("w1", "getAgentMessages", map[string]any{"agentId": "essay"})
	_ = w.WS.Close()
	time.Sleep(200 * time.Millisecond)
	base := runtime.NumGoroutine()
	for i := range 3 {
		d := testkit.ConnectDevice(t, m, fmt.Sprint("leaver-", i))
		d.Write(`{"id":"e","uid":null,"to":"` + d.Hub + `","action":"message","payload":{"agentId":"essay","content":"Write a long essay"}}`)
		if ev := d.Next("stream")["payload"].(map[string]any)["event"].(map[string]any); ev["type"] != "message_start" {
			t.Fatalf("first event %v", ev)
		}
		d.Next("stream") // "Once upon a time": the turn runs
		_ = d.WS.Close()
		// The agent's turn ends (cancelled) before the next device's: its
		// aborted message is in the history.
		meshtest.WaitFor(t, 10*time.Second, func() bool {
			var page struct {
				Messages []struct {
					StopReason string `json:"stopReason"`
				} `json:"messages"`
			}
			_ = c.Call(t.Context(), "chat.getAgentMessages", map[string]any{"agentId": "essay"}, &page)
			n := len(page.Messages)
			return n == 2*(i+1) && page.Messages[n-1].StopReason == "aborted"
		})
	}
	settled(t, base, "three devices left mid-turn")

	// A device whose message waits behind another caller's turn, which
	// publishes nothing meanwhile: its follower ends with its connection.
	if err := c.Call(t.Context(), "chat.create", map[string]any{"agent_id": "busy"}, nil); err != nil {
		t.Fatal(err)
	}
	// Its essay runs until cancelled (no timeout within the test).
	ectx, cancelEssay := context.WithTimeout(t.Context(), 60*time.Second)
	essay := make(chan error, 1)
	nc := m.Client(t, mesh.WithoutReliability())
	go func() {
		essay <- nc.Call(ectx, "chat.send", map[string]any{"agentId": "busy", "content": "Write a long essay"}, nil)
	}()
	meshtest.WaitFor(t, 10*time.Second, func() bool {
		var page struct{ Total int }
		_ = c.Call(t.Context(), "chat.getAgentMessages", map[string]any{"agentId": "busy"}, &page)
		return page.Total == 1 // the essay's turn runs
	})
	time.Sleep(200 * time.Millisecond)
	base = runtime.NumGoroutine()
	d := testkit.ConnectDevice(t, m, "queued")
	d.Write(`{"id":"q","uid":null,"to":"` + d.Hub + `","action":"message","payload":{"agentId":"busy","content":"hi"}}`)
	if v, err := d.Read(500 * time.Millisecond); err == nil || !testkit.IsTimeout(err) {
		t.Fatalf("queued message: got %v, %v; want nothing while the essay runs", v, err)
	}
	_ = d.WS.Close()
	settled(t, base, "a device left while its message waited")
	cancelEssay()
	if err := <-essay; envelope.CodeOf(err) != envelope.CodeCancelled {
		t.Errorf("the essay: %v; want CANCELLED", err)
	}
}

// settled waits up to 5 s for no goroutine of the Multica surface (a
// device's, a turn's follower) to be left and for the goroutines to be
// back to base.
func settled(t *testing.T, base int, what string) {
	t.Helper()
	var now, ours int
	var stacks string
	deadline := time.Now().Add(5 * time.Second)
	for {
		buf := make([]byte, 1<<20)
		stacks = string(buf[:runtime.Stack(buf, true)])
		ours = 0
		for g := range strings.SplitSeq(stacks, "\n\n") {
			if strings.Contains(g, "(*multicaDevice)") || strings.Contains(g, "FollowChat") {
				ours++
			}
		}
		now = runtime.NumGoroutine()
		if (ours == 0 && now <= base) || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("goroutines: %d before, %d after %s; %d of the Multica surface", base, now, what, ours)
	if ours > 0 || now > base {
		t.Errorf("goroutines: %d before, %d after %s, %d of the Multica surface; stacks:\n%s", base, now, what, ours, stacks)
	}
}

// TestMulticaAuth: with a key, /multica wants a token (header or
// subprotocol) as /ws does; a browser from an origin not allowed is
// refused first; a deviceId in use is taken over only by the same
// identity; roles apply to the calls.
func TestMulticaAuth(t *testing.T) {
	m := testkit.SecuredHub(t, hub.Security{Origins: []string{"https://app.example"}, Roles: map[string][]string{"mesh.agents": {"admin"}}})
	if _, res, err := testkit.DialDevice(t, m.Addr, "d1", "client", nil); err == nil || res == nil || res.StatusCode != http.StatusUnauthorized {
		t.Errorf("no token: %v, %v; want 401", res, err)
	}
	bad := http.Header{"Authorization": {"Bearer abc.def.ghi"}}
	if _, res, err := testkit.DialDevice(t, m.Addr, "d1", "client", bad); err == nil || res == nil || res.StatusCode != http.StatusUnauthorized {
		t.Errorf("bad token: %v, %v; want 401", res, err)
	}
	alice := testkit.Token(t, auth.Claims{Subject: "alice"}, time.Hour)
	evil := http.Header{"Authorization": {"Bearer " + alice}, "Origin": {"https://evil.example"}}
	if _, res, err := testkit.DialDevice(t, m.Addr, "d1", "client", evil); err == nil || res == nil || res.StatusCode != http.StatusForbidden {
		t.Errorf("foreign origin: %v, %v; want 403", res, err)
	}
	d, _, err := testkit.DialDevice(t, m.Addr, "d1", "client", http.Header{"Authorization": {"Bearer " + alice}})
	if err != nil {
		t.Fatalf("bearer header: %v", err)
	}
	d.Hub = d.Next("registered")["payload"].(map[string]any)["hubDeviceId"].(string)
	// A browser: the allowed origin, the token as a subprotocol.
	br := http.Header{"Origin": {"https://app.example"}, "Sec-WebSocket-Protocol": {"multica, " + auth.ProtocolPrefix + alice}}
	d2, _, err := testkit.DialDevice(t, m.Addr, "d2", "client", br)
	if err != nil {
		t.Fatalf("subprotocol token: %v", err)
	}
	if d2.WS.Subprotocol() != "multica" {
		t.Errorf("subprotocol %q; want multica", d2.WS.Subprotocol())
	}
	d2.Next("registered")
	// Another identity cannot take d1; alice reconnecting can.
	bob := testkit.Token(t, auth.Claims{Subject: "bob"}, time.Hour)
	if _, res, err := testkit.DialDevice(t, m.Addr, "d1", "client", http.Header{"Authorization": {"Bearer " + bob}}); err == nil || res == nil || res.StatusCode != http.StatusConflict {
		t.Errorf("bob taking alice's d1: %v, %v; want 409", res, err)
	}
	// Roles: mesh.agents needs admin.
	p := d.Request("r1", "mesh.agents", nil)
	if code, mc := testkit.MulticaErrorCode(t, p); code != "RPC_ERROR" || mc != "PERMISSION_DENIED" {
		t.Errorf("alice's mesh.agents: %v; want RPC_ERROR, meshCode PERMISSION_DENIED", p)
	}
	d1b, _, err := testkit.DialDevice(t, m.Addr, "d1", "client", http.Header{"Authorization": {"Bearer " + alice}})
	if err != nil {
		t.Fatalf("alice reconnecting d1: %v", err)
	}
	d1b.Next("registered")
	if _, err := d.Read(5 * time.Second); err == nil || testkit.IsTimeout(err) {
		t.Errorf("the replaced d1 connection: %v; want it closed", err)
	}
	// A device is disconnected when its token expires.
	short := testkit.Token(t, auth.Claims{Subject: "carol"}, time.Second)
	d3, _, err := testkit.DialDevice(t, m.Addr, "d3", "client", http.Header{"Authorization": {"Bearer " + short}})
	if err != nil {
		t.Fatalf("short token: %v", err)
	}
	d3.Next("registered")
	start := time.Now()
	_, err = d3.Read(10 * time.Second)
	t.Logf("device with a 1 s token closed after %v: %v", time.Since(start), err)
	if err == nil || testkit.IsTimeout(err) {
		t.Errorf("device with an expiring token: %v; want closed", err)
	}
}

// TestMulticaMetricsLikeNative: a call entering by the Multica surface is
// counted in rpc_server_call_duration_seconds under its mesh method and
// code, as the same call made natively.
func TestMulticaMetricsLikeNative(t *testing.T) {
	var hb *hub.Hub
	metrics := telemetry.NewMetrics(telemetry.NewLabeler(func(m string) bool { return hb.KnownMethod(m) }))
	m := testkit.StartNexus3(t, &hb, hub.WithTelemetry(telemetry.New(nil, metrics)))
	c := m.Client(t, mesh.WithoutReliability())
	if err := c.Call(t.Context(), "chat.create", map[string]any{"agent_id": "w"}, nil); err != nil {
		t.Fatal(err)
	}
	d := testkit.ConnectDevice(t, m, "metrics-dev")
	count := func(method, status string) uint64 {
		return testkit.HistCount(t, metrics, "rpc_server_call_duration_seconds", map[string]string{"rpc_method": method, "rpc_response_status_code": status})
	}
	for _, tc := range []struct {
		name, method, status, seedMethod string
		params                           map[string]any
	}{
		{"getAgentMessages", "chat.getAgentMessages", "", "getAgentMessages", map[string]any{"agentId": "w", "limit": 5}},
		{"unknown agent", "chat.getAgentMessages", "-32001", "getAgentMessages", map[string]any{"agentId": "nope"}},
		{"bad params", "chat.getAgentMessages", "-32602", "getAgentMessages", map[string]any{"agentId": "w", "offset": -1}},
		{"send", "chat.send", "", "chat.send", map[string]any{"agentId": "w", "content": "Hello"}},
	} {
		before := count(tc.method, tc.status)
		nerr := c.Call(t.Context(), tc.method, tc.params, nil)
		afterNative := count(tc.method, tc.status)
		p := d.Request("m-"+tc.name, tc.seedMethod, tc.params)
		afterMultica := count(tc.method, tc.status)
		t.Logf("%s: %s{status=%q} count %d → native %d (%v) → Multica %d (%s)", tc.name, tc.method, tc.status, before, afterNative, nerr, afterMultica, testkit.MustJSON(t, p))
		if afterNative-before != 1 || afterMultica-afterNative != 1 {
			t.Errorf("%s: counted %d natively and %d via Multica; want 1 and 1", tc.name, afterNative-before, afterMultica-afterNative)
		}
	}
}

// TestMulticaTraceLikeNative: a request carrying a traceparent in its
// meta makes the same spans in the hub as the native call of the same
// method carrying one, under its caller's trace and parent span.
func TestMulticaTraceLikeNative(t *testing.T) {
	exp, p := testkit.Tracing(t, "hub")
	m := testkit.StartNexus3(t, nil, hub.WithTelemetry(telemetry.New(p, nil)))
	if err := m.Client(t).Call(t.Context(), "chat.create", map[string]any{"agent_id": "tr"}, nil); err != nil {
		t.Fatal(err)
	}
	d := testkit.ConnectDevice(t, m, "trace-dev")
	const parent = "00f067aa0ba902b7"
	for i, tc := range []struct{ method, seedMethod, params string }{
		{"chat.getAgentMessages", "getAgentMessages", `{"agentId":"tr","limit":3}`},
		{"chat.getAgentMessages", "getAgentMessages", `{"agentId":"nope"}`},
		{"chat.send", "chat.send", `{"agentId":"tr","content":"Hello"}`},
	} {
		nativeTrace := fmt.Sprintf("4bf92f3577b34da6a3ce929d0e0e47%02d", i)
		multicaTrace := fmt.Sprintf("5bf92f3577b34da6a3ce929d0e0e47%02d", i)
		body := `{"jsonrpc":"2.0","id":1,"method":"` + tc.method + `","params":` + tc.params + `,"meta":{"traceparent":"00-` + nativeTrace + `-` + parent + `-01"}}`
		res, err := http.Post(m.HTTP+"/rpc", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		d.Write(`{"id":"t` + fmt.Sprint(i) + `","uid":null,"from":"trace-dev","to":"` + d.Hub + `","action":"request","payload":{"requestId":"rq` + fmt.Sprint(i) +
			`","method":"` + tc.seedMethod + `","params":` + tc.params + `,"meta":{"traceparent":"00-` + multicaTrace + `-` + parent + `-01"}}}`)
		for {
			if v := d.NextAny(); v["action"] == "response" {
				break
			}
		}
		if err := p.ForceFlush(t.Context()); err != nil {
			t.Fatal(err)
		}
		native, viaMultica := testkit.SpanShapes(t, exp, nativeTrace, parent), testkit.SpanShapes(t, exp, multicaTrace, parent)
		t.Logf("%s %s: spans native %v, Multica %v", tc.method, tc.params, native, viaMultica)
		if len(native) == 0 || !slices.ContainsFunc(native, func(s string) bool { return strings.HasPrefix(s, tc.method+"/server/") }) || !slices.Equal(native, viaMultica) {
			t.Errorf("spans of the native call %v, of the Multica call %v; want the same, with the %s server span", native, viaMultica, tc.method)
		}
	}
}

// TestMulticaTurnsNotCrossed: turns of one chat agent started back to back
// by one device, and at the same time by another, reach each device once
// each and only the device that asked: every stream carries its own
// turn's events and no other's (a follower used to relay the events of a
// turn that began before it had stopped, so they came twice).
func TestMulticaTurnsNotCrossed(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	rt := chat.NewRuntime(chat.Config{DataDir: t.TempDir(), MaxMessages: 4, KeepMessages: 2}, &chat.Scripted{}, nil)
	t.Cleanup(func() { rt.Close(context.Background()) })
	m.RunAgent(t, chat.NewService(rt))
	const agent = "019def34-0000-7000-8000-0000000000c2"
	if err := m.Client(t).Call(t.Context(), "chat.create", map[string]any{"agent_id": agent}, nil); err != nil {
		t.Fatal(err)
	}
	d, e := testkit.ConnectDevice(t, m, "twice"), testkit.ConnectDevice(t, m, "once")
	msg := func(dev *testkit.Device, id string) {
		dev.Write(`{"id":"` + id + `","uid":null,"from":"` + dev.ID + `","to":"` + dev.Hub + `","action":"message","payload":{"agentId":"` + agent + `","content":"turn ` + id + `"}}`)
	}
	for i := range 3 {
		msg(d, fmt.Sprint("d", 2*i))
		msg(e, fmt.Sprint("e", i))
		msg(d, fmt.Sprint("d", 2*i+1))
	}
	// Read each device until it has been quiet for a second.
	count := func(dev *testkit.Device) (starts, ends, compactions int) {
		for {
			v, err := dev.Read(time.Second)
			if err != nil {
				return
			}
			if v["action"] != "stream" {
				t.Fatalf("%s: got %v; want only stream messages", dev.ID, v)
			}
			ev := v["payload"].(map[string]any)["event"].(map[string]any)
			switch ev["type"] {
			case "message_start":
				starts++
			case "message_end":
				ends++
			case "compaction_start":
				compactions++
			}
		}
	}
	ds, de, dc := count(d)
	es, ee, ec := count(e)
	t.Logf("device twice: %d starts, %d ends, %d compactions; device once: %d, %d, %d", ds, de, dc, es, ee, ec)
	if ds != 6 || de != 6 || es != 3 || ee != 3 {
		t.Errorf("message_start/end: %d/%d and %d/%d; want 6/6 to the device that sent 6, 3/3 to the one that sent 3", ds, de, es, ee)
	}
	// Nine turns of two messages with at most 4 kept: each compaction
	// goes to the one device whose turn it came in.
	if dc+ec < 3 {
		t.Errorf("compactions relayed: %d + %d; want one per compaction, at least 3", dc, ec)
	}
}

// TestMulticaStreamSeedExamples replays the streaming seed's examples that
// need a tool that succeeds and a thinking model: the agent has a "Bash"
// tool (here it runs only `ls`, on a directory holding the seed's
// file1.txt and file2.txt), so `Bash {"command":"ls -la"}` ends as the
// seed shows: {type tool_execution_end, toolCallId, result
// "file1.txt\nfile2.txt\n", isError false}; and a turn with thinking
// streams message_update snapshots holding a {type thinking, thinking}
// block beside the text, as the seed's message_update shows.
func TestMulticaStreamSeedExamples(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"file1.txt", "file2.txt"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	bash := chat.Tool{
		Spec: chat.ToolSpec{Name: "Bash", Description: "Runs ls on the test's directory",
			Parameters: json.RawMessage(`{"type":"object","properties":{"command":{"type":"string"}},"required":["command"]}`)},
		Run: func(ctx context.Context, call chat.ToolCall, args json.RawMessage) (string, error) {
			var a struct{ Command string }
			if err := json.Unmarshal(args, &a); err != nil || !strings.HasPrefix(a.Command, "ls") {
				return "", fmt.Errorf("this Bash runs only ls")
			}
			entries, err := os.ReadDir(dir)
			if err != nil {
				return "", err
			}
			var b strings.Builder
			for _, e := range entries {
				b.WriteString(e.Name() + "\n")
			}
			return b.String(), nil
		},
	}
	m := testkit.StartChatHub(t, &testkit.EssayProvider{}, chat.NewTools(bash), nil)
	const agent = "019def34-0000-7000-8000-000000000002"
	if err := m.Client(t).Call(t.Context(), "chat.create", map[string]any{"agent_id": agent}, nil); err != nil {
		t.Fatal(err)
	}
	d := testkit.ConnectDevice(t, m, "web-2")

	d.Write(`{"id":"t1","uid":null,"from":"web-2","to":"` + d.Hub + `","action":"message","payload":{"agentId":"` + agent + `","content":"/tool Bash {\"command\":\"ls -la\"}"}}`)
	var start, end map[string]any
	for _, p := range streamEvents(t, d, agent) {
		switch ev := p["event"].(map[string]any); ev["type"] {
		case "tool_execution_start":
			start = ev
		case "tool_execution_end":
			end = ev
		}
	}
	if start == nil || end == nil {
		t.Fatal("no tool execution in the stream")
	}
	id, _ := start["toolCallId"].(string)
	// The seed's two events, the tool call's id aside.
	var wantStart, wantEnd map[string]any
	_ = json.Unmarshal([]byte(`{"type":"tool_execution_start","toolCallId":"toolu_01ABC...","toolName":"Bash","args":{"command":"ls -la"}}`), &wantStart)
	_ = json.Unmarshal([]byte(`{"type":"tool_execution_end","toolCallId":"toolu_01ABC...","result":"file1.txt\nfile2.txt\n","isError":false}`), &wantEnd)
	wantStart["toolCallId"], wantEnd["toolCallId"] = id, id
	if id == "" || !reflect.DeepEqual(start, wantStart) {
		t.Errorf("tool_execution_start = %v; want %v", start, wantStart)
	}
	if !reflect.DeepEqual(end, wantEnd) {
		t.Errorf("tool_execution_end = %v; want the seed's %v", end, wantEnd)
	}

	d.Write(`{"id":"t2","uid":null,"from":"web-2","to":"` + d.Hub + `","action":"message","payload":{"agentId":"` + agent + `","content":"/think Let me consider..."}}`)
	withThinking := 0
	for _, p := range streamEvents(t, d, agent) {
		ev := p["event"].(map[string]any)
		if ev["type"] != "message_update" {
			continue
		}
		kinds := map[string]bool{}
		for _, b := range ev["message"].(map[string]any)["content"].([]any) {
			blk := b.(map[string]any)
			switch blk["type"] {
			case "thinking":
				if th, ok := blk["thinking"].(string); !ok || len(blk) != 2 {
					t.Errorf("thinking block %v; want {type thinking, thinking: string}", blk)
				} else if th != "" {
					kinds["thinking"] = true
				}
			case "text":
				if _, ok := blk["text"].(string); !ok || len(blk) != 2 {
					t.Errorf("text block %v; want {type text, text: string}", blk)
				}
				kinds["text"] = true
			}
		}
		if kinds["thinking"] && kinds["text"] {
			withThinking++
		}
	}
	if withThinking == 0 {
		t.Error("no message_update held a thinking block beside the text, as the seed's does")
	}
}

// TestMulticaStreamCompactionTokens: compaction in token mode reaches the
// device with the seed's full compaction_end, token figures included:
// {type compaction_end, removed, kept, tokensRemoved, tokensKept, reason
// "tokens"}, the figures consistent with each other.
func TestMulticaStreamCompactionTokens(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	rt := chat.NewRuntime(chat.Config{DataDir: t.TempDir(), TokenBudget: 600, KeepTokens: 200, MaxMessages: -1}, &chat.Scripted{}, nil)
	t.Cleanup(func() { rt.Close(context.Background()) })
	m.RunAgent(t, chat.NewService(rt))
	const agent = "019def34-0000-7000-8000-0000000000c2"
	if err := m.Client(t).Call(t.Context(), "chat.create", map[string]any{"agent_id": agent}, nil); err != nil {
		t.Fatal(err)
	}
	d := testkit.ConnectDevice(t, m, "compactor-t")
	var got []map[string]any
	for i := 0; i < 12 && len(got) == 0; i++ {
		d.Write(`{"id":"k` + fmt.Sprint(i) + `","uid":null,"from":"compactor-t","to":"` + d.Hub + `","action":"message","payload":{"agentId":"` + agent + `","content":"/long 60"}}`)
		for _, p := range streamEvents(t, d, agent) {
			if ev := p["event"].(map[string]any); strings.HasPrefix(ev["type"].(string), "compaction_") {
				got = append(got, p)
			}
		}
	}
	if len(got) != 2 {
		t.Fatalf("compaction events %v; want compaction_start and compaction_end", got)
	}
	t.Logf("compaction (tokens): %s", testkit.MustJSON(t, got))
	end := got[1]["event"].(map[string]any)
	if !reflect.DeepEqual(testkit.Keys(end), []string{"kept", "reason", "removed", "tokensKept", "tokensRemoved", "type"}) ||
		end["type"] != "compaction_end" || end["reason"] != "tokens" || got[1]["streamId"] != "compaction:"+agent {
		t.Fatalf("compaction_end %v; want the seed's {type, removed, kept, tokensRemoved, tokensKept, reason: tokens}", got[1])
	}
	removed, kept := end["removed"].(float64), end["kept"].(float64)
	tr, tk := end["tokensRemoved"].(float64), end["tokensKept"].(float64)
	if removed < 1 || kept < 1 || tr <= 0 || tk <= 0 || tk > 200 {
		t.Errorf("compaction_end figures removed %v kept %v tokensRemoved %v tokensKept %v; want positive, tokensKept <= KeepTokens (200)", removed, kept, tr, tk)
	}
}
