package multica

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/agentmesh/agentmesh/envelope"
)

// FuzzMulticaDecode feeds the Multica surface's decoders arbitrary
// messages: they never panic, refuse with a coded error, and what they
// accept re-encodes (appendMultica, what a receiving device gets) into one
// JSON object of exactly the six RoutedMessage fields that decodes to the
// same message; a request payload accepted names a method and a requestId.
// (It is an internal test: the decoders are unexported, and the socket
// tests of multica_test.go need package mesh_test.)
func FuzzMulticaDecode(f *testing.F) {
	for _, s := range []string{
		`{"id":"019abc12-0000-7000-8000-0000000000aa","uid":null,"from":"my-client","to":"hub","action":"request","payload":{"requestId":"r1","method":"getAgentMessages","params":{"agentId":"019abc12-3def-7000-8000-000000000001","offset":0,"limit":10}}}`,
		`{"id":"m","uid":"u","from":"a","to":"b","action":"chat","payload":{"text":"hi"}}`,
		`{"id":"m","to":"hub","action":"request","payload":{"requestId":"r","method":"chat.send","params":{"agentId":"x","content":"hi"},"meta":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","ttl":5000}}}`,
		`{"id":"m","to":"hub","action":"request","payload":{"requestId":"r","method":"x","params":"abc"}}`,
		`{"id":"m","to":"hub","action":"message","payload":{"agentId":"a","content":"hello"}}`,
		`{"ID":"x","To":"y","TO":"z","to":"b","action":"a","to":"c"}`,
		`{"id":5,"to":"b","action":"a"}`,
		`{"id":"m","uid":7,"to":"b","action":"a"}`,
		`[1,2,3]`, `"str"`, `null`, `{`, `{"to":"\u0000","action":"\ud800"}`,
		`{"to":"b","action":"a","payload":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}`,
	} {
		f.Add([]byte(s))
	}
	lim := envelope.Limits{MaxBytes: 64 << 10, MaxDepth: 32}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := decodeMultica(data, lim)
		if err != nil {
			if err.Code != envelope.CodeParseError && err.Code != envelope.CodeInvalidParams && err.Code != envelope.CodeInvalidRequest {
				t.Fatalf("decodeMultica(%q): code %v; want PARSE_ERROR, INVALID_PARAMS or INVALID_REQUEST", data, err.Code)
			}
			if multicaError(err).Code != "INVALID_PARAMS" {
				t.Fatalf("decode error %v answered as %s", err, multicaError(err).Code)
			}
			return
		}
		if m.To == "" || m.Action == "" || m.ID == "" {
			t.Fatalf("decodeMultica(%q) = %+v: accepted without to, action or id", data, m)
		}
		out := appendMultica(nil, &multicaWire{ID: m.ID, UID: m.UID, From: m.From, To: m.To, Action: m.Action, Payload: m.Payload})
		var keys map[string]json.RawMessage
		if e := json.Unmarshal(out, &keys); e != nil || len(keys) != 6 || !utf8.Valid(out) {
			t.Fatalf("re-encoded %q as %q (%v): want one object of six fields", data, out, e)
		}
		again, err := decodeMultica(out, lim)
		if err != nil {
			t.Fatalf("re-encoded %q does not decode: %v", out, err)
		}
		if len(m.Payload) == 0 {
			m.Payload = json.RawMessage("null")
		}
		if !reflect.DeepEqual(again, m) {
			t.Fatalf("round trip of %q: %+v, then %+v", data, m, again)
		}
		if m.Action != "request" {
			return
		}
		rp, rerr := decodeMulticaRequest(m.Payload, lim)
		if rerr != nil {
			if rp != nil && rp.requestID != "" && requestIDOf(m.Payload) != rp.requestID {
				t.Fatalf("requestId %q answered, but the payload's is %q", rp.requestID, requestIDOf(m.Payload))
			}
			return
		}
		if rp.requestID == "" || rp.req == nil || rp.req.Method == "" || rp.req.Headers.Hops != 0 {
			t.Fatalf("decodeMulticaRequest(%s) = %+v: accepted without a requestId or method, or with hops", m.Payload, rp)
		}
	})
}
