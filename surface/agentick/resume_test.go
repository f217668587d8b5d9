package agentick_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents/chat"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
)

// The SSE resume of GET /events over real HTTP (the ring, the grace
// timer and the stream's wait are unit-tested in resume_internal_test.go).

// invokeOK runs an /invoke body and fails the test unless it succeeds.
func invokeOK(t *testing.T, m *meshtest.Mesh, body string) map[string]any {
	t.Helper()
	st, r := testkit.AgentickInvoke(t, m, "", body)
	if st != http.StatusOK || r["ok"] != true {
		t.Fatalf("%s: HTTP %d %v", body, st, r)
	}
	return r
}

// idOf is the number of s's last frame's id.
func idOf(t *testing.T, s *sse) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(s.id, 10, 64)
	if err != nil {
		t.Fatalf("frame id %q: not a number", s.id)
	}
	return n
}

// wantConnected reads s's connected frame and checks its id and resumed.
func wantConnected(t *testing.T, s *sse, id string, resumed any) {
	t.Helper()
	v := s.next(nil)
	if v["type"] != "connected" || s.id != id || v["resumed"] != resumed || s.retry != "1000" {
		t.Fatalf("first frame %v (id %q, retry %q); want connected with id %s, resumed %v, retry 1000", v, s.id, s.retry, id, resumed)
	}
}

// turnReader follows one turn's events over SSE streams, checking that
// the ids go up by one from frame to frame, across streams too.
type turnReader struct {
	t      *testing.T
	last   uint64 // id of the last event read
	events int
	text   strings.Builder
	result string
}

// read reads s up to the turn's execution_end (true) or n events (false).
func (tr *turnReader) read(s *sse, n int) bool {
	tr.t.Helper()
	for range n {
		v := s.next(nil)
		if id := idOf(tr.t, s); id != tr.last+1 {
			tr.t.Fatalf("event %v has id %d after %d; want %d", v["event"], id, tr.last, tr.last+1)
		}
		tr.last++
		tr.events++
		d, _ := v["data"].(map[string]any)
		switch v["event"] {
		case "content_delta":
			tr.text.WriteString(d["delta"].(string))
		case "result":
			tr.result, _ = d["content"].(string)
		case "execution_end":
			return true
		}
	}
	return false
}

// TestAgentickSSEResume: a stream dropped in the middle of a turn and
// reopened with Last-Event-ID (the header, then the lastEventId query
// parameter) gets exactly the events it had not read: the ids go on from
// one to the next, none twice, none missing, and the deltas add up to
// the answer.
func TestAgentickSSEResume(t *testing.T) {
	m, _ := startAgentickWith(t, chat.Config{}, time.Millisecond)
	a, st, _ := openSSEAt(t, m, "/events?clientId=res-1", "", "")
	if st != http.StatusOK {
		t.Fatalf("GET /events: HTTP %d", st)
	}
	wantConnected(t, a, "0", nil)
	invokeOK(t, m, `{"method":"send","params":{"sessionId":"rs","message":"/long 300"},"clientId":"res-1"}`)
	tr := &turnReader{t: t}
	if tr.read(a, 20) {
		t.Fatal("the turn ended within 20 events")
	}
	a.close() // the turn goes on meanwhile

	b, st, body := openSSEAt(t, m, "/events?clientId=res-1", "", strconv.FormatUint(tr.last, 10))
	if st != http.StatusOK {
		t.Fatalf("resume: HTTP %d %s", st, body)
	}
	wantConnected(t, b, strconv.FormatUint(tr.last, 10), true)
	if tr.read(b, 40) {
		t.Fatal("the turn ended within 60 events")
	}
	b.close()

	c, st, body := openSSEAt(t, m, "/events?clientId=res-1&lastEventId="+strconv.FormatUint(tr.last, 10), "", "")
	if st != http.StatusOK {
		t.Fatalf("resume by lastEventId: HTTP %d %s", st, body)
	}
	wantConnected(t, c, strconv.FormatUint(tr.last, 10), true)
	if !tr.read(c, 10000) {
		t.Fatal("no execution_end")
	}
	t.Logf("one turn over 3 streams: %d events, ids 1..%d", tr.events, tr.last)
	if tr.result == "" || tr.text.String() != tr.result || !strings.HasSuffix(tr.result, "word300") {
		t.Errorf("deltas add up to %q…; want the result %q…", head(tr.text.String()), head(tr.result))
	}
	c.close()
	waitAgentickGone(t)
}

func head(s string) string { return s[:min(len(s), 40)] }

