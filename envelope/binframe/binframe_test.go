package binframe_test

import (
	"encoding/binary"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/envelope/binframe"
	"github.com/agentmesh/agentmesh/internal/testkit"
)

// sampleFrames are the same frames in v1 (JSON) and v2 (binary), every
// field of every type set somewhere.
func sampleFrames() (v1, v2 [][]byte) {
	req := &envelope.Request{ID: "id-1", Origin: "meshctl", Destination: "inst-7", Timestamp: 1700000000123,
		Method: "echo.echo", Params: json.RawMessage(`{"a":[1,2,{"b":"ü"}]}`), Headers: allHeaders, Version: "1.0"}
	res := &envelope.Response{ID: "id-1", Origin: "inst-7", Timestamp: 1700000000456, Result: json.RawMessage(`{"ok":true}`),
		Metrics: envelope.Metrics{LatencyMs: 1.25, Retries: 2, Backend: "WebSocket", QueueTime: 0.5, ProcessingTime: 0.75},
		Headers: envelope.Headers{Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}}
	fail := envelope.WireError(envelope.CodeTimeout, "too slow", json.RawMessage(`{"after":"5s"}`)).MarkNotSent().WithAttempts(3)
	add := func(a, b []byte) { v1, v2 = append(v1, a), append(v2, b) }
	add(envelope.AppendRequestFrame(nil, 1, req), binframe.AppendRequest(nil, 1, req))
	add(envelope.AppendRequestFrame(nil, 2, &envelope.Request{Method: "m"}), binframe.AppendRequest(nil, 2, &envelope.Request{Method: "m"}))
	add(envelope.AppendStreamRequestFrame(nil, 3, req, 64, 1<<20), binframe.AppendStreamRequest(nil, 3, req, 64, 1<<20))
	add(envelope.AppendResponseFrame(nil, 4, res, nil), binframe.AppendResponse(nil, 4, res, nil))
	add(envelope.AppendResponseFrame(nil, 5, res, fail), binframe.AppendResponse(nil, 5, res, fail))
	add(envelope.AppendEndFrame(nil, 6, 9, res, nil), binframe.AppendEnd(nil, 6, 9, res, nil))
	add(envelope.AppendEndFrame(nil, 7, 2, nil, envelope.NewError(envelope.CodeUnavailable, "lost")),
		binframe.AppendEnd(nil, 7, 2, nil, envelope.NewError(envelope.CodeUnavailable, "lost")))
	add(envelope.AppendChunkFrame(nil, 8, 1, []byte(`{"tok":"a"}`)), binframe.AppendChunk(nil, 8, 1, []byte(`{"tok":"a"}`)))
	add(envelope.AppendChunkFrame(nil, 8, 2, nil), binframe.AppendChunk(nil, 8, 2, nil))
	add(envelope.AppendCreditFrame(nil, 8, 32, 65536), binframe.AppendCredit(nil, 8, 32, 65536))
	add(envelope.AppendCreditFrame(nil, 8, 0, 10), binframe.AppendCredit(nil, 8, 0, 10))
	add(envelope.AppendCancelFrame(nil, 9), binframe.AppendCancel(nil, 9))
	add(envelope.AppendGoAwayFrame(nil), binframe.AppendGoAway(nil))
	return v1, v2
}

type decoded struct {
	f envelope.Frame
	e *envelope.Error
}

func eachV2(t testing.TB, msg []byte, check bool) []decoded {
	t.Helper()
	if err := binframe.Precheck(msg, envelope.Limits{}); err != nil {
		t.Fatalf("precheck refused %x: %v", msg, err)
	}
	var out []decoded
	binframe.Each(msg, envelope.Limits{}, check, new(envelope.Frame), func(f *envelope.Frame, e *envelope.Error) {
		out = append(out, decoded{*f, e})
	})
	return out
}

// TestBinaryFramesMatchJSON: every frame decodes from its binary form to
// what the JSON decoder makes of its JSON form, alone and in one batch.
func TestBinaryFramesMatchJSON(t *testing.T) {
	v1, v2 := sampleFrames()
	var batch []byte
	for i := range v1 {
		want, err := envelope.DecodeFrame(v1[i], envelope.Limits{})
		if err != nil {
			t.Fatalf("frame %d: v1 does not decode: %v", i, err)
		}
		got := eachV2(t, v2[i], true)
		if len(got) != 1 || got[0].e != nil {
			t.Fatalf("frame %d: v2 decoded to %+v", i, got)
		}
		if want.Type == envelope.FrameResponse || want.Type == envelope.FrameEnd {
			if string(want.Response.Result) == "null" { // v1 writes null for no result, v2 nothing
				want.Response.Result = nil
			}
		}
		if !reflect.DeepEqual(got[0].f, want) {
			t.Errorf("frame %d:\n v2 %+v\n v1 %+v", i, got[0].f, want)
		}
		if len(v2[i]) >= len(v1[i]) {
			t.Errorf("frame %d: binary %d bytes, JSON %d", i, len(v2[i]), len(v1[i]))
		}
		batch = append(batch, v2[i]...)
	}
	if got := eachV2(t, batch, true); len(got) != len(v1) {
		t.Fatalf("a batch of %d frames decoded to %d", len(v1), len(got))
	}
}

