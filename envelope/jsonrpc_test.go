package envelope_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentmesh/agentmesh/envelope"
)

func decodeOne(t *testing.T, in string) envelope.RPCCall {
	t.Helper()
	calls, batch, err := envelope.DecodeJSONRPC([]byte(in), envelope.Limits{})
	if err != nil || batch || len(calls) != 1 {
		t.Fatalf("DecodeJSONRPC(%s) = %v, batch %v, %v", in, calls, batch, err)
	}
	return calls[0]
}

func TestJSONRPCIDsAreByteExact(t *testing.T) {
	for _, id := range []string{`1`, `"abc"`, `null`, `12345678901234567890123`, `-0.5e10`, `"\u00e9"`} {
		c := decodeOne(t, `{"jsonrpc":"2.0","method":"m","id":`+id+`}`)
		if string(c.ID) != id || c.Notification || c.Err != nil {
			t.Errorf("id %s decoded as %s (notification %v, err %v)", id, c.ID, c.Notification, c.Err)
		}
		out := envelope.AppendJSONRPCResult(nil, c.ID, json.RawMessage(`true`))
		if want := `{"jsonrpc":"2.0","result":true,"id":` + id + `}`; string(out) != want {
			t.Errorf("reply = %s; want %s", out, want)
		}
	}
}

func TestJSONRPCRequestValidation(t *testing.T) {
	deep := strings.Repeat("[", 64) + strings.Repeat("]", 64)
	cases := []struct {
		name   string
		in     string
		code   envelope.Code // CodeOK: valid
		notif  bool
		nullID bool
	}{
		{"valid", `{"jsonrpc":"2.0","method":"m","params":{"a":1},"id":1}`, envelope.CodeOK, false, false},
		{"notification", `{"jsonrpc":"2.0","method":"m"}`, envelope.CodeOK, true, false},
		{"no version", `{"method":"m","id":1}`, envelope.CodeInvalidRequest, false, false},
		{"version 1.0", `{"jsonrpc":"1.0","method":"m","id":1}`, envelope.CodeInvalidRequest, false, false},
		{"version a number", `{"jsonrpc":2.0,"method":"m","id":1}`, envelope.CodeInvalidRequest, false, false},
		{"method missing", `{"jsonrpc":"2.0","id":1}`, envelope.CodeInvalidRequest, false, false},
		{"method upper case key", `{"jsonrpc":"2.0","METHOD":"m","id":1}`, envelope.CodeInvalidRequest, false, false},
		{"duplicate method", `{"jsonrpc":"2.0","method":"a","method":"b","id":1}`, envelope.CodeInvalidRequest, false, false},
		{"id an object", `{"jsonrpc":"2.0","method":"m","id":{}}`, envelope.CodeInvalidRequest, false, true},
		{"id a bool", `{"jsonrpc":"2.0","method":"m","id":true}`, envelope.CodeInvalidRequest, false, true},
		{"params a number", `{"jsonrpc":"2.0","method":"m","params":3,"id":1}`, envelope.CodeInvalidRequest, false, false},
		{"invalid without id answered", `{"jsonrpc":"2.0","method":1}`, envelope.CodeInvalidRequest, false, true},
		{"meta ttl", `{"jsonrpc":"2.0","method":"m","id":1,"meta":{"ttl":1500,"traceparent":"00-x","priority":"high"}}`, envelope.CodeOK, false, false},
		{"meta ttl negative", `{"jsonrpc":"2.0","method":"m","id":1,"meta":{"ttl":-1}}`, envelope.CodeInvalidRequest, false, false},
		{"meta ttl a string", `{"jsonrpc":"2.0","method":"m","id":1,"meta":{"ttl":"1s"}}`, envelope.CodeInvalidRequest, false, false},
		{"meta ttl too long", `{"jsonrpc":"2.0","method":"m","id":1,"meta":{"ttl":86400001}}`, envelope.CodeInvalidRequest, false, false},
		{"meta priority unknown", `{"jsonrpc":"2.0","method":"m","id":1,"meta":{"priority":"urgent"}}`, envelope.CodeInvalidRequest, false, false},
		{"meta not an object", `{"jsonrpc":"2.0","method":"m","id":1,"meta":[]}`, envelope.CodeInvalidRequest, false, false},
		{"depth at the limit", `{"jsonrpc":"2.0","method":"m","id":1,"params":` + deep[1:len(deep)-1] + `}`, envelope.CodeOK, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := decodeOne(t, tc.in)
			if got := envelope.CodeOf(errOrNil(c.Err)); got != tc.code {
				t.Fatalf("DecodeJSONRPC(%s) code = %s (%v); want %s", tc.in, got, c.Err, tc.code)
			}
			if c.Notification != tc.notif {
				t.Errorf("notification = %v; want %v", c.Notification, tc.notif)
			}
			if tc.nullID && string(c.ID) != "null" {
				t.Errorf("id = %s; want null", c.ID)
			}
			if c.Err != nil && c.Err.Message == "" {
				t.Error("error without a message")
			}
		})
	}
	c := decodeOne(t, `{"jsonrpc":"2.0","method":"m","id":1,"meta":{"ttl":1500,"traceparent":"00-x","priority":"high","destination":"a1","correlationId":"w"}}`)
	if h := c.Request.Headers; h.TTL != 1500 || h.Traceparent != "00-x" || h.Priority != "high" || h.CorrelationID != "w" || c.Request.Destination != "a1" {
		t.Errorf("meta decoded as %+v, destination %q", h, c.Request.Destination)
	}
}