// TestAgentickSSEGap: a client away while more events came than its ring
// holds (here by bytes: five channel messages of 300 KB in a 1 MiB ring)
// resumes with a gap frame naming the ids it lost, then the events the
// ring held, in order.
func TestAgentickSSEGap(t *testing.T) {
	m := testkit.StartNexus3(t, nil)
	invokeOK(t, m, `{"method":"send","params":{"sessionId":"room","message":"hi"}}`)
	a, _, _ := openSSEAt(t, m, "/events?clientId=gap-1", "", "")
	wantConnected(t, a, "0", nil)
	invokeOK(t, m, `{"method":"channel-subscribe","params":{"sessionId":"room","channel":"big"},"clientId":"gap-1"}`)
	a.close()
	big := strings.Repeat("x", 300_000)
	for i := 1; i <= 5; i++ {
		invokeOK(t, m, fmt.Sprintf(`{"method":"channel","params":{"sessionId":"room","channel":"big","payload":{"n":%d,"pad":%q}}}`, i, big))
	}
	b, st, body := openSSEAt(t, m, "/events?clientId=gap-1", "", "0")
	if st != http.StatusOK {
		t.Fatalf("resume: HTTP %d %s", st, body)
	}
	wantConnected(t, b, "0", true)
	if v := b.next(nil); v["type"] != "gap" || v["from"] != 1.0 || v["to"] != 2.0 || b.id != "2" {
		t.Fatalf("frame %v (id %q); want the gap {from: 1, to: 2} with id 2", v, b.id)
	}
	for i := 3; i <= 5; i++ {
		v := b.next(nil)
		d, _ := v["data"].(map[string]any)
		p, _ := d["payload"].(map[string]any)
		if v["event"] != "channel" || b.id != strconv.Itoa(i) || p["n"] != float64(i) {
			t.Fatalf("frame %v… (id %q); want channel message %d with id %d", v["event"], b.id, i, i)
		}
	}
	// Live again: the next event is 6.
	invokeOK(t, m, `{"method":"channel","params":{"sessionId":"room","channel":"big","payload":{"n":6}}}`)
	if v := b.next(nil); v["event"] != "channel" || b.id != "6" {
		t.Fatalf("frame %v (id %q); want channel message 6", v, b.id)
	}
}

// TestAgentickSSESecondStream: a second stream for a clientId whose
// stream is live, without Last-Event-ID or with an id the client never
// issued, is refused 409 with a coded error frame, and the first stream
// goes on; so is an /events for a clientId connected on the WebSocket.
func TestAgentickSSESecondStream(t *testing.T) {
	m := testkit.StartNexus3(t, nil)
	invokeOK(t, m, `{"method":"send","params":{"sessionId":"room","message":"hi"}}`)
	a, _, _ := openSSEAt(t, m, "/events?clientId=two", "", "")
	wantConnected(t, a, "0", nil)
	invokeOK(t, m, `{"method":"channel-subscribe","params":{"sessionId":"room","channel":"c"},"clientId":"two"}`)
	for _, last := range []string{"", "7", "x"} {
		_, st, body := openSSEAt(t, m, "/events?clientId=two", "", last)
		var f map[string]any
		_ = json.Unmarshal(body, &f)
		if msg, _ := f["message"].(string); st != http.StatusConflict || f["type"] != "error" || f["code"] != "STATE_ALREADY_COMPLETE" ||
			!strings.Contains(msg, "already has a live event stream") {
			t.Errorf("second stream (Last-Event-ID %q): HTTP %d %s; want 409 and the error frame STATE_ALREADY_COMPLETE", last, st, body)
		}
	}
	invokeOK(t, m, `{"method":"channel","params":{"sessionId":"room","channel":"c","payload":1}}`)
	if v := a.next(nil); v["event"] != "channel" || a.id != "1" {
		t.Errorf("first stream after the refusals: %v (id %q); want the channel message, id 1", v, a.id)
	}
	// A clientId connected on the WebSocket has a live client too.
	ws := connectAg(t, m, "on-ws")
	if _, st, body := openSSEAt(t, m, "/events?clientId=on-ws", "", "0"); st != http.StatusConflict {
		t.Errorf("/events for a WebSocket's clientId: HTTP %d %s; want 409", st, body)
	}
	payload(t, "sessions on the WebSocket", ws.Call("1", "sessions", nil))
}

// TestAgentickSSETakeover: a request with the Last-Event-ID of a stream
// still live (its end not noticed yet) takes the client over: the old
// stream is closed, the new one replays from that id and goes on.
func TestAgentickSSETakeover(t *testing.T) {
	m := testkit.StartNexus3(t, nil)
	invokeOK(t, m, `{"method":"send","params":{"sessionId":"room","message":"hi"}}`)
	a, _, _ := openSSEAt(t, m, "/events?clientId=tk", "", "")
	wantConnected(t, a, "0", nil)
	invokeOK(t, m, `{"method":"channel-subscribe","params":{"sessionId":"room","channel":"c"},"clientId":"tk"}`)
	for i := 1; i <= 2; i++ {
		invokeOK(t, m, fmt.Sprintf(`{"method":"channel","params":{"sessionId":"room","channel":"c","payload":%d}}`, i))
		if v := a.next(nil); v["event"] != "channel" || a.id != strconv.Itoa(i) {
			t.Fatalf("event %d: %v (id %q)", i, v, a.id)
		}
	}
	b, st, body := openSSEAt(t, m, "/events?clientId=tk", "", "1")
	if st != http.StatusOK {
		t.Fatalf("takeover: HTTP %d %s", st, body)
	}
	wantConnected(t, b, "1", true)
	if v := b.next(nil); v["event"] != "channel" || b.id != "2" {
		t.Fatalf("replayed %v (id %q); want channel message 2", v, b.id)
	}
	select {
	case <-a.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the old stream did not end when another took its client over")
	}
	invokeOK(t, m, `{"method":"channel","params":{"sessionId":"room","channel":"c","payload":3}}`)
	if v := b.next(nil); v["event"] != "channel" || b.id != "3" {
		t.Fatalf("live %v (id %q); want channel message 3", v, b.id)
	}
}

