package multica_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
)

// sioDev is a Socket.IO client over Engine.IO's WebSocket transport,
// written from the protocol (Engine.IO 4, Socket.IO 5): what
// socket.io-client sends, byte for byte (interop/socketio.test.mjs runs
// the real one).
type sioDev struct {
	t   *testing.T
	ws  *websocket.Conn
	id  string
	hub string
}

// dialSIO opens the Engine.IO session (path /socket.io/ or /ws/) and
// connects to the main namespace with auth (nil: none); it returns the
// device before any Socket.IO answer is read.
func dialSIO(t *testing.T, addr, path, id string, hdr http.Header, authJSON string) (*sioDev, *http.Response, error) {
	t.Helper()
	q := url.Values{"EIO": {"4"}, "transport": {"websocket"}}
	if id != "" {
		q.Set("deviceId", id)
		q.Set("deviceType", "client")
	}
	ws, res, err := websocket.DefaultDialer.DialContext(t.Context(), "ws://"+addr+path+"?"+q.Encode(), hdr)
	if err != nil {
		return nil, res, err
	}
	t.Cleanup(func() { _ = ws.Close() })
	d := &sioDev{t: t, ws: ws, id: id}
	if open := d.engine(); !strings.HasPrefix(open, "0{") || !strings.Contains(open, `"pingInterval"`) {
		t.Fatalf("engine open packet %q", open)
	}
	d.write("0" + authJSON)
	return d, res, nil
}

// connectSIO dials and waits for registered.
func connectSIO(t *testing.T, m *meshtest.Mesh, path, id string) *sioDev {
	t.Helper()
	d, _, err := dialSIO(t, m.Addr, path, id, nil, "")
	if err != nil {
		t.Fatalf("dial %s: %v", id, err)
	}
	if p := d.packet(); !strings.HasPrefix(p, `0{"sid":`) {
		t.Fatalf("CONNECT answered %q", p)
	}
	r := d.event("registered")
	if r["success"] != true || r["deviceId"] != id || r["hubDeviceId"] != m.Hub.ID() {
		t.Fatalf("registered %v", r)
	}
	d.hub = m.Hub.ID()
	return d
}

// write sends one Socket.IO packet in an Engine.IO message.
func (d *sioDev) write(pkt string) {
	d.t.Helper()
	if err := d.ws.WriteMessage(websocket.TextMessage, []byte("4"+pkt)); err != nil {
		d.t.Fatalf("%s: write: %v", d.id, err)
	}
}

// engine returns the next Engine.IO packet, answering pings.
func (d *sioDev) engine() string {
	d.t.Helper()
	for {
		_ = d.ws.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, b, err := d.ws.ReadMessage()
		if err != nil {
			d.t.Fatalf("%s: read: %v", d.id, err)
		}
		if string(b) == "2" {
			_ = d.ws.WriteMessage(websocket.TextMessage, []byte("3"))
			continue
		}
		return string(b)
	}
}

// packet returns the next Socket.IO packet.
func (d *sioDev) packet() string {
	d.t.Helper()
	p := d.engine()
	if p[0] != '4' {
		d.t.Fatalf("%s: engine packet %q; want a message", d.id, p)
	}
	return p[1:]
}

// event returns the argument of the next event, which must be name.
func (d *sioDev) event(name string) map[string]any {
	d.t.Helper()
	p := d.packet()
	var ev []json.RawMessage
	if !strings.HasPrefix(p, "2") || json.Unmarshal([]byte(p[1:]), &ev) != nil || len(ev) != 2 {
		d.t.Fatalf("%s: packet %q; want event %q", d.id, p, name)
	}
	var got string
	var arg map[string]any
	_ = json.Unmarshal(ev[0], &got)
	if got != name || json.Unmarshal(ev[1], &arg) != nil {
		d.t.Fatalf("%s: packet %q; want event %q", d.id, p, name)
	}
	return arg
}

// send emits "send" with a RoutedMessage.
func (d *sioDev) send(msg string) { d.write(`2["send",` + msg + `]`) }

// request sends a request to the hub and returns its response payload.
func (d *sioDev) request(rid, method, params string) map[string]any {
	d.t.Helper()
	d.send(fmt.Sprintf(`{"id":"m-%s","uid":null,"from":%q,"to":%q,"action":"request","payload":{"requestId":%q,"method":%q,"params":%s}}`, rid, d.id, d.hub, rid, method, params))
	for {
		m := d.event("receive")
		if m["action"] == "stream" {
			continue
		}
		p := m["payload"].(map[string]any)
		if m["action"] != "response" || p["requestId"] != rid || m["from"] != d.hub || m["to"] != d.id {
			d.t.Fatalf("%s: got %v; want the response to %s", d.id, m, rid)
		}
		return p
	}
}

