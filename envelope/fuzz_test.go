package envelope_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/testkit"
)

var fuzzLimits = testkit.FuzzLimits

func seedsJSONRPC(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc": "2.0", "method": "subtract", "params": [42, 23], "id": 1}`,
		`{"jsonrpc": "2.0", "method": "subtract", "params": {"subtrahend": 23, "minuend": 42}, "id": 3}`,
		`{"jsonrpc": "2.0", "method": "update", "params": [1,2,3,4,5]}`,
		`{"jsonrpc": "2.0", "method": "foobar, "params": "bar", "baz]`,
		`{"jsonrpc": "2.0", "method": 1, "params": "bar"}`,
		`[]`, `[1]`, `[1,2,3]`,
		`[{"jsonrpc": "2.0", "method": "sum", "params": [1,2,4], "id": "1"},{"foo": "boo"},{"jsonrpc": "2.0", "method": "get_data", "id": "9"}]`,
		`{"jsonrpc":"2.0","method":"m","id":12345678901234567890,"meta":{"ttl":5,"traceparent":"x","priority":"low"}}`,
		`{"jsonrpc":"2.0","method":"m","method":"n","id":null}`,
		`{"jsonrpc":"2.0","meth\u006fd":"m","id":"\ud83d\ude00"}`,
		strings.Repeat("[", 20) + strings.Repeat("]", 20),
	} {
		f.Add([]byte(s))
	}
}

func FuzzDecodeJSONRPC(f *testing.F) {
	seedsJSONRPC(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		calls, _, err := envelope.DecodeJSONRPC(data, fuzzLimits)
		testkit.CheckLimits(t, data, err)
		// The readers' precheck refuses exactly what the decoder refuses
		// as a whole (S26: refused in the read buffer, never copied).
		if pre := envelope.PrecheckJSONRPC(data, fuzzLimits); (pre == nil) != (err == nil) || (pre != nil && pre.Code != err.Code) {
			t.Fatalf("precheck %v, decoder %v for %q", pre, err, data)
		}
		// What the readers decode after their precheck is what
		// DecodeJSONRPC decodes.
		if err == nil {
			if checked, _ := envelope.DecodeCheckedJSONRPC(data); !reflect.DeepEqual(checked, calls) {
				t.Fatalf("DecodeCheckedJSONRPC %+v, DecodeJSONRPC %+v for %q", checked, calls, data)
			}
		}
		for _, c := range calls {
			if c.Err != nil {
				if c.Notification {
					t.Fatalf("an invalid request marked as a notification: %q", data)
				}
				if out := envelope.AppendJSONRPCError(nil, c.ID, c.Err); !json.Valid(out) {
					t.Fatalf("error reply is not JSON: %s", out)
				}
				continue
			}
			// Re-encode and decode again: the same request comes back.
			var id json.RawMessage
			if !c.Notification {
				id = c.ID
			}
			out := envelope.AppendJSONRPCRequest(nil, id, &c.Request)
			if !json.Valid(out) {
				t.Fatalf("re-encoded request is not JSON: %s", out)
			}
			back, _, err := envelope.DecodeJSONRPC(out, envelope.Limits{})
			if err != nil || len(back) != 1 || back[0].Err != nil {
				t.Fatalf("re-encoded %s does not decode: %v %v", out, err, back)
			}
			b := back[0]
			if b.Request.Method != c.Request.Method || string(b.Request.Params) != string(c.Request.Params) ||
				b.Request.Headers != c.Request.Headers || string(b.ID) != string(id) || b.Notification != c.Notification {
				t.Fatalf("round trip changed the request: %+v -> %+v", c, b)
			}
			if out := envelope.AppendJSONRPCResult(nil, c.ID, c.Request.Params); !json.Valid(out) {
				t.Fatalf("result reply is not JSON: %s", out)
			}
		}
	})
}

