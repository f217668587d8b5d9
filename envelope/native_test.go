package envelope_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentmesh/agentmesh/envelope"
)

var allHeaders = envelope.Headers{
	TraceID: "t1", Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", Tracestate: "k=v",
	Baggage: "b=1", AuthToken: "secret", UserID: "u", TTL: 1234, Priority: "low", RetryCount: 3, CorrelationID: "wf",
}

func TestNativeFrameRoundTrip(t *testing.T) {
	req := &envelope.Request{ID: envelope.NewID(), Origin: "o", Destination: "d", Timestamp: 1718963981000, Method: "memory.query",
		Params: json.RawMessage(`{"q":"cat","n":[1,2.5,null]}`), Headers: allHeaders, Version: "1.0"}
	f, err := envelope.DecodeFrame(envelope.AppendRequestFrame(nil, 42, req), envelope.Limits{})
	if err != nil || f.Type != envelope.FrameRequest || f.Seq != 42 {
		t.Fatalf("DecodeFrame = %+v, %v", f, err)
	}
	if got := f.Request; got.ID != req.ID || got.Origin != "o" || got.Destination != "d" || got.Timestamp != req.Timestamp ||
		got.Method != req.Method || string(got.Params) != string(req.Params) || got.Headers != req.Headers || got.Version != "1.0" {
		t.Errorf("request round trip = %+v; want %+v", got, *req)
	}

	res := &envelope.Response{ID: req.ID, Origin: "agent-1", Timestamp: 5, Result: json.RawMessage(`[1,"two"]`),
		Metrics: envelope.Metrics{LatencyMs: 1.5, Retries: 2, Backend: "WebSocket", QueueTime: 0.25, ProcessingTime: 1}, Headers: envelope.Headers{TraceID: "t1"}}
	f, err = envelope.DecodeFrame(envelope.AppendResponseFrame(nil, 43, res, nil), envelope.Limits{})
	if err != nil || f.Type != envelope.FrameResponse || f.Seq != 43 || f.Err != nil {
		t.Fatalf("DecodeFrame(response) = %+v, %v", f, err)
	}
	if got := f.Response; got.ID != res.ID || got.Origin != "agent-1" || string(got.Result) != string(res.Result) || got.Metrics != res.Metrics || got.Headers != res.Headers {
		t.Errorf("response round trip = %+v; want %+v", got, *res)
	}

	e := envelope.NewError(envelope.CodeOverloaded, `queue "full"`).WithData(map[string]int{"queued": 1000}).MarkNotSent().WithAttempts(3)
	f, err = envelope.DecodeFrame(envelope.AppendResponseFrame(nil, 44, nil, e), envelope.Limits{})
	if err != nil || f.Err == nil {
		t.Fatalf("DecodeFrame(error) = %+v, %v", f, err)
	}
	if f.Err.Code != envelope.CodeOverloaded || f.Err.Message != `queue "full"` || string(f.Err.Data) != `{"queued":1000}` ||
		!f.Err.IsWire() || !f.Err.NotSent() || f.Err.Attempts() != 3 {
		t.Errorf("error round trip = %+v", f.Err)
	}
	f, err = envelope.DecodeFrame(envelope.AppendCancelFrame(nil, 45), envelope.Limits{})
	if err != nil || f.Type != envelope.FrameCancel || f.Seq != 45 {
		t.Errorf("cancel round trip = %+v, %v", f, err)
	}
	f, err = envelope.DecodeFrame(envelope.AppendGoAwayFrame(nil), envelope.Limits{})
	if err != nil || f.Type != envelope.FrameGoAway || f.Seq != 0 {
		t.Errorf("goaway round trip = %+v, %v", f, err)
	}
	if got := string(envelope.AppendGoAwayFrame(nil)); got != `{"type":"goaway"}` {
		t.Errorf("goaway frame = %s; want {\"type\":\"goaway\"}", got)
	}
	f, err = envelope.DecodeFrame([]byte(`{"type":"goaway","seq":7}`), envelope.Limits{})
	if err != nil || f.Type != envelope.FrameGoAway || f.Seq != 0 {
		t.Errorf("goaway with a seq = %+v, %v; want a goaway for the whole link (seq 0)", f, err)
	}
}