// TestSocketIODevice: a device over Socket.IO (at /socket.io/ and at the
// Multica SDK's /ws/) is a Multica device: requests answered with the
// seed's codes, messages routed to and from a WebSocket device, a chat
// turn streamed; and every bad packet is a coded send_error that leaves
// the session usable.
func TestSocketIODevice(t *testing.T) {
	m := testkit.StartNexus3With(t, &testkit.EssayProvider{}, nil)
	for _, path := range []string{"/socket.io/", "/ws/"} {
		d := connectSIO(t, m, path, "sio"+strings.Trim(path, "/"))
		if p := d.request("r1", "chat.list", `{}`); p["ok"] != true {
			t.Errorf("%s chat.list: %v", path, p)
		}
		p := d.request("r2", "getAgentMessages", `{}`)
		if code, _ := testkit.MulticaErrorCode(t, p); code != "INVALID_PARAMS" {
			t.Errorf("%s getAgentMessages {}: %v; want INVALID_PARAMS", path, p)
		}
	}
	d := connectSIO(t, m, "/socket.io/", "web-1")
	w := testkit.ConnectDevice(t, m, "ws-1")
	// Routed as sent: a number beyond float64's precision arrives whole
	// (a Socket.IO layer decoding into map[string]any would round it).
	d.send(`{"id":"n1","uid":"u1","from":"web-1","to":"ws-1","action":"note","payload":{"n":12345678901234567890}}`)
	_ = w.WS.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, b, err := w.WS.ReadMessage(); err != nil || !strings.Contains(string(b), `"payload":{"n":12345678901234567890}`) || !strings.Contains(string(b), `"from":"web-1"`) || !strings.Contains(string(b), `"uid":"u1"`) {
		t.Errorf("WebSocket device got %s, %v", b, err)
	}
	w.Write(`{"id":"n2","uid":null,"from":"ws-1","to":"web-1","action":"note","payload":{"n":2}}`)
	if got := d.event("receive"); got["from"] != "ws-1" || got["action"] != "note" || got["id"] != "n2" {
		t.Errorf("Socket.IO device got %v", got)
	}
	// A chat turn: its events as stream actions, then the response.
	if p := d.request("c1", "chat.create", `{"agent_id":"sio-chat"}`); p["ok"] != true {
		t.Fatalf("chat.create: %v", p)
	}
	d.send(`{"id":"t1","uid":null,"from":"web-1","to":"` + d.hub + `","action":"request","payload":{"requestId":"t1","method":"chat.send","params":{"agentId":"sio-chat","content":"Hello"}}}`)
	var types []string
	for {
		ev := d.event("receive")
		if ev["action"] == "response" {
			if ev["payload"].(map[string]any)["ok"] != true {
				t.Errorf("chat.send response %v", ev)
			}
			break
		}
		types = append(types, ev["payload"].(map[string]any)["event"].(map[string]any)["type"].(string))
	}
	if len(types) < 3 || types[0] != "message_start" || types[len(types)-1] != "message_end" {
		t.Errorf("turn events %v", types)
	}
	// Bad input: each a coded send_error; the session goes on.
	for _, tc := range []struct{ pkt, code, has string }{
		{`2["send","not an object"]`, "INVALID_PARAMS", ""},
		{`2["send",{"id":"x1","uid":null,"from":"someone-else","to":"ws-1","action":"note","payload":{}}]`, "INVALID_PARAMS", "x1"},
		{`2["send",{"id":"x2","uid":null,"from":"web-1","to":"nobody","action":"note","payload":{}}]`, "RPC_ERROR", "x2"},
		{`2["send"]`, "INVALID_MESSAGE", ""},
		{`2{"not":"an array"}`, "INVALID_MESSAGE", ""},
		{`2["frobnicate",{}]`, "UNKNOWN_EVENT", ""},
		{`51-["send",{"_placeholder":true,"num":0}]`, "INVALID_MESSAGE", ""},
		{`9`, "INVALID_MESSAGE", ""},
		{`299999999999999999999["send",{}]`, "INVALID_MESSAGE", ""},
	} {
		d.write(tc.pkt)
		e := d.event("send_error")
		if e["code"] != tc.code || e["error"] == "" || (tc.has != "" && e["messageId"] != tc.has) {
			t.Errorf("packet %s: send_error %v; want code %s", tc.pkt, e, tc.code)
		}
	}
	d.write(`0/admin,`)
	if p := d.packet(); !strings.HasPrefix(p, `4/admin,{"message":"Invalid namespace"`) {
		t.Errorf("namespace /admin: %q", p)
	}
	// Acknowledged events of the SDK.
	d.write(`27["ping",{}]`)
	if p := d.packet(); p != `37[{"event":"pong","data":"pong"}]` {
		t.Errorf("ping ack %q", p)
	}
	d.write(`28["list-devices",{}]`)
	if p := d.packet(); !strings.HasPrefix(p, `38[{"devices":[`) || !strings.Contains(p, `"web-1"`) || !strings.Contains(p, `"ws-1"`) {
		t.Errorf("list-devices ack %q", p)
	}
	if p := d.request("r9", "chat.list", `{}`); p["ok"] != true {
		t.Errorf("after bad input: %v", p)
	}
}