func FuzzDecodeFrame(f *testing.F) {
	req := &envelope.Request{ID: "i", Method: "m", Params: json.RawMessage(`{"a":[1,2]}`), Headers: allHeaders}
	f.Add(envelope.AppendRequestFrame(nil, 1, req))
	f.Add(envelope.AppendResponseFrame(nil, 2, &envelope.Response{ID: "i", Result: json.RawMessage(`"r"`)}, nil))
	f.Add(envelope.AppendResponseFrame(nil, 3, nil, envelope.NewError(envelope.CodeTimeout, "t").MarkNotSent()))
	f.Add(envelope.AppendCancelFrame(nil, 4))
	f.Add(envelope.AppendGoAwayFrame(nil))
	f.Add([]byte(`[{"type":"res","seq":5,"result":1},{"type":"goaway","seq":9}]`))
	f.Add([]byte(`{"type":"req","seq":-1,"method":"m"}`))
	f.Add([]byte(`{"type":"res","seq":1,"error":{"code":-32601,"message":"x"}}`))
	f.Add([]byte(`[{"type":"cancel","seq":1},{"type":"req","seq":2,"method":"m"}]`))
	f.Add([]byte("{\"type\":\"req\",\"seq\":7,\"method\":\"m\",\"params\":[\"\xff\"]}"))
	f.Add([]byte(`{"seq":8,"type":"res","result":[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]}`))
	f.Add([]byte(`{"type":"req","seq":9,"seq":10,"method":"m"`))
	f.Add([]byte(`{"type":"req","s\u0065q":9,"seq":11}`))
	f.Add(envelope.AppendStreamRequestFrame(nil, 12, req, 64, 1<<20))
	f.Add(envelope.AppendChunkFrame(nil, 12, 1, []byte(`{"tok":"a"}`)))
	f.Add(envelope.AppendCreditFrame(nil, 12, 32, 65536))
	f.Add(envelope.AppendEndFrame(nil, 12, 1, &envelope.Response{ID: "i"}, nil))
	f.Add(envelope.AppendEndFrame(nil, 12, 7, nil, envelope.NewError(envelope.CodeUnavailable, "lost")))
	f.Add([]byte(`[{"type":"chunk","seq":3,"n":0},{"type":"credit","seq":3,"n":-1},{"type":"req","seq":4,"method":"m","stream":0}]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		envelope.EachFrame(data, fuzzLimits, func(*envelope.Frame, *envelope.Error) {}) // must not panic
		fr, err := envelope.DecodeFrame(data, fuzzLimits)
		testkit.CheckLimits(t, data, err)
		// The precheck of native messages refuses what the limits refuse
		// (an array may nest one deeper: it is a batch).
		if pre, chk := envelope.PrecheckFrames(data, fuzzLimits), fuzzLimits.Check(data); (pre == nil) != (chk == nil) && !(pre == nil && chk.Code == envelope.CodeInvalidRequest) {
			t.Fatalf("precheck %v, limits %v for %q", pre, chk, data)
		}
		// A prechecked message decodes to the same frames and errors
		// with EachCheckedFrame (no second scan) as with EachFrame.
		if envelope.PrecheckFrames(data, fuzzLimits) == nil {
			type res struct {
				f envelope.Frame
				e *envelope.Error
			}
			var a, b []res
			envelope.EachFrame(data, fuzzLimits, func(f *envelope.Frame, e *envelope.Error) { a = append(a, res{*f, e}) })
			envelope.EachCheckedFrame(data, new(envelope.Frame), func(f *envelope.Frame, e *envelope.Error) { b = append(b, res{*f, e}) })
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("EachFrame %+v, EachCheckedFrame %+v for %q", a, b, data)
			}
		}
		// A seq recovered from a frame is the seq the decoder reads
		// (no differential between the lenient and the strict reading).
		rtyp, rseq, rok := envelope.RecoverFrameSeq(data)
		if rok && (rseq == 0 || (rtyp != envelope.FrameRequest && rtyp != envelope.FrameResponse)) {
			t.Fatalf("recovered type %d seq %d from %q", rtyp, rseq, data)
		}
		if rok && err == nil && (fr.Type != rtyp || fr.Seq != rseq) {
			t.Fatalf("recovered type %d seq %d; decoded %d %d from %q", rtyp, rseq, fr.Type, fr.Seq, data)
		}
		if err != nil {
			return
		}
		var out []byte
		switch fr.Type {
		case envelope.FrameRequest:
			out = envelope.AppendRequestFrame(nil, fr.Seq, &fr.Request)
			if fr.Request.Stream {
				out = envelope.AppendStreamRequestFrame(nil, fr.Seq, &fr.Request, fr.N, fr.Bytes)
			}
		case envelope.FrameChunk:
			out = envelope.AppendChunkFrame(nil, fr.Seq, fr.N, fr.Data)
		case envelope.FrameCredit:
			out = envelope.AppendCreditFrame(nil, fr.Seq, fr.N, fr.Bytes)
		case envelope.FrameEnd:
			out = envelope.AppendEndFrame(nil, fr.Seq, fr.N, &fr.Response, fr.Err)
		case envelope.FrameResponse:
			out = envelope.AppendResponseFrame(nil, fr.Seq, &fr.Response, fr.Err)
		case envelope.FrameCancel:
			out = envelope.AppendCancelFrame(nil, fr.Seq)
		case envelope.FrameGoAway:
			out = envelope.AppendGoAwayFrame(nil)
		}
		if !json.Valid(out) {
			t.Fatalf("re-encoded frame is not JSON: %s", out)
		}
		back, err := envelope.DecodeFrame(out, envelope.Limits{})
		if err != nil || back.Type != fr.Type || back.Seq != fr.Seq || back.N != fr.N || back.Bytes != fr.Bytes {
			t.Fatalf("re-encoded %s: %+v, %v", out, back, err)
		}
		switch fr.Type {
		case envelope.FrameRequest:
			if back.Request.Method != fr.Request.Method || back.Request.Headers != fr.Request.Headers || string(back.Request.Params) != string(fr.Request.Params) || back.Request.Stream != fr.Request.Stream {
				t.Fatalf("request changed: %+v -> %+v", fr.Request, back.Request)
			}
		case envelope.FrameChunk:
			if string(back.Data) != string(fr.Data) {
				t.Fatalf("chunk data changed: %s -> %s", fr.Data, back.Data)
			}
		case envelope.FrameResponse, envelope.FrameEnd:
			if (back.Err == nil) != (fr.Err == nil) || (fr.Err != nil && (back.Err.Code != fr.Err.Code || back.Err.Message != fr.Err.Message)) {
				t.Fatalf("error changed: %+v -> %+v", fr.Err, back.Err)
			}
		}
	})
}

func FuzzDecodeJSONRPCResponse(f *testing.F) {
	f.Add([]byte(`{"jsonrpc":"2.0","result":19,"id":1}`))
	f.Add([]byte(`{"jsonrpc":"2.0","error":{"code":-32601,"message":"Method not found","data":{"code":"METHOD_NOT_FOUND","detail":"d","notSent":true,"attempts":2}},"id":"1"}`))
	f.Add([]byte(`{"jsonrpc":"2.0","error":{"code":1e400,"message":5},"id":null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		rep, err := envelope.DecodeJSONRPCResponse(data, fuzzLimits)
		testkit.CheckLimits(t, data, err)
		if err == nil && rep.Err != nil {
			if !rep.Err.IsWire() || rep.Err.Code == envelope.CodeOK {
				t.Fatalf("decoded error %+v is not a coded wire error", rep.Err)
			}
			out := envelope.AppendJSONRPCError(nil, rep.ID, rep.Err)
			back, err := envelope.DecodeJSONRPCResponse(out, envelope.Limits{})
			// An empty message goes out as the standard one or the code's name.
			msgOK := rep.Err.Message == "" || back.Err != nil && back.Err.Message == rep.Err.Message
			if err != nil || back.Err == nil || back.Err.Code != rep.Err.Code || !msgOK {
				t.Fatalf("error round trip %s: %+v, %v", out, back.Err, err)
			}
		}
	})
}

var benchFrame = envelope.AppendRequestFrame(nil, 7, &envelope.Request{
	ID: envelope.NewID(), Origin: "client", Method: "echo.echo", Timestamp: 1718963981000, Version: "1.0",
	Params:  json.RawMessage(`{"data":"` + strings.Repeat("x", 117) + `"}`),
	Headers: envelope.Headers{TTL: 10000, Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
})

func BenchmarkDecodeFrame(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(int64(len(benchFrame)))
	for b.Loop() {
		if _, err := envelope.DecodeFrame(benchFrame, envelope.Limits{}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendRequestFrame(b *testing.B) {
	f, _ := envelope.DecodeFrame(benchFrame, envelope.Limits{})
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		buf = envelope.AppendRequestFrame(buf[:0], 7, &f.Request)
	}
}

func BenchmarkDecodeJSONRPC(b *testing.B) {
	msg := []byte(`{"jsonrpc":"2.0","id":1,"method":"echo.echo","params":{"data":"` + strings.Repeat("x", 117) + `"}}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(msg)))
	for b.Loop() {
		if _, _, err := envelope.DecodeJSONRPC(msg, envelope.Limits{}); err != nil {
			b.Fatal(err)
		}
	}
}