func TestNativeStringsEncodeAsJSON(t *testing.T) {
	for _, s := range []string{"plain", `quote " backslash \ slash /`, "ctl \x00\x01\x1f\n\r\t", "ünïcødé 日本 🙂", "bad \xff utf8", "sep \u2028\u2029", ""} {
		req := &envelope.Request{ID: s, Method: "m" + s, Origin: s}
		out := envelope.AppendRequestFrame(nil, 1, req)
		if !json.Valid(out) {
			t.Fatalf("frame for %q is not valid JSON: %s", s, out)
		}
		f, err := envelope.DecodeFrame(out, envelope.Limits{})
		if err != nil {
			t.Fatalf("DecodeFrame: %v", err)
		}
		want := strings.ToValidUTF8(s, "\uFFFD")
		if f.Request.ID != want || f.Request.Origin != want {
			t.Errorf("string %q came back as %q", s, f.Request.ID)
		}
	}
}

func TestNativeFrameErrors(t *testing.T) {
	cases := []struct {
		name, in string
		typ      envelope.FrameType
		seq      uint64
		field    string
	}{
		{"unknown type", `{"type":"push","seq":1}`, 0, 1, "push"},
		{"seq a string", `{"type":"req","seq":"1","method":"m"}`, envelope.FrameRequest, 0, "seq"},
		{"method a number", `{"type":"req","seq":7,"method":5}`, envelope.FrameRequest, 7, "method"},
		{"method missing", `{"type":"req","seq":7}`, envelope.FrameRequest, 7, "method"},
		{"ttl negative", `{"type":"req","seq":8,"method":"m","headers":{"ttl":-5}}`, envelope.FrameRequest, 8, "headers.ttl"},
		{"headers an array", `{"type":"req","seq":9,"method":"m","headers":[]}`, envelope.FrameRequest, 9, "headers"},
		{"error not an object", `{"type":"res","seq":3,"error":"boom"}`, envelope.FrameResponse, 3, "error"},
		{"not an object", `[1,2]`, 0, 0, "object"},
		{"stream credit zero", `{"type":"req","seq":4,"method":"m","stream":0}`, envelope.FrameRequest, 4, "stream"},
		{"stream credit a string", `{"type":"req","seq":4,"method":"m","stream":"64"}`, envelope.FrameRequest, 4, "stream"},
		{"chunk without n", `{"type":"chunk","seq":5,"data":1}`, envelope.FrameChunk, 5, "n"},
		{"chunk n negative", `{"type":"chunk","seq":5,"n":-1,"data":1}`, envelope.FrameChunk, 5, "n"},
		{"credit of nothing", `{"type":"credit","seq":6,"n":0}`, envelope.FrameCredit, 6, "n"},
		{"credit of negative bytes", `{"type":"credit","seq":6,"n":1,"bytes":-5}`, envelope.FrameCredit, 6, "bytes"},
		{"stream bytes zero", `{"type":"req","seq":4,"method":"m","stream":1,"streamBytes":0}`, envelope.FrameRequest, 4, "streamBytes"},
		{"end error not an object", `{"type":"end","seq":3,"n":2,"error":"boom"}`, envelope.FrameEnd, 3, "error"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, err := envelope.DecodeFrame([]byte(tc.in), envelope.Limits{})
			if err == nil {
				t.Fatalf("DecodeFrame(%s) accepted it", tc.in)
			}
			if err.Code != envelope.CodeInvalidRequest || !strings.Contains(err.Message, tc.field) {
				t.Errorf("error = %v; want INVALID_REQUEST naming %q", err, tc.field)
			}
			if f.Type != tc.typ || f.Seq != tc.seq {
				t.Errorf("frame kept type %v seq %d; want %v %d", f.Type, f.Seq, tc.typ, tc.seq)
			}
		})
	}
}

