package envelope_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/testkit"
)

// The dialect decoders' contract: one pass with the scanner of the native
// frames, a key given twice refused as INVALID_REQUEST, the Limits as on
// every other ingress, precise codes. Seeds: agentick-gateway-protocol,
// multica-hub-rpc, multica-client-streaming (field names).

func TestMulticaMessageStrict(t *testing.T) {
	for _, tc := range []struct {
		name    string
		data    string
		code    envelope.Code
		id, uid string // the message returned (also on a refusal)
		to      string
	}{
		{"routed", `{"id":"m","uid":"u","from":"a","to":"b","action":"chat","payload":{"x":1}}`, envelope.CodeOK, "m", `"u"`, "b"},
		{"keys are exact", `{"id":"m","to":"b","To":"c","TO":"d","action":"a"}`, envelope.CodeOK, "m", "", "b"},
		{"duplicate to", `{"id":"m","uid":"u","to":"b","to":"hub","action":"a"}`, envelope.CodeInvalidRequest, "m", `"u"`, ""},
		{"duplicate action", `{"id":"m","to":"b","action":"a","action":"request"}`, envelope.CodeInvalidRequest, "m", "", ""},
		{"duplicate id: no id to answer", `{"id":"m","id":"n","to":"b","action":"a"}`, envelope.CodeInvalidRequest, "", "", ""},
		{"duplicate payload", `{"id":"m","to":"b","action":"a","payload":1,"payload":2}`, envelope.CodeInvalidRequest, "m", "", ""},
		{"duplicate inside payload: routed as sent", `{"id":"m","to":"b","action":"a","payload":{"x":1,"x":2}}`, envelope.CodeOK, "m", "", "b"},
		{"depth at the limit", `{"id":"m","to":"b","action":"a","payload":` + testkit.Nest(7) + `}`, envelope.CodeOK, "m", "", "b"},
		{"depth past the limit", `{"id":"m","to":"b","action":"a","payload":` + testkit.Nest(8) + `}`, envelope.CodeInvalidRequest, "", "", ""},
		{"invalid UTF-8", "{\"id\":\"m\",\"to\":\"b\",\"action\":\"a\",\"payload\":\"\xff\"}", envelope.CodeParseError, "", "", ""},
		{"not JSON", `{"id":`, envelope.CodeParseError, "", "", ""},
		{"not an object", `[1]`, envelope.CodeInvalidRequest, "", "", ""},
		{"to missing", `{"id":"m","action":"a"}`, envelope.CodeInvalidParams, "m", "", ""},
		{"to a number", `{"id":"m","to":5,"action":"a"}`, envelope.CodeInvalidParams, "m", "", ""},
		{"uid a number", `{"id":"m","uid":5,"to":"b","action":"a"}`, envelope.CodeInvalidParams, "m", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := envelope.DecodeMulticaMessage([]byte(tc.data), testkit.DialectLimits)
			if tc.code == envelope.CodeOK {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
			} else if err == nil || err.Code != tc.code || err.Message == "" {
				t.Fatalf("err = %v; want %s", err, tc.code)
			}
			if m == nil {
				if tc.id != "" || tc.to != "" {
					t.Fatalf("no message; want id %q to %q", tc.id, tc.to)
				}
				return
			}
			if (tc.id != "" && m.ID != tc.id) || (tc.id == "" && err != nil && m.ID != "") || string(m.UID) != tc.uid || m.To != tc.to {
				t.Errorf("message %+v; want id %q uid %s to %q", m, tc.id, tc.uid, tc.to)
			}
		})
	}
}

