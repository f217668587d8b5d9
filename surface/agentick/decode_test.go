package agentick_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/surface/agentick"
)

func TestAgentickFrameStrict(t *testing.T) {
	for _, tc := range []struct {
		name     string
		data     string
		invoke   bool
		code     envelope.Code // CodeOK: accepted
		missing  bool
		typ, id  string // the frame returned (also on a refusal)
		method   string
		clientID string
	}{
		{"req", `{"type":"req","id":"a","method":"m","params":{}}`, false, envelope.CodeOK, false, "req", "a", "m", ""},
		{"keys are exact", `{"type":"req","id":"a","method":"m","Method":"n","METHOD":"o"}`, false, envelope.CodeOK, false, "req", "a", "m", ""},
		{"duplicate method", `{"type":"req","id":"a","method":"m","method":"n"}`, false, envelope.CodeInvalidRequest, false, "req", "a", "", ""},
		{"duplicate params", `{"type":"req","id":"a","method":"m","params":{},"params":{"x":1}}`, false, envelope.CodeInvalidRequest, false, "req", "a", "", ""},
		{"duplicate id: no id to answer", `{"type":"req","id":"a","id":"b","method":"m"}`, false, envelope.CodeInvalidRequest, false, "req", "", "", ""},
		{"duplicate type", `{"type":"ping","type":"req","id":"a","method":"m"}`, false, envelope.CodeInvalidRequest, false, "", "", "", ""},
		{"duplicate by escape", `{"type":"req","id":"a","method":"m","\u006dethod":"n"}`, false, envelope.CodeInvalidRequest, false, "", "", "", ""},
		{"duplicate clientId", `{"type":"connect","clientId":"a","clientId":"b"}`, false, envelope.CodeInvalidRequest, false, "", "", "", ""},
		{"duplicate in invoke body", `{"method":"apps","method":"send"}`, true, envelope.CodeInvalidRequest, false, "req", "", "", ""},
		{"duplicate inside params: theirs", `{"type":"req","id":"a","method":"m","params":{"x":1,"x":2}}`, false, envelope.CodeOK, false, "req", "a", "m", ""},
		{"depth at the limit", `{"type":"req","id":"a","method":"m","params":{"x":` + testkit.Nest(6) + `}}`, false, envelope.CodeOK, false, "req", "a", "m", ""},
		{"depth past the limit", `{"type":"req","id":"a","method":"m","params":{"x":` + testkit.Nest(7) + `}}`, false, envelope.CodeInvalidRequest, false, "req", "a", "", ""},
		{"broken JSON", `{"type":"req","id":"a","method":`, false, envelope.CodeParseError, false, "req", "a", "", ""},
		{"invalid UTF-8", "{\"type\":\"req\",\"id\":\"a\",\"method\":\"m\",\"params\":{\"x\":\"\xff\"}}", false, envelope.CodeParseError, false, "req", "a", "", ""},
		{"over the size limit", `{"type":"req","id":"a","method":"m","params":{"x":"` + strings.Repeat("x", 1024) + `"}}`, false, envelope.CodeInvalidRequest, false, "", "", "", ""},
		{"not an object", `["req"]`, false, envelope.CodeInvalidRequest, false, "", "", "", ""},
		{"no method", `{"type":"req","id":"a"}`, false, envelope.CodeInvalidRequest, true, "req", "a", "", ""},
		{"null method", `{"type":"req","id":"a","method":null}`, false, envelope.CodeInvalidRequest, true, "req", "a", "", ""},
		{"no type", `{"id":"a","method":"m"}`, false, envelope.CodeInvalidRequest, true, "", "", "", ""},
		{"id a number", `{"type":"req","id":5,"method":"m"}`, false, envelope.CodeInvalidRequest, false, "req", "", "", ""},
		{"params an array", `{"type":"req","id":"a","method":"m","params":[1]}`, false, envelope.CodeInvalidRequest, false, "req", "a", "m", ""},
		{"control character", `{"type":"connect","clientId":"a\u0001"}`, false, envelope.CodeInvalidRequest, false, "connect", "", "", ""},
		{"connect", `{"type":"connect","clientId":"c"}`, false, envelope.CodeOK, false, "connect", "", "", "c"},
		{"invoke", `{"method":"apps","clientId":"c"}`, true, envelope.CodeOK, false, "req", "", "apps", "c"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := agentick.DecodeFrame([]byte(tc.data), testkit.DialectLimits, tc.invoke)
			switch {
			case tc.code == envelope.CodeOK && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.code != envelope.CodeOK && (err == nil || err.Code != tc.code || err.Message == ""):
				t.Fatalf("err = %v; want %s", err, tc.code)
			case err != nil && errors.Is(err, envelope.ErrMissing) != tc.missing:
				t.Fatalf("err = %v: missing %v; want %v", err, !tc.missing, tc.missing)
			}
			if f.Type != tc.typ || f.ID != tc.id || f.Method != tc.method || f.ClientID != tc.clientID {
				t.Errorf("frame %+v; want type %q id %q method %q clientId %q", f, tc.typ, tc.id, tc.method, tc.clientID)
			}
			if err != nil && strings.HasPrefix(tc.name, "duplicate") && !strings.Contains(err.Message, "duplicate key") {
				t.Errorf("err = %v; want it to name the duplicate key", err)
			}
		})
	}
}

