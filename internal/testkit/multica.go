package testkit

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
)

// Device is a Multica device on a real WebSocket to a hub's /multica.
type Device struct {
	t   *testing.T
	WS  *websocket.Conn
	ID  string
	Hub string // the hub's deviceId, from the greeting
}

// DialDevice connects deviceId id to the hub at addr (host:port), with
// the header given (tokens, Origin, subprotocols).
func DialDevice(t *testing.T, addr, id, typ string, hdr http.Header) (*Device, *http.Response, error) {
	t.Helper()
	u := "ws://" + addr + "/multica?" + url.Values{"deviceId": {id}, "deviceType": {typ}}.Encode()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	ws, res, err := websocket.DefaultDialer.DialContext(ctx, u, hdr)
	if err != nil {
		return nil, res, err
	}
	d := &Device{t: t, WS: ws, ID: id}
	t.Cleanup(func() { _ = ws.Close() })
	return d, res, nil
}

// ConnectDevice dials and reads the greeting.
func ConnectDevice(t *testing.T, m *meshtest.Mesh, id string) *Device {
	t.Helper()
	d, _, err := DialDevice(t, m.Addr, id, "client", nil)
	if err != nil {
		t.Fatalf("dial %s: %v", id, err)
	}
	g := d.Next("registered")
	p := g["payload"].(map[string]any)
	if g["from"] != m.Hub.ID() || g["to"] != id || g["uid"] != nil || p["deviceId"] != id || p["deviceType"] != "client" || p["hubDeviceId"] != m.Hub.ID() {
		t.Fatalf("greeting = %v", g)
	}
	d.Hub = m.Hub.ID()
	return d
}

// Write sends a raw text message.
func (d *Device) Write(s string) {
	d.t.Helper()
	if err := d.WS.WriteMessage(websocket.TextMessage, []byte(s)); err != nil {
		d.t.Fatalf("%s: write: %v", d.ID, err)
	}
}

// Read returns the next message, decoded.
func (d *Device) Read(timeout time.Duration) (map[string]any, error) {
	_ = d.WS.SetReadDeadline(time.Now().Add(timeout))
	_, b, err := d.WS.ReadMessage()
	if err != nil {
		return nil, err
	}
	var v map[string]any
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("not a JSON object: %s", b)
	}
	return v, nil
}

// Next returns the next message, which must have action.
func (d *Device) Next(action string) map[string]any {
	d.t.Helper()
	v, err := d.Read(10 * time.Second)
	if err != nil {
		d.t.Fatalf("%s: waiting for %q: %v", d.ID, action, err)
	}
	if v["action"] != action {
		d.t.Fatalf("%s: got %v; want action %q", d.ID, v, action)
	}
	return v
}

// NextAny returns the next message, whatever its action.
func (d *Device) NextAny() map[string]any {
	d.t.Helper()
	v, err := d.Read(10 * time.Second)
	if err != nil {
		d.t.Fatalf("%s: %v", d.ID, err)
	}
	return v
}

// Request sends a request to the hub and returns its response's payload.
func (d *Device) Request(requestID, method string, params any) map[string]any {
	d.t.Helper()
	p := map[string]any{"requestId": requestID, "method": method}
	if params != nil {
		p["params"] = params
	}
	d.Write(MustJSON(d.t, map[string]any{"id": envelope.NewID(), "uid": nil, "from": d.ID, "to": d.Hub, "action": "request", "payload": p}))
	r := d.NextAny()
	for r["action"] == "stream" { // a chat.send's events come first
		r = d.NextAny()
	}
	if r["action"] != "response" {
		d.t.Fatalf("%s: got %v; want a response", d.ID, r)
	}
	if r["from"] != d.Hub || r["to"] != d.ID {
		d.t.Fatalf("response %v: want from the hub to %s", r, d.ID)
	}
	pl := r["payload"].(map[string]any)
	if pl["requestId"] != requestID {
		d.t.Fatalf("response %v: want requestId %s", r, requestID)
	}
	return pl
}

// MulticaErrorCode returns error.code of a failed response payload ("" if
// ok), and error.meshCode.
func MulticaErrorCode(t *testing.T, p map[string]any) (code, meshCode string) {
	t.Helper()
	if p["ok"] == true {
		return "", ""
	}
	e, _ := p["error"].(map[string]any)
	if p["ok"] != false || e == nil || e["message"] == "" {
		t.Fatalf("response payload %v: want {requestId, ok: false, error: {code, message}}", p)
	}
	mc, _ := e["meshCode"].(string)
	return e["code"].(string), mc
}

// Ms is d in milliseconds (for summaries).
func Ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