// TestBinaryFrameErrors: a bad field is a coded error naming it, with
// the frame's type and seq kept (so the receiver answers the request);
// an unknown field is skipped; a message that does not tile into frames
// is refused whole.
func TestBinaryFrameErrors(t *testing.T) {
	frame := func(fields ...[]byte) []byte {
		var body []byte
		for _, f := range fields {
			body = append(body, f...)
		}
		return binary.BigEndian.AppendUint32(nil, uint32(len(body))) // + body
	}
	build := func(fields ...[]byte) []byte {
		var body []byte
		for _, f := range fields {
			body = append(body, f...)
		}
		return append(frame(fields...), body...)
	}
	v := func(num protowire.Number, x uint64) []byte {
		return protowire.AppendVarint(protowire.AppendTag(nil, num, protowire.VarintType), x)
	}
	s := func(num protowire.Number, x string) []byte {
		return protowire.AppendString(protowire.AppendTag(nil, num, protowire.BytesType), x)
	}
	hdr := func(fields ...[]byte) []byte {
		var body []byte
		for _, f := range fields {
			body = append(body, f...)
		}
		return protowire.AppendBytes(protowire.AppendTag(nil, 14, protowire.BytesType), body)
	}
	req, seq := v(1, 1), v(2, 42)
	for _, c := range []struct {
		name string
		msg  []byte
		want string // in the error; "" = valid
	}{
		{"valid", build(req, seq, s(10, "m")), ""},
		{"unknown field skipped", build(req, seq, s(10, "m"), s(99, "future"), v(100, 7)), ""},
		{"no method", build(req, seq), "method is missing"},
		{"method not UTF-8", build(req, seq, s(10, "m\xff")), "method is not valid UTF-8"},
		{"method as varint", build(req, seq, v(10, 1)), "method has the wrong wire type"},
		{"ttl too large", build(req, seq, s(10, "m"), hdr(v(7, 1<<60))), "headers.ttl"},
		{"bad priority", build(req, seq, s(10, "m"), hdr(s(8, "urgent"))), "headers.priority"},
		{"hops too many", build(req, seq, s(10, "m"), hdr(v(12, 17))), "headers.hops"},
		{"params not JSON", build(req, seq, s(10, "m"), s(12, `{"a":`)), "params: message is not valid JSON"},
		{"params too deep", build(req, seq, s(10, "m"), s(12, strings.Repeat("[", 70)+strings.Repeat("]", 70))), "nesting"},
		{"stream without credit", build(req, seq, s(10, "m"), v(17, 1)), "initial credit"},
		{"unknown type", build(v(1, 77), seq), "unknown frame type 77"},
		{"type twice", build(req, seq, s(10, "m"), v(1, uint64(envelope.FrameGoAway))), "type is given twice"},
		{"seq twice", build(req, seq, s(10, "m"), v(2, 43)), "seq is given twice"},
		{"truncated field", append(frame(req, seq, []byte{0x52, 0x10, 'x'}), append(append(req, seq...), 0x52, 0x10, 'x')...), "malformed"},
		{"chunk without n", build(v(1, uint64(envelope.FrameChunk)), seq), "chunk's n"},
		{"credit of nothing", build(v(1, uint64(envelope.FrameCredit)), seq), "at least 1 chunk"},
	} {
		got := eachV2(t, c.msg, true)
		if len(got) != 1 {
			t.Fatalf("%s: %d frames", c.name, len(got))
		}
		if c.want == "" {
			if got[0].e != nil {
				t.Errorf("%s: %v", c.name, got[0].e)
			}
			continue
		}
		code := envelope.CodeInvalidRequest
		if c.name == "params not JSON" {
			code = envelope.CodeParseError // as a v1 message that is not JSON
		}
		if got[0].e == nil || got[0].e.Code != code || !strings.Contains(got[0].e.Message, c.want) {
			t.Errorf("%s: error %v, want %v with %q", c.name, got[0].e, code, c.want)
		}
		if got[0].f.Seq != 42 && !strings.Contains(c.name, "truncated") {
			t.Errorf("%s: seq %d lost", c.name, got[0].f.Seq)
		}
	}
	for _, bad := range [][]byte{nil, {0, 0, 0}, {0, 0, 0, 0}, {0, 0, 0, 9, 1, 2}, append(build(req, seq, s(10, "m")), 0, 0)} {
		if binframe.Precheck(bad, envelope.Limits{}) == nil {
			t.Errorf("precheck took %x", bad)
		}
	}
	if binframe.Precheck(build(req, seq, s(12, strings.Repeat("x", 100))), envelope.Limits{MaxBytes: 64}) == nil {
		t.Error("precheck took a message over the byte limit")
	}
	// Unchecked (a hub forwarding between binary links): the body is
	// left as it came.
	var f envelope.Frame
	binframe.Each(build(req, seq, s(10, "m"), s(12, `{"a":`)), envelope.Limits{}, false, &f, func(g *envelope.Frame, e *envelope.Error) {
		if e != nil || string(g.Request.Params) != `{"a":` {
			t.Errorf("unchecked: %v, params %q", e, g.Request.Params)
		}
		if e := binframe.CheckBody("params", g.Request.Params, envelope.Limits{}); e == nil {
			t.Error("CheckBody took invalid JSON")
		}
	})
	if typ, seq, ok := binframe.RecoverFrameSeq(build(req, seq, s(10, "m\xff"))); !ok || typ != envelope.FrameRequest || seq != 42 {
		t.Errorf("recovered %d %d %v", typ, seq, ok)
	}
}