// Fuzzagentick.DecodeFrame: agentick.DecodeFrame never panics, refuses
// with INVALID_REQUEST or PARSE_ERROR (the limits' codes as every
// decoder), refuses a top-level key given twice, and on every other
// clean input decides as the encoding/json decoder it replaced
// (refAgentickFrame) and reads the same frame.
func FuzzDecodeFrame(f *testing.F) {
	for _, s := range []string{
		`{ "type": "connect", "clientId": "my-client" }`,
		`{ "type": "req", "id": "req-1", "method": "schema", "params": {} }`,
		`{"type":"req","id":"x","method":"send","params":{"sessionId":"main","message":"hi"}}`,
		`{"type":"ping","timestamp":1}`, `{"type":"ping","timestamp":null}`,
		`{"method":"apps","clientId":"c"}`, `{"type":"req","id":"","method":"m"}`,
		`{"type":"req","id":"1","method":"m","params":[1]}`,
		`{"type":"req","id":"a","method":"m","method":"n"}`, `{"type":"req","id":"a","\u0069d":"b","method":"m"}`,
		`[[[[[]]]]]`, `"x"`, `null`, `{"type":7}`, `{"type":"connect","clientId":"a\u0000b"}`,
		`{"type":"req","id":"deep","method":"m","params":{"a":` + testkit.Nest(20) + `}}`,
		`{"type":"connect","clientId":"` + strings.Repeat("c", 128) + `"}`, `{"type":"connect","clientId":"` + strings.Repeat("c", 129) + `"}`,
		`{"type":"req","id":"` + strings.Repeat("i", 256) + `","method":"m"}`, `{"type":"req","id":"` + strings.Repeat("i", 257) + `","method":"m"}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, data []byte, invoke bool) {
		fr, err := agentick.DecodeFrame(data, testkit.FuzzLimits, invoke)
		if err != nil {
			if (err.Code != envelope.CodeInvalidRequest && err.Code != envelope.CodeParseError) || err.Message == "" {
				t.Fatalf("refusal %v: want INVALID_REQUEST or PARSE_ERROR with a message", err)
			}
			testkit.CheckLimits(t, data, err)
			if fr.ID != "" && fr.Type != "req" {
				t.Fatalf("refused frame %+v answers an id but is no req", fr)
			}
		}
		if !testkit.CleanInput(data) {
			return
		}
		keys, isObj := testkit.TopKeys(data)
		if isObj && testkit.HasDup(keys) {
			if err == nil || err.Code != envelope.CodeInvalidRequest {
				t.Fatalf("%q: a key given twice: err = %v; want INVALID_REQUEST", data, err)
			}
			return
		}
		want, missing, ok := refAgentickFrame(data, invoke)
		if ok != (err == nil) || (err != nil && errors.Is(err, envelope.ErrMissing) != missing) {
			t.Fatalf("%q (invoke %v): err = %v; the reference: ok %v, missing %v", data, invoke, err, ok, missing)
		}
		if ok && (fr.Type != want.Type || fr.ID != want.ID || fr.Method != want.Method || fr.ClientID != want.ClientID ||
			!bytes.Equal(fr.Params, want.Params) || !bytes.Equal(fr.Stamp, want.Stamp)) {
			t.Fatalf("%q: %+v; the reference read %+v", data, fr, want)
		}
	})
}

// refAgentickFrame is the encoding/json decoder of agentick frames that
// agentick.DecodeFrame replaced (mesh's decodeAgentickFrame before [M10]),
// for clean input (valid, within the limits): the frame, and whether it
// was accepted or else refused for a required member.
func refAgentickFrame(data []byte, invoke bool) (f agentick.Frame, missing, ok bool) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil || m == nil {
		return f, false, false
	}
	type refusal struct{ missing bool }
	str := func(k string, required bool, maxLen int) (string, *refusal) {
		raw, ok := m[k]
		if !ok || string(raw) == "null" {
			if required {
				return "", &refusal{true}
			}
			return "", nil
		}
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return "", &refusal{false}
		}
		if required && s == "" {
			return "", &refusal{true}
		}
		if len(s) > maxLen || !bytes.Equal(bytes.ToValidUTF8([]byte(s), nil), []byte(s)) || strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return "", &refusal{false}
		}
		return s, nil
	}
	var e *refusal
	fail := func() (agentick.Frame, bool, bool) { return f, e.missing, false }
	if f.Type, e = str("type", !invoke, 32); e != nil {
		return fail()
	}
	if invoke && f.Type == "" {
		f.Type = "req"
	}
	switch f.Type {
	case "connect":
		if f.ClientID, e = str("clientId", true, 128); e != nil {
			return fail()
		}
		return f, false, true
	case "ping":
		f.Stamp = m["timestamp"]
		return f, false, true
	case "req":
	default:
		return f, false, false
	}
	if f.ID, e = str("id", !invoke, 256); e != nil {
		return fail()
	}
	if invoke {
		if f.ClientID, e = str("clientId", false, 128); e != nil {
			return fail()
		}
	}
	if f.Method, e = str("method", true, 256); e != nil {
		return fail()
	}
	if p, ok := m["params"]; ok && string(p) != "null" {
		if p = bytes.TrimSpace(p); len(p) == 0 || p[0] != '{' {
			return f, false, false
		}
		f.Params = p
	}
	return f, false, true
}