// TestAgentickSSEStreamResume: a streaming method's events (/invoke with
// the clientId of an event stream) are held for a resume too: the stream
// dropped after a few chunks and reopened with Last-Event-ID gets every
// chunk once and in order, then method:end, and the call's answer is ok.
func TestAgentickSSEStreamResume(t *testing.T) {
	m, _ := startAgentickWith(t, chat.Config{}, 0)
	a, _, _ := openSSEAt(t, m, "/events?clientId=st", "", "")
	wantConnected(t, a, "0", nil)
	const n = 600
	var wg sync.WaitGroup
	var st int
	var res map[string]any
	wg.Go(func() {
		st, res = testkit.AgentickInvoke(t, m, "", fmt.Sprintf(`{"method":"echo.stream","params":{"n":%d},"id":"s1","clientId":"st"}`, n))
	})
	seq := 0
	check := func(s *sse) bool {
		t.Helper()
		v := s.next(nil)
		d, _ := v["data"].(map[string]any)
		if id := idOf(t, s); id != uint64(seq+1) {
			t.Fatalf("%v with id %d after %d", v["event"], id, seq)
		}
		if v["event"] == "method:end" {
			if d["chunks"] != float64(n) || d["error"] != nil {
				t.Fatalf("end %v", d)
			}
			return true
		}
		seq++
		if v["event"] != "method:chunk" || d["seq"] != float64(seq) || d["requestId"] != "s1" {
			t.Fatalf("event %v; want chunk %d", v, seq)
		}
		return false
	}
	for range 10 {
		if check(a) {
			t.Fatal("the stream ended within 10 chunks")
		}
	}
	a.close()
	b, code, body := openSSEAt(t, m, "/events?clientId=st", "", strconv.Itoa(seq))
	if code != http.StatusOK {
		t.Fatalf("resume: HTTP %d %s", code, body)
	}
	wantConnected(t, b, strconv.Itoa(seq), true)
	for !check(b) {
	}
	wg.Wait()
	if st != http.StatusOK || res["ok"] != true {
		t.Errorf("echo.stream: HTTP %d %v", st, res)
	}
}

// TestAgentickSSEExpired: once the grace period has passed, the client
// is gone (its subscriptions with it): a request with its Last-Event-ID
// starts a new client, "resumed": false, ids from 1 again. (2 s in the
// tests; the timer itself is unit-tested under synctest.)
func TestAgentickSSEExpired(t *testing.T) {
	m := testkit.StartNexus3(t, nil)
	invokeOK(t, m, `{"method":"send","params":{"sessionId":"room","message":"hi"}}`)
	a, _, _ := openSSEAt(t, m, "/events?clientId=exp", "", "")
	wantConnected(t, a, "0", nil)
	invokeOK(t, m, `{"method":"channel-subscribe","params":{"sessionId":"room","channel":"c"},"clientId":"exp"}`)
	invokeOK(t, m, `{"method":"channel","params":{"sessionId":"room","channel":"c","payload":1}}`)
	if v := a.next(nil); v["event"] != "channel" || a.id != "1" {
		t.Fatalf("event %v (id %q)", v, a.id)
	}
	a.close()
	clients := func() float64 {
		p := invokeOK(t, m, `{"method":"status"}`)["payload"].(map[string]any)
		return p["gateway"].(map[string]any)["clients"].(float64)
	}
	if n := clients(); n != 1 {
		t.Errorf("clients right after the stream ended: %v; want 1 (kept for a resume)", n)
	}
	meshtest.WaitFor(t, 15*time.Second, func() bool { return clients() == 0 })
	b, st, body := openSSEAt(t, m, "/events?clientId=exp", "", "1")
	if st != http.StatusOK {
		t.Fatalf("after the grace period: HTTP %d %s", st, body)
	}
	wantConnected(t, b, "0", false)
	invokeOK(t, m, `{"method":"channel-subscribe","params":{"sessionId":"room","channel":"c"},"clientId":"exp"}`)
	invokeOK(t, m, `{"method":"channel","params":{"sessionId":"room","channel":"c","payload":2}}`)
	if v := b.next(nil); v["event"] != "channel" || b.id != "1" {
		t.Fatalf("event %v (id %q); want the channel message with id 1", v, b.id)
	}
}
