package agentick

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
)

func init() {
	// SSE keep-alive comments every 200 ms, so that tests see them.
	agentickKeepAlive = 200 * time.Millisecond
	// An SSE client whose stream ended is kept 2 s (not 30): the tests
	// that wait for a client's goroutines to end wait that long, and those
	// that resume do so at once. The grace period's own tests run under
	// synctest (resume_internal_test.go).
	agentickResumeGrace = 2 * time.Second
}

// FuzzAgentickFrame: the frame decoder never panics, and a frame it
// accepts has what its type needs (a req: an id, a method, params that
// are an object or absent; a connect: a clientId).
func FuzzAgentickFrame(f *testing.F) {
	for _, s := range []string{
		`{ "type": "connect", "clientId": "my-client" }`,
		`{ "type": "req", "id": "req-1", "method": "schema", "params": {} }`,
		`{"type":"req","id":"x","method":"send","params":{"sessionId":"main","message":"hi"}}`,
		`{"type":"ping","timestamp":1}`,
		`{"method":"apps","clientId":"c"}`,
		`{"type":"req","id":"","method":"m"}`,
		`{"type":"req","id":"1","method":"m","params":[1]}`,
		`[[[[[]]]]]`, `"x"`, `null`, `{"type":7}`, `{"type":"connect","clientId":"a\u0000b"}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	lim := envelope.Limits{MaxBytes: 4096, MaxDepth: 8}
	f.Fuzz(func(t *testing.T, data []byte, invoke bool) {
		fr, e := decodeAgentickFrame(data, lim, invoke)
		if fr == nil {
			t.Fatal("nil frame")
		}
		if e != nil {
			if _, ok := agentickErrors[e.Code]; !ok || e.Message == "" {
				t.Fatalf("error %+v: not a seed code with a message", e)
			}
			return
		}
		switch fr.Type {
		case "connect":
			if fr.ClientID == "" || len(fr.ClientID) > 128 {
				t.Fatalf("connect accepted with clientId %q", fr.ClientID)
			}
		case "req":
			if fr.Method == "" || (!invoke && fr.ID == "") {
				t.Fatalf("req accepted without id or method: %+v", fr)
			}
			if fr.Params != nil {
				var m map[string]json.RawMessage
				if json.Unmarshal(fr.Params, &m) != nil {
					t.Fatalf("params %s accepted: not an object", fr.Params)
				}
			}
		case "ping":
		default:
			t.Fatalf("type %q accepted", fr.Type)
		}
		if len(data) > lim.MaxBytes || depthOf(data) > lim.MaxDepth {
			t.Fatalf("frame past the limits accepted")
		}
		b := agentickRes(fr.ID, nil, e)
		if !json.Valid(b) {
			t.Fatalf("res not JSON: %s", b)
		}
	})
}

// depthOf is an independent count of the deepest nesting of arrays and
// objects in data (valid JSON), the fuzz test's oracle for the limit.
func depthOf(data []byte) int {
	depth, deepest, inStr, esc := 0, 0, false, false
	for _, c := range data {
		switch {
		case esc:
			esc = false
		case inStr && c == '\\':
			esc = true
		case c == '"':
			inStr = !inStr
		case inStr:
		case c == '{' || c == '[':
			depth++
			deepest = max(deepest, depth)
		case c == '}' || c == ']':
			depth--
		}
	}
	return deepest
}