func errOrNil(e *envelope.Error) error {
	if e == nil {
		return nil
	}
	return e
}

func TestJSONRPCLimits(t *testing.T) {
	lim := envelope.Limits{MaxBytes: 1024, MaxDepth: 8}
	cases := []struct{ name, in string }{
		{"too big", `{"jsonrpc":"2.0","method":"m","params":["` + strings.Repeat("x", 2000) + `"]}`},
		{"too deep", `{"jsonrpc":"2.0","method":"m","params":` + strings.Repeat("[", 9) + strings.Repeat("]", 9) + `}`},
		{"10,000 deep", strings.Repeat("[", 10000) + strings.Repeat("]", 10000)},
		{"empty batch", `[]`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := lim
			if tc.name == "10,000 deep" {
				l = envelope.Limits{}
			}
			_, _, err := envelope.DecodeJSONRPC([]byte(tc.in), l)
			if err == nil || err.Code != envelope.CodeInvalidRequest || err.Message == "" {
				t.Errorf("DecodeJSONRPC = %v; want INVALID_REQUEST with a message", err)
			}
		})
	}
	big := "[" + strings.Repeat(`1,`, envelope.DefaultMaxBatch) + "1]"
	if _, _, err := envelope.DecodeJSONRPC([]byte(big), envelope.Limits{}); err == nil {
		t.Error("a batch over DefaultMaxBatch was accepted")
	}
}

// TestJSONRPCBatchLimit: a batch of DefaultMaxBatch calls is decoded, one
// more is refused, elements nested inside a call do not count, and the
// refusal comes at the first element too many: what follows it is not
// scanned (a batch of 100,000 is refused after a thousand elements).
func TestJSONRPCBatchLimit(t *testing.T) {
	call := `{"jsonrpc":"2.0","method":"m","params":[` + strings.Repeat("0,", 2*envelope.DefaultMaxBatch) + `0],"id":1}`
	batch := func(n int, tail string) []byte {
		return []byte("[" + strings.Repeat(call+",", n-1) + call + tail)
	}
	lim := envelope.Limits{MaxBytes: 64 << 20}
	calls, isBatch, err := envelope.DecodeJSONRPC(batch(envelope.DefaultMaxBatch, "]"), lim)
	if err != nil || !isBatch || len(calls) != envelope.DefaultMaxBatch {
		t.Fatalf("a batch of the maximum: %d calls, batch %v, err %v", len(calls), isBatch, err)
	}
	for _, c := range calls {
		if c.Err != nil {
			t.Fatalf("call refused: %v", c.Err)
		}
	}
	for _, tc := range []struct {
		name string
		in   []byte
	}{
		{"one over", batch(envelope.DefaultMaxBatch+1, "]")},
		{"one over, then broken JSON", batch(envelope.DefaultMaxBatch+1, `,{"unterminated`)},
		{"one over, then nesting past the limit", batch(envelope.DefaultMaxBatch+1, ","+strings.Repeat("[", 100)+"]")},
	} {
		_, _, err := envelope.DecodeJSONRPC(tc.in, lim)
		if err == nil || err.Code != envelope.CodeInvalidRequest || !strings.Contains(err.Message, "batch exceeds the limit of 1000") {
			t.Errorf("%s: %v; want INVALID_REQUEST, batch over the limit", tc.name, err)
		}
		if pre := envelope.PrecheckJSONRPC(tc.in, lim); pre == nil || pre.Code != err.Code {
			t.Errorf("%s: precheck %v, decoder %v", tc.name, pre, err)
		}
	}
	if _, _, err := envelope.DecodeJSONRPC([]byte(" [ ] "), lim); err == nil || err.Code != envelope.CodeInvalidRequest || err.Message != "empty batch" {
		t.Errorf("empty batch: %v", err)
	}
	if _, _, err := envelope.DecodeJSONRPC([]byte(`{"jsonrpc":"2.0","method":"m"`), envelope.Limits{}); err == nil || err.Code != envelope.CodeParseError {
		t.Errorf("truncated JSON: %v; want PARSE_ERROR", err)
	}
}