func TestMulticaPayloadsStrict(t *testing.T) {
	for _, tc := range []struct {
		name, payload string
		code          envelope.Code
		requestID     string
	}{
		{"request", `{"requestId":"r","method":"m","params":{"a":1},"meta":{"ttl":5000,"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}`, envelope.CodeOK, "r"},
		{"duplicate method", `{"requestId":"r","method":"m","method":"n"}`, envelope.CodeInvalidRequest, "r"},
		{"duplicate requestId", `{"requestId":"r","requestId":"s","method":"m"}`, envelope.CodeInvalidRequest, ""},
		{"duplicate in meta", `{"requestId":"r","method":"m","meta":{"ttl":5000,"ttl":1}}`, envelope.CodeInvalidRequest, "r"},
		{"duplicate inside params: theirs", `{"requestId":"r","method":"m","params":{"a":1,"a":2}}`, envelope.CodeOK, "r"},
		{"no method", `{"requestId":"r"}`, envelope.CodeInvalidParams, "r"},
		{"params a string", `{"requestId":"r","method":"m","params":"x"}`, envelope.CodeInvalidParams, "r"},
		{"requestId a number", `{"requestId":5,"method":"m"}`, envelope.CodeInvalidParams, ""},
		{"not an object", `[]`, envelope.CodeInvalidParams, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rid, req, err := envelope.DecodeCheckedMulticaRequest([]byte(tc.payload))
			if tc.code == envelope.CodeOK {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if req.Method != "m" || len(req.Params) == 0 {
					t.Errorf("request %+v", req)
				}
			} else if err == nil || err.Code != tc.code {
				t.Fatalf("err = %v; want %s", err, tc.code)
			}
			if rid != tc.requestID {
				t.Errorf("requestId %q; want %q", rid, tc.requestID)
			}
			if got := envelope.MulticaRequestID([]byte(tc.payload)); (tc.code == envelope.CodeOK || tc.code == envelope.CodeInvalidParams) && got != tc.requestID {
				t.Errorf("MulticaRequestID = %q; want %q", got, tc.requestID)
			}
		})
	}
	if _, _, err := envelope.DecodeCheckedMulticaChat([]byte(`{"agentId":"a","content":"x","content":"y"}`)); err == nil || err.Code != envelope.CodeInvalidRequest {
		t.Errorf("chat payload with content twice: %v; want INVALID_REQUEST", err)
	}
	if a, c, err := envelope.DecodeCheckedMulticaChat([]byte(`{"agentId":"a","content":"x"}`)); err != nil || a != "a" || string(c) != `"x"` {
		t.Errorf("chat payload: %q %s %v", a, c, err)
	}
	if _, _, err := envelope.DecodeCheckedMulticaChat([]byte(`{"agentId":"a","content":5}`)); err == nil || err.Code != envelope.CodeInvalidParams {
		t.Errorf("chat payload with a number: %v; want INVALID_PARAMS", err)
	}
}

func TestSetCheckedMember(t *testing.T) {
	for _, tc := range []struct{ obj, want string }{
		{``, `{"agentId":"p"}`},
		{`{}`, `{"agentId":"p"}`},
		{` { "content" : "hi" , "n":[1, 2] } `, `{"content":"hi","n":[1, 2],"agentId":"p"}`},
		{`{"agentId":"other","x":1}`, `{"x":1,"agentId":"p"}`},
		{`{"a\u0062":1}`, `{"ab":1,"agentId":"p"}`},
	} {
		got, err := envelope.SetCheckedMember([]byte(tc.obj), "agentId", []byte(`"p"`))
		if err != nil || string(got) != tc.want {
			t.Errorf("SetCheckedMember(%s) = %s, %v; want %s", tc.obj, got, err, tc.want)
		}
	}
	for _, obj := range []string{`{"x":1,"x":2}`, `{"agentId":"a","agentId":"b"}`, `[1]`, `"x"`} {
		if got, err := envelope.SetCheckedMember([]byte(obj), "agentId", []byte(`"p"`)); err == nil || err.Code != envelope.CodeInvalidParams {
			t.Errorf("SetCheckedMember(%s) = %s, %v; want INVALID_PARAMS", obj, got, err)
		}
	}
}

// ---- fuzz targets: each decoder against an independent reference ----