var fuzzLimits = testkit.FuzzLimits

var allHeaders = envelope.Headers{TraceID: "t", Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", Tracestate: "k=v", Baggage: "b=1",
	AuthToken: "tok", UserID: "u", TTL: 2500, Priority: envelope.PriorityHigh, RetryCount: 2, CorrelationID: "c", Hops: 1, IdempotencyKey: "key"}

func FuzzDecodeBinaryFrame(f *testing.F) {
	_, v2 := sampleFrames()
	var batch []byte
	for _, b := range v2 {
		f.Add(b)
		batch = append(batch, b...)
	}
	f.Add(batch)
	f.Fuzz(func(t *testing.T, data []byte) {
		if binframe.Precheck(data, fuzzLimits) != nil {
			return
		}
		rtyp, rseq, rok := binframe.RecoverFrameSeq(data)
		first := true
		binframe.Each(data, fuzzLimits, true, new(envelope.Frame), func(fr *envelope.Frame, err *envelope.Error) {
			if first && rok && err == nil && (fr.Type != rtyp || fr.Seq != rseq) {
				t.Fatalf("recovered type %d seq %d; decoded %d %d from %x", rtyp, rseq, fr.Type, fr.Seq, data)
			}
			first = false
			if err != nil {
				if err.Code != envelope.CodeInvalidRequest && err.Code != envelope.CodeParseError {
					t.Fatalf("code %v for %x", err.Code, data)
				}
				return
			}
			// A valid frame re-encodes, in binary and in JSON, to the same
			// frame.
			out, js := reencode(fr)
			want := *fr
			if want.Type == envelope.FrameRequest && want.Request.Version == "" {
				want.Request.Version = envelope.Version // the encoders write the version
			}
			var back envelope.Frame
			n := 0
			binframe.Each(out, fuzzLimits, true, &back, func(b *envelope.Frame, e *envelope.Error) {
				n++
				if e != nil || !reflect.DeepEqual(*b, want) {
					t.Fatalf("re-encoded %x: %+v, %v; was %+v", out, *b, e, want)
				}
			})
			if n != 1 {
				t.Fatalf("re-encoded to %d frames", n)
			}
			if !json.Valid(js) {
				t.Fatalf("as JSON: %s", js)
			}
		})
	})
}

func reencode(fr *envelope.Frame) (v2, v1 []byte) {
	switch fr.Type {
	case envelope.FrameRequest:
		if fr.Request.Stream {
			return binframe.AppendStreamRequest(nil, fr.Seq, &fr.Request, fr.N, fr.Bytes), envelope.AppendStreamRequestFrame(nil, fr.Seq, &fr.Request, fr.N, fr.Bytes)
		}
		return binframe.AppendRequest(nil, fr.Seq, &fr.Request), envelope.AppendRequestFrame(nil, fr.Seq, &fr.Request)
	case envelope.FrameChunk:
		return binframe.AppendChunk(nil, fr.Seq, fr.N, fr.Data), envelope.AppendChunkFrame(nil, fr.Seq, fr.N, fr.Data)
	case envelope.FrameCredit:
		return binframe.AppendCredit(nil, fr.Seq, fr.N, fr.Bytes), envelope.AppendCreditFrame(nil, fr.Seq, fr.N, fr.Bytes)
	case envelope.FrameEnd:
		return binframe.AppendEnd(nil, fr.Seq, fr.N, &fr.Response, fr.Err), envelope.AppendEndFrame(nil, fr.Seq, fr.N, &fr.Response, fr.Err)
	case envelope.FrameResponse:
		return binframe.AppendResponse(nil, fr.Seq, &fr.Response, fr.Err), envelope.AppendResponseFrame(nil, fr.Seq, &fr.Response, fr.Err)
	case envelope.FrameCancel:
		return binframe.AppendCancel(nil, fr.Seq), envelope.AppendCancelFrame(nil, fr.Seq)
	}
	return binframe.AppendGoAway(nil), envelope.AppendGoAwayFrame(nil)
}