func TestJSONRPCErrorEncoding(t *testing.T) {
	out := envelope.AppendJSONRPCError(nil, json.RawMessage(`7`), envelope.NewError(envelope.CodeMethodNotFound, `no agent serves "x"`))
	var r struct {
		ID    int `json:"id"`
		Error struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
			Data    struct {
				Code       string `json:"code"`
				HTTPStatus int    `json:"httpStatus"`
				Retryable  bool   `json:"retryable"`
				Detail     string `json:"detail"`
			} `json:"data"`
		} `json:"error"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	if r.ID != 7 || r.Error.Code != -32601 || r.Error.Message != "Method not found" || r.Error.Data.Code != "METHOD_NOT_FOUND" ||
		r.Error.Data.HTTPStatus != 404 || r.Error.Data.Detail != `no agent serves "x"` {
		t.Errorf("encoded error = %s", out)
	}
	// A mesh code keeps its own message.
	out = envelope.AppendJSONRPCError(nil, nil, envelope.NewError(envelope.CodeTimeout, "deadline exceeded").MarkNotSent())
	rep, derr := envelope.DecodeJSONRPCResponse(out, envelope.Limits{})
	if derr != nil || rep.Err == nil || rep.Err.Code != envelope.CodeTimeout || rep.Err.Message != "deadline exceeded" || !rep.Err.IsWire() || !rep.Err.NotSent() {
		t.Errorf("round trip of %s = %+v, %v", out, rep.Err, derr)
	}
}

func TestDecodeJSONRPCResponse(t *testing.T) {
	cases := []struct {
		name, in string
		code     envelope.Code
		msg      string
		result   string
	}{
		{"result", `{"jsonrpc":"2.0","result":{"a":1},"id":1}`, envelope.CodeOK, "", `{"a":1}`},
		{"null result", `{"jsonrpc":"2.0","result":null,"id":1}`, envelope.CodeOK, "", `null`},
		{"mesh error", `{"jsonrpc":"2.0","error":{"code":-32601,"message":"Method not found","data":{"code":"METHOD_NOT_FOUND","detail":"no agent serves x"}},"id":1}`, envelope.CodeMethodNotFound, "no agent serves x", ""},
		{"foreign error", `{"jsonrpc":"2.0","error":{"code":42,"message":"nope"},"id":1}`, envelope.CodeRPCError, "nope", ""},
		{"standard error", `{"jsonrpc":"2.0","error":{"code":-32602,"message":"Invalid params"},"id":1}`, envelope.CodeInvalidParams, "Invalid params", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := envelope.DecodeJSONRPCResponse([]byte(tc.in), envelope.Limits{})
			if err != nil {
				t.Fatal(err)
			}
			if tc.code == envelope.CodeOK {
				if rep.Err != nil || string(rep.Result) != tc.result {
					t.Errorf("= %s, %v; want %s", rep.Result, rep.Err, tc.result)
				}
				return
			}
			if rep.Err == nil || rep.Err.Code != tc.code || rep.Err.Message != tc.msg {
				t.Errorf("error = %v; want %s %q", rep.Err, tc.code, tc.msg)
			}
		})
	}
	if _, err := envelope.DecodeJSONRPCResponse([]byte(`{"jsonrpc":"2.0","id":1}`), envelope.Limits{}); err == nil {
		t.Error("a response with neither result nor error was accepted")
	}
}

func TestJSONRPCRequestRoundTrip(t *testing.T) {
	r := &envelope.Request{ID: "req-1", Method: "memory.get", Params: json.RawMessage(`{"key":"k"}`), Destination: "a1",
		Headers: envelope.Headers{TTL: 2500, Traceparent: "00-abc-def-01", Priority: "critical", RetryCount: 2, AuthToken: "t"}}
	out := envelope.AppendJSONRPCRequest(nil, json.RawMessage(`"x"`), r)
	c := decodeOne(t, string(out))
	if c.Err != nil || string(c.ID) != `"x"` || c.Request.Method != r.Method || string(c.Request.Params) != string(r.Params) ||
		c.Request.Headers != r.Headers || c.Request.Destination != "a1" || c.Request.ID != "req-1" {
		t.Errorf("round trip of %s = %+v", out, c)
	}
}
