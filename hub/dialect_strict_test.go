package hub_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentmesh/agentmesh/internal/testkit"
)

// TestDialectDuplicateKeys: every edge dialect refuses, over its real
// socket, a message with a key given twice in what the hub reads (where
// the last one used to win, so that the hub and a peer reading the first
// could act on different values), with the dialect's coded error answered
// to the request when its id is unambiguous; and the connection goes on.
// The OpenAI body is also held to the hub's nesting limit, which it used
// not to be (encoding/json's own is 10,000).
func TestDialectDuplicateKeys(t *testing.T) {
	m := testkit.StartNexus3(t, nil)
	deep := strings.Repeat("[", 70) + strings.Repeat("]", 70) // past the default 64

	t.Run("agentick invoke", func(t *testing.T) {
		// Last wins would call apps (200).
		st, r := testkit.AgentickInvoke(t, m, "", `{"method":"no.such","method":"apps","params":{}}`)
		testkit.WantAgentickErr(t, "duplicate method", r, "VALIDATION_TYPE")
		if st != 400 || !strings.Contains(r["error"].(map[string]any)["message"].(string), "duplicate key") {
			t.Errorf("duplicate method: HTTP %d %v; want 400 duplicate key", st, r)
		}
		st, r = testkit.AgentickInvoke(t, m, "", `{"id":"inv-1","method":"apps","params":{"x":1},"params":{}}`)
		testkit.WantAgentickErr(t, "duplicate params", r, "VALIDATION_TYPE")
		if st != 400 || r["id"] != "inv-1" {
			t.Errorf("duplicate params: HTTP %d %v; want 400 answered to inv-1", st, r)
		}
	})

	t.Run("agentick websocket", func(t *testing.T) {
		c, _, err := testkit.DialAgentick(t, m, nil)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(`{"type":"connect","clientId":"dup"}`)
		if v := c.Read(); v["type"] != "connected" {
			t.Fatalf("connect: %v", v)
		}
		c.Write(`{"type":"req","id":"d1","method":"no.such","method":"apps","params":{}}`)
		testkit.WantAgentickErr(t, "duplicate method", c.Res("d1"), "VALIDATION_TYPE")
		// The id itself twice: no res to guess an id for, an error frame.
		c.Write(`{"type":"req","id":"d2","id":"d3","method":"apps","params":{}}`)
		if v := c.Read(); v["type"] != "error" || v["code"] != "VALIDATION_TYPE" {
			t.Errorf("duplicate id: %v; want an error frame VALIDATION_TYPE", v)
		}
		if r := c.Call("after", "apps", map[string]any{}); r["ok"] != true {
			t.Errorf("after the refusals: %v", r)
		}
	})

	t.Run("multica", func(t *testing.T) {
		a, b := testkit.ConnectDevice(t, m, "dup-a"), testkit.ConnectDevice(t, m, "dup-b")
		// Routed by the last "to" (the hub) while a peer reading the first
		// would see a message for dup-b.
		a.Write(`{"id":"m1","uid":"u1","from":"dup-a","to":"dup-b","to":"` + a.Hub + `","action":"request","payload":{"requestId":"r1","method":"mesh.ping"}}`)
		e := a.Next("error")
		p := e["payload"].(map[string]any)
		if p["code"] != "INVALID_PARAMS" || p["messageId"] != "m1" || e["uid"] != "u1" || !strings.Contains(p["message"].(string), "duplicate key") {
			t.Errorf("duplicate to: %v; want error INVALID_PARAMS for m1, uid u1", e)
		}
		// In a request to the hub: answered to its requestId.
		a.Write(`{"id":"m2","to":"` + a.Hub + `","action":"request","payload":{"requestId":"r2","method":"no.such","method":"mesh.ping"}}`)
		r := a.Next("response")
		if code, _ := testkit.MulticaErrorCode(t, r["payload"].(map[string]any)); code != "INVALID_PARAMS" || r["payload"].(map[string]any)["requestId"] != "r2" {
			t.Errorf("duplicate method: %v; want response INVALID_PARAMS to r2", r)
		}
		a.Write(`{"id":"m3","to":"` + a.Hub + `","action":"request","payload":{"requestId":"r3","method":"mesh.ping","meta":{"ttl":5000,"ttl":1}}}`)
		r = a.Next("response")
		if code, _ := testkit.MulticaErrorCode(t, r["payload"].(map[string]any)); code != "INVALID_PARAMS" {
			t.Errorf("duplicate meta.ttl: %v; want response INVALID_PARAMS", r)
		}
		a.Write(`{"id":"m4","to":"` + a.Hub + `","action":"message","payload":{"agentId":"nobody","content":"hi","content":"ho"}}`)
		if e := a.Next("error"); e["payload"].(map[string]any)["code"] != "INVALID_PARAMS" || !strings.Contains(e["payload"].(map[string]any)["message"].(string), "duplicate key") {
			t.Errorf("duplicate content: %v; want error INVALID_PARAMS, duplicate key", e)
		}
		// Routing still works, and dup-b got none of the above.
		a.Write(`{"id":"m5","to":"dup-b","action":"chat","payload":{"text":"hi","text":"twice, routed as sent"}}`)
		if g := b.Next("chat"); g["id"] != "m5" {
			t.Errorf("dup-b got %v; want m5", g)
		}
	})

	t.Run("openai", func(t *testing.T) {
		check := func(what, body, wantCode string) {
			t.Helper()
			status, _, b := testkit.OpenAIPost(t, m.HTTP, "", body)
			var e struct {
				Error struct{ Message, Type, Code string } `json:"error"`
			}
			_ = json.Unmarshal(b, &e)
			t.Logf("%s: HTTP %d %s/%s: %s", what, status, e.Error.Type, e.Error.Code, e.Error.Message)
			if status != 400 || e.Error.Type != "invalid_request_error" || e.Error.Code != wantCode || e.Error.Message == "" {
				t.Errorf("%s: HTTP %d %s; want 400 invalid_request_error %s", what, status, b, wantCode)
			}
		}
		// Last wins would ask for an unknown model (404), or refuse an
		// assistant's last message.
		check("duplicate model", `{"model":"agentmesh-chat","model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`, "invalid_request")
		check("duplicate role", `{"model":"agentmesh-chat","messages":[{"role":"user","role":"assistant","content":"hi"}]}`, "invalid_request")
		check("duplicate text", `{"model":"agentmesh-chat","messages":[{"role":"user","content":[{"type":"text","text":"a","text":"b"}]}]}`, "invalid_request")
		check("nested past the limit", `{"model":"agentmesh-chat","metadata":`+deep+`,"messages":[{"role":"user","content":"hi"}]}`, "invalid_request")
		check("invalid UTF-8", "{\"model\":\"agentmesh-chat\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}", "invalid_request")
	})
}
