package testkit

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/mesh/meshtest"
)

// Test clients of the agentick surface, shared by its tests and the
// hub's tests of every dialect.

// AgentickWS is a test client of the agentick WebSocket.
type AgentickWS struct {
	T     *testing.T
	WS    *websocket.Conn
	Aside []map[string]any // events Res read before its res
}

// DialAgentick connects where the seed says, ws://host:port.
func DialAgentick(t *testing.T, m *meshtest.Mesh, hdr http.Header) (*AgentickWS, *http.Response, error) {
	return DialAgentickAt(t, "ws://"+m.Addr, hdr)
}

// DialAgentickAt connects to url.
func DialAgentickAt(t *testing.T, url string, hdr http.Header) (*AgentickWS, *http.Response, error) {
	t.Helper()
	ws, res, err := websocket.DefaultDialer.DialContext(t.Context(), url, hdr)
	if err != nil {
		return nil, res, err
	}
	c := &AgentickWS{T: t, WS: ws}
	t.Cleanup(func() { ws.Close() })
	return c, res, nil
}

// Write sends one frame.
func (c *AgentickWS) Write(frame string) {
	c.T.Helper()
	if err := c.WS.WriteMessage(websocket.TextMessage, []byte(frame)); err != nil {
		c.T.Fatalf("write %s: %v", frame, err)
	}
}

// Read returns the next frame within 10 s: first the events res set
// aside while it waited.
func (c *AgentickWS) Read() map[string]any {
	c.T.Helper()
	if len(c.Aside) > 0 {
		v := c.Aside[0]
		c.Aside = c.Aside[1:]
		return v
	}
	_ = c.WS.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, b, err := c.WS.ReadMessage()
	if err != nil {
		c.T.Fatalf("read: %v", err)
	}
	var v map[string]any
	if err := json.Unmarshal(b, &v); err != nil {
		c.T.Fatalf("frame not a JSON object: %s", b)
	}
	return v
}

// Res reads frames until the res of id and returns it. The events that
// came first (a turn's may precede its send's res) are set aside for Read.
func (c *AgentickWS) Res(id string) map[string]any {
	c.T.Helper()
	var aside []map[string]any
	defer func() { c.Aside = append(c.Aside, aside...) }()
	for {
		v := c.Read()
		if v["type"] == "res" && v["id"] == id {
			return v
		}
		if v["type"] != "event" {
			c.T.Fatalf("waiting for res %s: got %v", id, v)
		}
		aside = append(aside, v)
	}
}

// Call sends a req and returns its res.
func (c *AgentickWS) Call(id, method string, params any) map[string]any {
	c.T.Helper()
	b, _ := json.Marshal(map[string]any{"type": "req", "id": id, "method": method, "params": params})
	c.Write(string(b))
	return c.Res(id)
}

// WantAgentickErr checks that an agentick res failed with code.
func WantAgentickErr(t *testing.T, what string, res map[string]any, code string) {
	t.Helper()
	e, _ := res["error"].(map[string]any)
	if res["ok"] != false || e == nil || e["code"] != code || e["message"] == "" {
		t.Errorf("%s: %v; want ok:false, error code %s", what, res, code)
	}
}

// AgentickInvoke POSTs body to the agentick surface's /invoke (with a
// bearer token when tok is set, and the header pairs hdr) and decodes
// the answer.
func AgentickInvoke(t *testing.T, m *meshtest.Mesh, tok, body string, hdr ...string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, m.HTTP+"/invoke", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var v map[string]any
	_ = json.Unmarshal(b, &v)
	if v == nil {
		v = map[string]any{"raw": string(b)}
	}
	return res.StatusCode, v
}