func TestHeadersCarrier(t *testing.T) {
	var h envelope.Headers
	for _, k := range h.Keys() {
		h.Set(k, "v-"+k)
	}
	h.Set("other", "x")
	if h.Get("traceparent") != "v-traceparent" || h.Get("tracestate") != "v-tracestate" || h.Get("baggage") != "v-baggage" || h.Get("other") != "" {
		t.Errorf("carrier = %+v", h)
	}
}

func TestEachFrameBatch(t *testing.T) {
	a := envelope.AppendRequestFrame(nil, 1, &envelope.Request{ID: "a", Method: "m.a"})
	b := envelope.AppendCancelFrame(nil, 2)
	c := envelope.AppendResponseFrame(nil, 3, &envelope.Response{ID: "c", Result: json.RawMessage(`1`)}, nil)
	batch := append(append(append(append(append(append([]byte("[ "), a...), ','), b...), ','), c...), ']')
	var seqs []uint64
	envelope.EachFrame(batch, envelope.Limits{}, func(f *envelope.Frame, err *envelope.Error) {
		if err != nil {
			t.Fatalf("frame error %v", err)
		}
		seqs = append(seqs, f.Seq)
	})
	if len(seqs) != 3 || seqs[0] != 1 || seqs[1] != 2 || seqs[2] != 3 {
		t.Errorf("batch decoded as seqs %v; want 1 2 3", seqs)
	}
	// A bad element is reported on its own; the others still decode.
	var errs, oks int
	envelope.EachFrame([]byte(`[{"type":"cancel","seq":1},{"type":"req","seq":2,"method":5},7]`), envelope.Limits{}, func(f *envelope.Frame, err *envelope.Error) {
		if err != nil {
			errs++
		} else {
			oks++
		}
	})
	if oks != 1 || errs != 2 {
		t.Errorf("mixed batch: %d ok, %d errors; want 1 and 2", oks, errs)
	}
	// A single frame still works, and the limits apply to the whole batch.
	n := 0
	envelope.EachFrame(a, envelope.Limits{}, func(f *envelope.Frame, err *envelope.Error) { n++ })
	envelope.EachFrame(batch, envelope.Limits{MaxBytes: 50}, func(f *envelope.Frame, err *envelope.Error) {
		if err == nil || err.Code != envelope.CodeInvalidRequest {
			t.Errorf("an oversized batch was not refused: %v", err)
		}
	})
	if n != 1 {
		t.Errorf("single frame decoded %d times", n)
	}
}

func TestRecoverFrameSeq(t *testing.T) {
	deep := strings.Repeat("[", 10_001) + strings.Repeat("]", 10_001)
	for _, tc := range []struct {
		head string
		typ  envelope.FrameType
		seq  uint64
		ok   bool
	}{
		{"{\"type\":\"req\",\"seq\":7,\"params\":[\"\xff\"]}", envelope.FrameRequest, 7, true},
		{`{"type":"req","seq":8,"params":` + deep + `}`, envelope.FrameRequest, 8, true},
		{` { "seq" : 9 , "type" : "res" , "result": [1,`, envelope.FrameResponse, 9, true},
		{`{"type":"req","seq":7,`, envelope.FrameRequest, 7, true},
		{`{"id":"x\"y","type":"req","seq":5}`, envelope.FrameRequest, 5, true},
		{`{"type":"req","seq":7,"seq":8}`, 0, 0, false},               // seq twice
		{`{"type":"req","type":"res","seq":7}`, 0, 0, false},          // type twice
		{`{"type":"req","s\u0065q":7,"seq":8}`, 0, 0, false},          // an escaped key could be seq
		{`{"type":"cancel","seq":7}`, 0, 0, false},                    // nothing to answer
		{`{"type":"req","seq":0}`, 0, 0, false},                       // no seq
		{`{"type":"req","seq":-1}`, 0, 0, false},                      //
		{`{"type":"req","seq":7.5}`, 0, 0, false},                     //
		{`{"type":"req","seq":"7"}`, 0, 0, false},                     //
		{`{"type":"req","params":` + deep + `,"seq":7}`, 0, 0, false}, // seq beyond the head
		{`{"type":"req"`, 0, 0, false},
		{`[{"type":"req","seq":7}]`, 0, 0, false}, // a batch
		{"\xff\xfe", 0, 0, false},
		{``, 0, 0, false},
		{`{"seq":7}`, 0, 0, false},
	} {
		typ, seq, ok := envelope.RecoverFrameSeq([]byte(tc.head))
		if typ != tc.typ || seq != tc.seq || ok != tc.ok {
			t.Errorf("RecoverFrameSeq(%.60q) = %d, %d, %v; want %d, %d, %v", tc.head, typ, seq, ok, tc.typ, tc.seq, tc.ok)
		}
	}
}