// TestSocketIOPolling: a device on long-polling only (a browser behind a
// proxy that refuses WebSockets): Engine.IO's handshake, then packets
// POSTed and polled, as socket.io-client does.
func TestSocketIOPolling(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	base := "http://" + m.Addr + "/socket.io/?EIO=4&transport=polling"
	get := func(u string) string {
		t.Helper()
		res, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.StatusCode != 200 {
			t.Fatalf("GET %s: %d %s", u, res.StatusCode, b)
		}
		return string(b)
	}
	post := func(u, body string) {
		t.Helper()
		res, err := http.Post(u, "text/plain;charset=UTF-8", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || string(b) != "ok" {
			t.Fatalf("POST %s: %d %s", u, res.StatusCode, b)
		}
	}
	open := get(base + "&deviceId=poller&deviceType=client")
	var hs struct {
		Sid      string   `json:"sid"`
		Upgrades []string `json:"upgrades"`
	}
	if !strings.HasPrefix(open, "0") || json.Unmarshal([]byte(open[1:]), &hs) != nil || hs.Sid == "" {
		t.Fatalf("handshake %q", open)
	}
	sess := base + "&sid=" + hs.Sid
	post(sess, "40")
	// Packets of a poll are separated by the record separator.
	var got []string
	for len(got) < 2 {
		got = append(got, strings.Split(get(sess), "\x1e")...)
	}
	if !strings.HasPrefix(got[0], `40{"sid":`) || !strings.HasPrefix(got[1], `42["registered",{`) || !strings.Contains(got[1], `"success":true`) {
		t.Fatalf("after CONNECT: %q", got)
	}
	post(sess, `42["send",{"id":"p1","uid":null,"from":"poller","to":"`+m.Hub.ID()+`","action":"request","payload":{"requestId":"q1","method":"mesh.methods"}}]`)
	var resp string
	for resp == "" {
		for _, p := range strings.Split(get(sess), "\x1e") {
			if strings.HasPrefix(p, `42["receive",`) {
				resp = p
			}
		}
	}
	if !strings.Contains(resp, `"requestId":"q1","ok":true`) {
		t.Errorf("response %s", resp)
	}
}

// TestSocketIOAuth: with a key, the CONNECT needs a token (auth.token or
// the Authorization header); a foreign origin is refused on every request;
// another identity cannot take a deviceId, the same one takes it over.
func TestSocketIOAuth(t *testing.T) {
	m := testkit.SecuredHub(t, hub.Security{Origins: []string{"https://app.example"}})
	d, _, err := dialSIO(t, m.Addr, "/socket.io/", "d1", nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if p := d.packet(); !strings.HasPrefix(p, `4{`) || !strings.Contains(p, `"code":"UNAUTHENTICATED"`) {
		t.Errorf("no token: %q; want connect_error UNAUTHENTICATED", p)
	}
	alice := testkit.Token(t, auth.Claims{Subject: "alice"}, time.Hour)
	if _, res, err := dialSIO(t, m.Addr, "/socket.io/", "d1", http.Header{"Origin": {"https://evil.example"}}, `{"token":"`+alice+`"}`); err == nil || res == nil || res.StatusCode != http.StatusForbidden {
		t.Errorf("foreign origin: %v, %v; want 403", res, err)
	}
	a, _, err := dialSIO(t, m.Addr, "/socket.io/", "d1", http.Header{"Origin": {"https://app.example"}}, `{"token":"`+alice+`"}`)
	if err != nil {
		t.Fatal(err)
	}
	a.packet()
	if r := a.event("registered"); r["success"] != true {
		t.Fatalf("alice: %v", r)
	}
	a.hub = m.Hub.ID()
	h, _, err := dialSIO(t, m.Addr, "/socket.io/", "d2", http.Header{"Authorization": {"Bearer " + alice}}, "")
	if err != nil {
		t.Fatal(err)
	}
	h.packet()
	if r := h.event("registered"); r["success"] != true {
		t.Errorf("alice by header: %v", r)
	}
	bob := testkit.Token(t, auth.Claims{Subject: "bob"}, time.Hour)
	b, _, err := dialSIO(t, m.Addr, "/socket.io/", "d1", nil, `{"token":"`+bob+`"}`)
	if err != nil {
		t.Fatal(err)
	}
	b.packet()
	if r := b.event("registered"); r["success"] != false || !strings.Contains(r["error"].(string), "another identity") {
		t.Errorf("bob taking alice's d1: %v; want success false", r)
	}
	if p := a.request("r1", "mesh.methods", `{}`); p["ok"] != true {
		t.Errorf("alice after bob's try: %v", p)
	}
	// Alice again: the old session is told and disconnected.
	a2, _, err := dialSIO(t, m.Addr, "/socket.io/", "d1", nil, `{"token":"`+alice+`"}`)
	if err != nil {
		t.Fatal(err)
	}
	a2.packet()
	a2.event("registered")
	if e := a.event("send_error"); !strings.Contains(e["error"].(string), "replaced") {
		t.Errorf("replaced session: %v", e)
	}
	if p := a.packet(); p != "1" {
		t.Errorf("replaced session: %q; want DISCONNECT", p)
	}
}

// TestSocketIONoLeak: sessions that connect, work and go (closed by the
// client, abandoned before CONNECT, or closed by the hub's shutdown)
// leave no goroutine behind.
func TestSocketIONoLeak(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	time.Sleep(100 * time.Millisecond)
	base := runtime.NumGoroutine()
	for i := range 5 {
		d := connectSIO(t, m, "/socket.io/", fmt.Sprintf("leak-%d", i))
		d.request("r", "mesh.methods", `{}`)
		_ = d.ws.Close()
		n, _, err := dialSIO(t, m.Addr, "/ws/", "", nil, "") // no deviceId: refused
		if err != nil {
			t.Fatal(err)
		}
		if p := n.packet(); !strings.Contains(p, `"code":"INVALID_PARAMS"`) {
			t.Errorf("CONNECT without a deviceId: %q", p)
		}
		_ = n.ws.Close()
	}
	settled(t, base, "Socket.IO sessions closed")
	for i := range 3 {
		connectSIO(t, m, "/socket.io/", fmt.Sprintf("open-%d", i))
	}
	if err := m.Hub.Shutdown(t.Context()); err != nil {
		t.Fatal(err)
	}
	settled(t, base, "the hub closed with Socket.IO sessions open")
}

// TestSocketIOSlowDevice: a long-polling device that stops polling holds
// the packets sent to it; past its queue's bound (as a WebSocket
// device's) it is disconnected and its senders are told, never blocked.
func TestSocketIOSlowDevice(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	base := "http://" + m.Addr + "/socket.io/?EIO=4&transport=polling"
	res, err := http.Get(base + "&deviceId=sleeper&deviceType=client")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var hs struct{ Sid string }
	if json.Unmarshal(b[1:], &hs) != nil {
		t.Fatalf("handshake %q", b)
	}
	res, err = http.Post(base+"&sid="+hs.Sid, "text/plain", strings.NewReader("40"))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	w := testkit.ConnectDevice(t, m, "sender")
	// What the hub answers the sender (a gorilla read that timed out
	// cannot be resumed: one reader, into a channel).
	answers := make(chan map[string]any, 16)
	go func() {
		defer close(answers)
		for {
			_, b, err := w.WS.ReadMessage()
			if err != nil {
				return
			}
			var v map[string]any
			_ = json.Unmarshal(b, &v)
			answers <- v
		}
	}()
	// Until the sleeper is registered, a message to it is an error.
	meshtest.WaitFor(t, 5*time.Second, func() bool {
		w.Write(`{"id":"probe","uid":null,"from":"sender","to":"sleeper","action":"note","payload":{}}`)
		select {
		case <-answers:
			return false
		case <-time.After(100 * time.Millisecond):
			return true
		}
	})
	// The sleeper never polls again: 256 packets fill its queue.
	var told map[string]any
	for i := 0; i < 400 && told == nil; i++ {
		w.Write(fmt.Sprintf(`{"id":"n%d","uid":null,"from":"sender","to":"sleeper","action":"note","payload":{"i":%d}}`, i, i))
		select {
		case told = <-answers:
		default:
		}
	}
	if told == nil {
		select {
		case told = <-answers:
		case <-time.After(5 * time.Second):
			t.Fatal("sender: no error after 400 messages to a device that does not read")
		}
	}
	p, _ := told["payload"].(map[string]any)
	if told["action"] != "error" || !strings.Contains(fmt.Sprint(p["message"]), "does not read") {
		t.Errorf("sender told %v", told)
	}
	// The sleeper's session is closed: its next poll is refused.
	res, err = http.Get(base + "&sid=" + hs.Sid)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusBadRequest {
		t.Errorf("the slow device's next poll: %d %q; want its session gone (400)", res.StatusCode, b)
	}
}