// FuzzDecodeMulticaMessage: DecodeMulticaMessage never panics, refuses
// with a coded error (the limits' codes as every decoder), refuses a
// top-level key given twice, and on every other clean input decides as
// the encoding/json decoder it replaced and reads the same message; a
// request's payload is read by DecodeCheckedMulticaRequest as the old
// rebuild-and-decode-as-JSON-RPC path read it, when its own keys are
// each given once.
func FuzzDecodeMulticaMessage(f *testing.F) {
	for _, s := range []string{
		`{"id":"019abc12-0000-7000-8000-0000000000aa","uid":null,"from":"my-client","to":"hub","action":"request","payload":{"requestId":"r1","method":"getAgentMessages","params":{"agentId":"019abc12-3def-7000-8000-000000000001","offset":0,"limit":10}}}`,
		`{"id":"m","uid":"u","from":"a","to":"b","action":"chat","payload":{"text":"hi"}}`,
		`{"id":"m","to":"hub","action":"request","payload":{"requestId":"r","method":"chat.send","params":{"agentId":"x","content":"hi"},"meta":{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01","ttl":5000}}}`,
		`{"id":"m","to":"hub","action":"request","payload":{"requestId":"r","method":"x","params":"abc"}}`,
		`{"id":"m","to":"hub","action":"request","payload":{"requestId":"r","method":"x","method":"y"}}`,
		`{"id":"m","to":"hub","action":"message","payload":{"agentId":"a","content":"hello"}}`,
		`{"ID":"x","To":"y","TO":"z","to":"b","action":"a","to":"c"}`,
		`{"id":5,"to":"b","action":"a"}`, `{"id":"m","uid":7,"to":"b","action":"a"}`,
		`{"id":"` + strings.Repeat("i", 256) + `","to":"b","action":"a"}`, `{"id":"m","to":"` + strings.Repeat("t", 257) + `","action":"a"}`,
		`[1,2,3]`, `"str"`, `null`, `{`, `{"to":"\u0000","action":"\ud800"}`,
		`{"to":"b","action":"a","payload":` + testkit.Nest(20) + `}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := envelope.DecodeMulticaMessage(data, fuzzLimits)
		if err != nil {
			switch err.Code {
			case envelope.CodeParseError, envelope.CodeInvalidRequest, envelope.CodeInvalidParams:
			default:
				t.Fatalf("refusal %v: not a decoding code", err)
			}
			testkit.CheckLimits(t, data, err)
		} else if m.ID == "" || m.To == "" || m.Action == "" {
			t.Fatalf("%q accepted as %+v: without id, to or action", data, m)
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
		want, ok := refMultica(data)
		if ok != (err == nil) {
			t.Fatalf("%q: err = %v; the reference accepts: %v", data, err, ok)
		}
		if !ok {
			return
		}
		if (want.ID != "" && m.ID != want.ID) || !bytes.Equal(m.UID, want.UID) || m.From != want.From || m.To != want.To ||
			m.Action != want.Action || !bytes.Equal(m.Payload, want.Payload) {
			t.Fatalf("%q: %+v; the reference read %+v", data, m, want)
		}
		if len(m.Payload) == 0 {
			return
		}
		rid, req, rerr := envelope.DecodeCheckedMulticaRequest(m.Payload)
		if rerr != nil && rerr.Code != envelope.CodeInvalidParams && rerr.Code != envelope.CodeInvalidRequest {
			t.Fatalf("request payload %s: %v", m.Payload, rerr)
		}
		if rerr == nil && (rid == "" || req.Method == "") {
			t.Fatalf("request payload %s accepted without a requestId or method", m.Payload)
		}
		if pk, isObj := testkit.TopKeys(m.Payload); isObj && testkit.HasDup(pk) {
			if rerr == nil || rerr.Code != envelope.CodeInvalidRequest {
				t.Fatalf("request payload %s with a key twice: %v", m.Payload, rerr)
			}
			return
		}
		wrid, wreq, wok := refMulticaRequest(m.Payload)
		if wok != (rerr == nil) || (rerr == nil && rid != wrid) || requestIDMismatch(m.Payload, rid, rerr) {
			t.Fatalf("request payload %s: %q %v; the reference: %q ok %v", m.Payload, rid, rerr, wrid, wok)
		}
		if wok && (req.Method != wreq.Method || !bytes.Equal(req.Params, wreq.Params) || req.Headers != wreq.Headers ||
			req.ID != wreq.ID || req.Origin != wreq.Origin || req.Destination != wreq.Destination) {
			t.Fatalf("request payload %s: %+v; the reference read %+v", m.Payload, req, wreq)
		}
	})
}

// requestIDMismatch: a refusal answered to a requestId answers the
// payload's, as MulticaRequestID reads it.
func requestIDMismatch(payload []byte, rid string, err *envelope.Error) bool {
	return err != nil && rid != "" && err.Code == envelope.CodeInvalidParams && envelope.MulticaRequestID(payload) != rid
}

// refMultica is the encoding/json decoder of RoutedMessages that
// DecodeMulticaMessage replaced, for clean input.
func refMultica(data []byte) (m envelope.MulticaMessage, ok bool) {
	var raw map[string]json.RawMessage
	if json.Unmarshal(data, &raw) != nil {
		return m, false
	}
	str := func(key string, dst *string, required bool) bool {
		v, ok := raw[key]
		if !ok || string(v) == "null" {
			return !required
		}
		if json.Unmarshal(v, dst) != nil || len(*dst) > envelope.MulticaMaxID {
			return false
		}
		return !required || *dst != ""
	}
	if !str("id", &m.ID, false) {
		return m, false
	}
	if uid, ok := raw["uid"]; ok {
		var s *string
		if json.Unmarshal(uid, &s) != nil {
			return m, false
		}
		if s != nil {
			m.UID = uid
		}
	}
	if !str("from", &m.From, false) || !str("to", &m.To, true) || !str("action", &m.Action, true) {
		return m, false
	}
	m.Payload = raw["payload"]
	return m, true
}

// refMulticaRequest is the old path of a request's payload: rebuilt as a
// JSON-RPC request and decoded by DecodeJSONRPC.
func refMulticaRequest(payload []byte) (string, envelope.Request, bool) {
	var p map[string]json.RawMessage
	var none envelope.Request
	if json.Unmarshal(payload, &p) != nil || p == nil {
		return "", none, false
	}
	var rid, method string
	if v, ok := p["requestId"]; !ok || json.Unmarshal(v, &rid) != nil || rid == "" || len(rid) > envelope.MulticaMaxID {
		return "", none, false
	}
	if v, ok := p["method"]; !ok || json.Unmarshal(v, &method) != nil || method == "" {
		return rid, none, false
	}
	q, _ := json.Marshal(method)
	b := append([]byte(`{"jsonrpc":"2.0","id":0,"method":`), q...)
	if v, ok := p["params"]; ok && string(v) != "null" {
		if v[0] != '{' && v[0] != '[' {
			return rid, none, false
		}
		b = append(append(b, `,"params":`...), v...)
	}
	if v, ok := p["meta"]; ok && string(v) != "null" {
		b = append(append(b, `,"meta":`...), v...)
	}
	b = append(b, '}')
	calls, _, err := envelope.DecodeJSONRPC(b, envelope.Limits{MaxBytes: 1 << 20, MaxDepth: fuzzLimits.MaxDepth})
	if err != nil || calls[0].Err != nil {
		return rid, none, false
	}
	return rid, calls[0].Request, true
}

// FuzzSetCheckedMember: for params a decoder accepted (valid JSON within
// the limits), SetCheckedMember gives an object with the members of
// params (as encoding/json reads them) but key's, and key set to val; a
// key given twice, or params not an object, is INVALID_PARAMS.
func FuzzSetCheckedMember(f *testing.F) {
	for _, s := range []string{``, `{}`, `{"content":"hi"}`, `{"agentId":"x","a":[1,{"b":2}]}`, `{"a":1,"a":2}`, `[1]`, `"s"`, `{"\u0061gentId":1}`, ` { "x" : null } `} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, obj []byte) {
		if len(bytes.Trim(obj, " \t\r\n")) > 0 && (!testkit.CleanInput(obj)) {
			return // not what a decoder hands on
		}
		out, err := envelope.SetCheckedMember(obj, "agentId", []byte(`"p"`))
		keys, isObj := testkit.TopKeys(obj)
		if len(bytes.Trim(obj, " \t\r\n")) == 0 {
			isObj = true
		}
		if !isObj || testkit.HasDup(keys) {
			if err == nil || err.Code != envelope.CodeInvalidParams {
				t.Fatalf("%q: %s, %v; want INVALID_PARAMS", obj, out, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("%q: %v", obj, err)
		}
		var got, want map[string]json.RawMessage
		if json.Unmarshal(out, &got) != nil {
			t.Fatalf("%q gave %q: not an object", obj, out)
		}
		if len(bytes.Trim(obj, " \t\r\n")) > 0 {
			_ = json.Unmarshal(obj, &want)
		}
		if want == nil {
			want = map[string]json.RawMessage{}
		}
		want["agentId"] = json.RawMessage(`"p"`)
		if k, _ := testkit.TopKeys(out); testkit.HasDup(k) || len(got) != len(want) {
			t.Fatalf("%q gave %q; want the members %v", obj, out, want)
		}
		for k, v := range want {
			var a, b any
			_ = json.Unmarshal(v, &a)
			_ = json.Unmarshal(got[k], &b)
			if got[k] == nil || !testkit.EqualJSON(a, b) {
				t.Fatalf("%q gave %q: member %q is %s; want %s", obj, out, k, got[k], v)
			}
		}
	})
}