func TestStreamFramesRoundTrip(t *testing.T) {
	req := &envelope.Request{ID: "r1", Method: "echo.stream", Params: json.RawMessage(`{"n":3}`), Stream: true}
	f, err := envelope.DecodeFrame(envelope.AppendStreamRequestFrame(nil, 9, req, 64, 0), envelope.Limits{})
	if err != nil || f.Type != envelope.FrameRequest || !f.Request.Stream || f.N != 64 || f.Bytes != 0 || f.Seq != 9 {
		t.Fatalf("stream request: %+v %v", f, err)
	}
	f, err = envelope.DecodeFrame(envelope.AppendStreamRequestFrame(nil, 9, req, 64, 1<<20), envelope.Limits{})
	if err != nil || f.N != 64 || f.Bytes != 1<<20 {
		t.Fatalf("stream request with a byte window: %+v %v", f, err)
	}
	if f, _ := envelope.DecodeFrame(envelope.AppendRequestFrame(nil, 9, req), envelope.Limits{}); f.Request.Stream || f.N != 0 {
		t.Fatalf("a plain request frame decoded as a stream: %+v", f)
	}
	f, err = envelope.DecodeFrame(envelope.AppendChunkFrame(nil, 9, 3, []byte(`{"tok":"é"}`)), envelope.Limits{})
	if err != nil || f.Type != envelope.FrameChunk || f.N != 3 || string(f.Data) != `{"tok":"é"}` {
		t.Fatalf("chunk: %+v %v", f, err)
	}
	f, err = envelope.DecodeFrame(envelope.AppendChunkFrame(nil, 9, 4, nil), envelope.Limits{})
	if err != nil || string(f.Data) != "null" {
		t.Fatalf("empty chunk: %+v %v", f, err)
	}
	f, err = envelope.DecodeFrame(envelope.AppendCreditFrame(nil, 9, 32, 0), envelope.Limits{})
	if err != nil || f.Type != envelope.FrameCredit || f.N != 32 || f.Bytes != 0 {
		t.Fatalf("credit: %+v %v", f, err)
	}
	f, err = envelope.DecodeFrame(envelope.AppendCreditFrame(nil, 9, 0, 4096), envelope.Limits{})
	if err != nil || f.Type != envelope.FrameCredit || f.N != 0 || f.Bytes != 4096 {
		t.Fatalf("a grant of bytes alone: %+v %v", f, err)
	}
	f, err = envelope.DecodeFrame(envelope.AppendEndFrame(nil, 9, 4, &envelope.Response{ID: "r1", Result: json.RawMessage(`{"chunks":4}`)}, nil), envelope.Limits{})
	if err != nil || f.Type != envelope.FrameEnd || f.N != 4 || f.Response.ID != "r1" || string(f.Response.Result) != `{"chunks":4}` || f.Err != nil {
		t.Fatalf("end: %+v %v", f, err)
	}
	f, err = envelope.DecodeFrame(envelope.AppendEndFrame(nil, 9, 2, nil, envelope.NewError(envelope.CodeUnavailable, "agent lost")), envelope.Limits{})
	if err != nil || f.Type != envelope.FrameEnd || f.N != 2 || f.Err == nil || f.Err.Code != envelope.CodeUnavailable {
		t.Fatalf("end with an error: %+v %v", f, err)
	}
	// A response frame's n means nothing: not read as a count.
	if f, _ := envelope.DecodeFrame([]byte(`{"type":"res","seq":1,"n":5,"result":1}`), envelope.Limits{}); f.N != 0 {
		t.Fatalf("res frame kept n=%d", f.N)
	}
}
