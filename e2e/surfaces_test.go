package e2e_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// TestMeshdServesSurfaces: the protocol surfaces live in their own
// packages and the hub serves none of them by itself; meshd mounts them
// (surface/all). Each answers on a real meshd as its protocol does:
// OpenAI's GET /v1/models lists no model (no chat agent runs) and an
// unknown /v1 path gets OpenAI's error object; a Multica device on
// /multica is greeted "registered" by the hub; MCP's /mcp answers an
// initialize.
func TestMeshdServesSurfaces(t *testing.T) {
	t.Parallel()
	h := startHub(t)
	c := &http.Client{Timeout: 5 * time.Second}
	get := func(path string) (int, string) {
		t.Helper()
		res, err := c.Get(h.base + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}

	if code, body := get("/v1/models"); code != http.StatusOK || !jsonEq(body, `{"object":"list","data":[]}`) {
		t.Errorf("GET /v1/models: %d %s; want 200 and an empty list", code, body)
	}
	if code, body := get("/v1/nothing"); code != http.StatusNotFound || !strings.Contains(body, `"code":"unknown_url"`) {
		t.Errorf("GET /v1/nothing: %d %s; want OpenAI's 404 unknown_url", code, body)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	ws, res, err := websocket.DefaultDialer.DialContext(ctx, "ws://"+h.addr+"/multica?deviceId=e2e-dev&deviceType=client", nil)
	if err != nil {
		code := 0
		if res != nil {
			code = res.StatusCode
		}
		t.Fatalf("dial /multica: %v (HTTP %d)", err, code)
	}
	defer ws.Close()
	_ = ws.SetReadDeadline(time.Now().Add(5 * time.Second))
	var greet struct {
		Action  string            `json:"action"`
		To      string            `json:"to"`
		Payload map[string]string `json:"payload"`
	}
	if err := ws.ReadJSON(&greet); err != nil || greet.Action != "registered" || greet.To != "e2e-dev" || greet.Payload["deviceId"] != "e2e-dev" || greet.Payload["hubDeviceId"] == "" {
		t.Errorf("Multica greeting: %+v (%v); want registered, to e2e-dev", greet, err)
	}

	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"e2e","version":"1"}}}`
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, h.base+"/mcp", strings.NewReader(init))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	mres, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST /mcp: %v", err)
	}
	defer mres.Body.Close()
	b, _ := io.ReadAll(mres.Body)
	if mres.StatusCode != http.StatusOK || !strings.Contains(string(b), `"serverInfo"`) {
		t.Errorf("POST /mcp initialize: %d %s; want 200 with the server's info", mres.StatusCode, b)
	}
}
