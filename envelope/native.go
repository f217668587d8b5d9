package envelope

import (
	"encoding/json"
	"math"
	"strconv"
)

// Subprotocol is the WebSocket subprotocol of the native envelope frames.
const Subprotocol = "agentmesh.v1"

// FrameType tells the native frames apart.
type FrameType uint8

// The native frame types. A frame's "seq" is link-scoped: it pairs a
// response (or a cancel) with the request it answers on that link only.
const (
	FrameRequest  FrameType = iota + 1 // {"type":"req", ...RequestEnvelope}
	FrameResponse                      // {"type":"res", ...ResponseEnvelope, "error"?}
	FrameCancel                        // {"type":"cancel","seq":N}: the caller gave up
	// FrameGoAway is {"type":"goaway"}: the sender (a draining hub) takes no
	// new requests on this link. Calls already sent still get their
	// answers; the receiver should move new calls, and an agent its
	// registration, to another hub now, then close the link once nothing
	// is pending on it.
	FrameGoAway
	// Streams (a request frame with "stream":C, C its initial credit in
	// chunks; see stream.go): the callee sends its chunks in order, then
	// an end, and the caller grants more chunks as it consumes them.
	FrameChunk  // {"type":"chunk","seq":N,"n":K,"data":<JSON>}: the stream's K-th chunk, from 1
	FrameCredit // {"type":"credit","seq":N,"n":C,"bytes":B}: the caller grants C more chunks and B more bytes (either may be 0)
	// FrameEnd is the stream's last frame, a response frame ("res"
	// members: the result or the error, metrics, headers) of type "end"
	// whose "n" is the number of chunks sent.
	FrameEnd
)

// Frame is one decoded native frame.
type Frame struct {
	Type FrameType
	Seq  uint64
	// N is a chunk's sequence number, a credit frame's grant, an end's
	// count of chunks sent, and a stream request's initial credit.
	N uint64
	// Bytes is a credit frame's grant of bytes, and a stream request's
	// byte window ("streamBytes"; 0: the stream has none).
	Bytes    uint64
	Data     []byte   // a chunk's data (raw JSON)
	Request  Request  // for FrameRequest
	Response Response // for FrameResponse (envelope fields also on errors)
	Err      *Error   // for FrameResponse carrying an error
}

// AppendRequestFrame appends the native request frame for r.
func AppendRequestFrame(b []byte, seq uint64, r *Request) []byte {
	b = append(b, `{"type":"req","seq":`...)
	b = strconv.AppendUint(b, seq, 10)
	b = append(b, `,"id":`...)
	b = appendString(b, r.ID)
	if r.Origin != "" {
		b = append(b, `,"origin":`...)
		b = appendString(b, r.Origin)
	}
	if r.Destination != "" {
		b = append(b, `,"destination":`...)
		b = appendString(b, r.Destination)
	}
	if r.Timestamp != 0 {
		b = append(b, `,"timestamp":`...)
		b = strconv.AppendInt(b, r.Timestamp, 10)
	}
	b = append(b, `,"method":`...)
	b = appendString(b, r.Method)
	if len(r.Params) > 0 {
		b = append(b, `,"params":`...)
		b = append(b, r.Params...)
	}
	b = append(b, `,"headers":`...)
	b = appendHeaders(b, &r.Headers)
	b = append(b, `,"version":`...)
	b = appendString(b, orVersion(r.Version))
	return append(b, '}')
}

// AppendStreamRequestFrame appends the native request frame for the
// streaming call r with the caller's initial credit: chunks (at least 1)
// and, when bytes is not 0, a byte window ("streamBytes"): the callee
// then sends a chunk only while it has sent fewer bytes than granted (a
// chunk may overshoot the window by its own size).
func AppendStreamRequestFrame(b []byte, seq uint64, r *Request, chunks, bytes uint64) []byte {
	b = AppendRequestFrame(b, seq, r)
	b = b[:len(b)-1]
	b = append(b, `,"stream":`...)
	b = strconv.AppendUint(b, max(chunks, 1), 10)
	if bytes > 0 {
		b = append(b, `,"streamBytes":`...)
		b = strconv.AppendUint(b, bytes, 10)
	}
	return append(b, '}')
}

// AppendResponseFrame appends the native response frame answering seq: the
// result of res, or the error e when e is not nil. res may be nil for an
// error that has no envelope fields to report.
func AppendResponseFrame(b []byte, seq uint64, res *Response, e *Error) []byte {
	b = append(b, `{"type":"res","seq":`...)
	b = strconv.AppendUint(b, seq, 10)
	return appendResponseBody(b, res, e)
}

// AppendEndFrame appends the end of the stream seq after n chunks: a
// response frame of type "end" (see AppendResponseFrame).
func AppendEndFrame(b []byte, seq, n uint64, res *Response, e *Error) []byte {
	b = append(b, `{"type":"end","seq":`...)
	b = strconv.AppendUint(b, seq, 10)
	b = append(b, `,"n":`...)
	b = strconv.AppendUint(b, n, 10)
	return appendResponseBody(b, res, e)
}

// AppendChunkFrame appends the n-th chunk of the stream seq; data is raw
// JSON (a string, number, object...), which the caller vouches for.
func AppendChunkFrame(b []byte, seq, n uint64, data []byte) []byte {
	b = append(b, `{"type":"chunk","seq":`...)
	b = strconv.AppendUint(b, seq, 10)
	b = append(b, `,"n":`...)
	b = strconv.AppendUint(b, n, 10)
	b = append(b, `,"data":`...)
	if len(data) == 0 {
		b = append(b, "null"...)
	} else {
		b = append(b, data...)
	}
	return append(b, '}')
}

// AppendCreditFrame appends a grant of n more chunks and bytes more
// bytes to the stream seq.
func AppendCreditFrame(b []byte, seq, n, bytes uint64) []byte {
	b = append(b, `{"type":"credit","seq":`...)
	b = strconv.AppendUint(b, seq, 10)
	b = append(b, `,"n":`...)
	b = strconv.AppendUint(b, n, 10)
	if bytes > 0 {
		b = append(b, `,"bytes":`...)
		b = strconv.AppendUint(b, bytes, 10)
	}
	return append(b, '}')
}

// appendResponseBody appends a response frame's members after its seq.
func appendResponseBody(b []byte, res *Response, e *Error) []byte {
	if res != nil {
		b = append(b, `,"id":`...)
		b = appendString(b, res.ID)
		if res.Origin != "" {
			b = append(b, `,"origin":`...)
			b = appendString(b, res.Origin)
		}
		if res.Destination != "" {
			b = append(b, `,"destination":`...)
			b = appendString(b, res.Destination)
		}
		if res.Timestamp != 0 {
			b = append(b, `,"timestamp":`...)
			b = strconv.AppendInt(b, res.Timestamp, 10)
		}
	}
	if e != nil {
		b = append(b, `,"error":`...)
		b = appendErrorObject(b, e)
	} else {
		b = append(b, `,"result":`...)
		if res == nil || len(res.Result) == 0 {
			b = append(b, "null"...)
		} else {
			b = append(b, res.Result...)
		}
	}
	if res != nil {
		b = append(b, `,"metrics":`...)
		b = appendMetrics(b, &res.Metrics)
		b = append(b, `,"headers":`...)
		b = appendHeaders(b, &res.Headers)
	}
	return append(b, '}')
}

// AppendCancelFrame appends a frame telling the peer that the caller of
// request seq gave up.
func AppendCancelFrame(b []byte, seq uint64) []byte {
	b = append(b, `{"type":"cancel","seq":`...)
	b = strconv.AppendUint(b, seq, 10)
	return append(b, '}')
}

// AppendGoAwayFrame appends the frame telling the peer that this side takes
// no new requests on the link (see FrameGoAway).
func AppendGoAwayFrame(b []byte) []byte {
	return append(b, `{"type":"goaway"}`...)
}

var nullJSON = []byte("null")

func orVersion(v string) string {
	if v == "" {
		return Version
	}
	return v
}

// EachFrame decodes a native message: one frame, or a batch of frames in a
// JSON array (a writer with several frames queued sends them as one
// message). The limits apply to the whole message, checked once; fn runs
// for each frame in order, with the frame's error if it is invalid. The
// frame fn gets is valid until fn returns (the next one reuses it).
func EachFrame(data []byte, lim Limits, fn func(*Frame, *Error)) {
	f := new(Frame)
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '[' {
		if err := lim.check(data); err != nil {
			fn(f, err)
			return
		}
		_, err := decodeFrameEnd(data, f)
		fn(f, err)
		return
	}
	l := lim.norm()
	l.MaxDepth++ // the array itself
	if err := l.check(data); err != nil {
		fn(f, err)
		return
	}
	eachFrame(data[i:], f, fn)
}

// eachFrame decodes the frames of a batch (a valid JSON array) into f in
// turn, walking each element once: the decoder finds where the frame
// ends.
func eachFrame(arr []byte, f *Frame, fn func(*Frame, *Error)) {
	eachElementEnd(arr, func(rest []byte) int {
		n, err := decodeFrameEnd(rest, f)
		fn(f, err)
		return n
	})
}

// EachCheckedFrame is EachFrame for a message that has already passed
// PrecheckFrames with the same limits (a link's reader checks each
// message in its read buffer): it decodes without scanning the message a
// second time. Each frame is decoded into f, the caller's (a link's
// reader keeps one), which fn may read only until it returns: the next
// frame overwrites it. A Frame is 600 bytes; decoded by value through
// the layers of the walk it took each reader's stack from 4 to 8 KiB
// (kept by every idle link until a collection shrinks it, and regrown by
// its next heartbeat), and was copied once per layer.
func EachCheckedFrame(data []byte, f *Frame, fn func(*Frame, *Error)) {
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '[' {
		_, err := decodeFrameEnd(data, f)
		fn(f, err)
		return
	}
	eachFrame(data[i:], f, fn)
}

// DecodeFrame decodes one native frame. On error the returned Frame still
// carries Type and Seq when they could be read, so that the receiver can
// answer the error to the right request.
func DecodeFrame(data []byte, lim Limits) (Frame, *Error) {
	if err := lim.check(data); err != nil {
		return Frame{}, err
	}
	return decodeValidFrame(data)
}

// decodeValidFrame decodes a frame already checked against the limits.
func decodeValidFrame(data []byte) (Frame, *Error) {
	var f Frame
	_, err := decodeFrameEnd(data, &f)
	return f, err
}

// decodeFrameEnd decodes the frame at the start of data (valid JSON,
// checked against the limits, possibly followed by more) into f, which it
// clears first, and returns the length of its object, or -1 when it could
// not be walked to its end.
func decodeFrameEnd(data []byte, f *Frame) (n int, _ *Error) {
	*f = Frame{}
	n = -1
	if kindOf(data) != '{' {
		return n, NewError(CodeInvalidRequest, "a frame must be a JSON object")
	}
	var typ string
	var params, result, errObj, headers, metrics []byte
	var id, origin, dest, method, version string
	var ts int64
	var stream, streamBytes []byte
	n, err := eachMemberEnd(data, func(key string, v []byte) *Error {
		var e *Error
		switch key {
		case "type":
			typ, e = internField("type", v)
		case "seq":
			var n int64
			n, e = intField("seq", v, 0, math.MaxInt64)
			f.Seq = uint64(n)
		case "id":
			id, e = stringField("id", v)
		case "origin":
			origin, e = internField("origin", v)
		case "destination":
			dest, e = internField("destination", v)
		case "timestamp":
			ts, e = intField("timestamp", v, 0, math.MaxInt64)
		case "method":
			method, e = internField("method", v)
		case "version":
			version, e = internField("version", v)
		case "params":
			params = v
		case "result":
			result = v
		case "error":
			errObj = v
		case "headers":
			headers = v
		case "metrics":
			metrics = v
		case "n":
			var k int64
			k, e = intField("n", v, 0, math.MaxInt64)
			f.N = uint64(k)
		case "data":
			f.Data = v
		case "stream":
			stream = v
		case "streamBytes":
			streamBytes = v
		case "bytes":
			var k int64
			k, e = intField("bytes", v, 0, math.MaxInt64)
			f.Bytes = uint64(k)
		}
		return e
	})
	switch typ {
	case "req":
		f.Type = FrameRequest
	case "res":
		f.Type = FrameResponse
	case "cancel":
		f.Type = FrameCancel
	case "goaway":
		f.Type = FrameGoAway
	case "chunk":
		f.Type = FrameChunk
	case "credit":
		f.Type = FrameCredit
	case "end":
		f.Type = FrameEnd
	}
	if err != nil {
		return n, err
	}
	switch f.Type {
	case FrameRequest:
		if method == "" {
			return n, NewError(CodeInvalidRequest, "method is missing")
		}
		r := &f.Request
		r.ID, r.Origin, r.Destination, r.Timestamp, r.Method, r.Version = id, origin, dest, ts, method, version
		if len(params) > 0 && params[0] != 'n' {
			r.Params = params
		}
		if stream != nil && kindOf(stream) != 'n' {
			c, e := intField("stream", stream, 1, math.MaxInt32)
			if e != nil {
				return n, NewError(CodeInvalidRequest, "stream must be the initial credit, a whole number of chunks from 1")
			}
			r.Stream, f.N = true, uint64(c)
			f.Bytes = 0
			if streamBytes != nil {
				b, e := intField("streamBytes", streamBytes, 1, math.MaxInt64)
				if e != nil {
					return n, NewError(CodeInvalidRequest, "streamBytes must be the byte window, a whole number from 1")
				}
				f.Bytes = uint64(b)
			}
		} else {
			f.N, f.Bytes = 0, 0
		}
		if headers != nil {
			if e := decodeHeaders(headers, &r.Headers); e != nil {
				return n, e
			}
		}
	case FrameResponse, FrameEnd:
		if f.Type == FrameResponse {
			f.N = 0
		}
		f.Bytes = 0
		r := &f.Response
		r.ID, r.Origin, r.Destination, r.Timestamp = id, origin, dest, ts
		if headers != nil {
			if e := decodeHeaders(headers, &r.Headers); e != nil {
				return n, e
			}
		}
		if metrics != nil {
			if e := decodeMetrics(metrics, &r.Metrics); e != nil {
				return n, e
			}
		}
		if errObj != nil && errObj[0] != 'n' {
			e, derr := decodeErrorObject(errObj)
			if derr != nil {
				return n, derr
			}
			f.Err = e
		} else {
			r.Result = result
		}
	case FrameCancel:
	case FrameGoAway:
		f.Seq = 0 // a goaway is about the whole link
	case FrameChunk:
		f.Bytes = 0
		if f.N == 0 {
			return n, NewError(CodeInvalidRequest, "a chunk's n (its sequence number, from 1) is missing")
		}
		if f.Data == nil {
			f.Data = nullJSON
		}
	case FrameCredit:
		if f.N == 0 && f.Bytes == 0 {
			return n, NewError(CodeInvalidRequest, "a credit frame must grant at least 1 chunk (n) or 1 byte (bytes)")
		}
	default:
		return n, Errorf(CodeInvalidRequest, "unknown frame type %q", typ)
	}
	return n, nil
}

func appendHeaders(b []byte, h *Headers) []byte {
	b = append(b, '{')
	n := len(b)
	key := func(name string) {
		if len(b) > n {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, name...)
		b = append(b, '"', ':')
	}
	field := func(name, v string) {
		if v != "" {
			key(name)
			b = appendString(b, v)
		}
	}
	number := func(name string, v int64) {
		if v != 0 {
			key(name)
			b = strconv.AppendInt(b, v, 10)
		}
	}
	field("traceId", h.TraceID)
	field("traceparent", h.Traceparent)
	field("tracestate", h.Tracestate)
	field("baggage", h.Baggage)
	field("authToken", h.AuthToken)
	field("userId", h.UserID)
	number("ttl", h.TTL)
	field("priority", h.Priority)
	number("retryCount", int64(h.RetryCount))
	field("correlationId", h.CorrelationID)
	field("idempotencyKey", h.IdempotencyKey)
	number("hops", int64(h.Hops))
	return append(b, '}')
}

// decodeHeaders reads a headers object, checking every known member's type
// and bounds (ttl within MaxTTL, a known priority).
func decodeHeaders(v []byte, h *Headers) *Error {
	if kindOf(v) == 'n' {
		return nil
	}
	if kindOf(v) != '{' {
		return NewError(CodeInvalidRequest, "headers must be an object")
	}
	return eachMember(v, func(key string, v []byte) *Error {
		var e *Error
		switch key {
		case "traceId":
			h.TraceID, e = stringField("headers.traceId", v)
		case "traceparent":
			h.Traceparent, e = stringField("headers.traceparent", v)
		case "tracestate":
			h.Tracestate, e = stringField("headers.tracestate", v)
		case "baggage":
			h.Baggage, e = stringField("headers.baggage", v)
		case "authToken":
			h.AuthToken, e = stringField("headers.authToken", v)
		case "userId":
			h.UserID, e = stringField("headers.userId", v)
		case "ttl":
			h.TTL, e = intField("headers.ttl", v, 0, MaxTTL.Milliseconds())
		case "priority":
			h.Priority, e = internField("headers.priority", v)
			switch h.Priority {
			case "", PriorityLow, PriorityNormal, PriorityHigh, PriorityCritical:
			default:
				e = Errorf(CodeInvalidRequest, "headers.priority %q is not one of low, normal, high, critical", h.Priority)
			}
		case "retryCount":
			var n int64
			n, e = intField("headers.retryCount", v, 0, 1<<20)
			h.RetryCount = int(n)
		case "correlationId":
			h.CorrelationID, e = stringField("headers.correlationId", v)
		case "idempotencyKey":
			h.IdempotencyKey, e = stringField("headers.idempotencyKey", v)
			if e == nil && len(h.IdempotencyKey) > 255 {
				e = NewError(CodeInvalidRequest, "headers.idempotencyKey is longer than 255 bytes")
			}
		case "hops":
			var n int64
			n, e = intField("headers.hops", v, 0, 16)
			h.Hops = int(n)
		}
		return e
	})
}

func appendMetrics(b []byte, m *Metrics) []byte {
	b = append(b, `{"latencyMs":`...)
	b = strconv.AppendFloat(b, m.LatencyMs, 'f', -1, 64)
	b = append(b, `,"retries":`...)
	b = strconv.AppendInt(b, int64(m.Retries), 10)
	if m.Backend != "" {
		b = append(b, `,"backend":`...)
		b = appendString(b, m.Backend)
	}
	if m.QueueTime != 0 {
		b = append(b, `,"queueTime":`...)
		b = strconv.AppendFloat(b, m.QueueTime, 'f', -1, 64)
	}
	if m.ProcessingTime != 0 {
		b = append(b, `,"processingTime":`...)
		b = strconv.AppendFloat(b, m.ProcessingTime, 'f', -1, 64)
	}
	return append(b, '}')
}

func decodeMetrics(v []byte, m *Metrics) *Error {
	if kindOf(v) != '{' {
		return nil
	}
	return eachMember(v, func(key string, v []byte) *Error {
		var e *Error
		switch key {
		case "latencyMs":
			m.LatencyMs, e = floatField("metrics.latencyMs", v)
		case "retries":
			var n int64
			n, e = intField("metrics.retries", v, 0, 1<<20)
			m.Retries = int(n)
		case "backend":
			m.Backend, e = internField("metrics.backend", v)
		case "queueTime":
			m.QueueTime, e = floatField("metrics.queueTime", v)
		case "processingTime":
			m.ProcessingTime, e = floatField("metrics.processingTime", v)
		}
		return e
	})
}

// appendErrorBody appends the members shared by the native error object
// and the data of a JSON-RPC error: the symbolic code, the HTTP status,
// whether a retry may help (TIMEOUT: for idempotent methods only), and the
// details.
func appendErrorBody(b []byte, e *Error) []byte {
	b = append(b, `"code":`...)
	b = appendString(b, e.Code.String())
	b = append(b, `,"httpStatus":`...)
	b = strconv.AppendInt(b, int64(e.Code.HTTPStatus()), 10)
	b = append(b, `,"retryable":`...)
	b = strconv.AppendBool(b, e.Code.Retry() != RetryNever)
	if e.notSent {
		b = append(b, `,"notSent":true`...)
	}
	if e.attempts > 0 {
		b = append(b, `,"attempts":`...)
		b = strconv.AppendInt(b, int64(e.attempts), 10)
	}
	if len(e.Data) > 0 {
		b = append(b, `,"details":`...)
		b = append(b, e.Data...)
	}
	return b
}

// appendErrorObject appends the native error object:
// {"code":"TIMEOUT","httpStatus":504,"retryable":true,"rpcCode":-32003,"message":"...","details":...}.
func appendErrorObject(b []byte, e *Error) []byte {
	b = append(b, '{')
	b = appendErrorBody(b, e)
	b = append(b, `,"rpcCode":`...)
	b = strconv.AppendInt(b, int64(e.Code.JSONRPC()), 10)
	b = append(b, `,"message":`...)
	b = appendString(b, e.Message)
	return append(b, '}')
}

// decodeErrorObject reads a native error object or JSON-RPC error data. The
// symbolic code wins over the number; an unknown code is RPC_ERROR.
func decodeErrorObject(v []byte) (*Error, *Error) {
	if kindOf(v) != '{' {
		return nil, NewError(CodeInvalidRequest, "error must be an object")
	}
	e := &Error{Code: CodeRPCError, wire: true}
	var sym string
	var num int64
	hasNum := false
	err := eachMember(v, func(key string, v []byte) *Error {
		var de *Error
		switch key {
		case "code":
			if kindOf(v) == '"' {
				sym, de = stringField("error.code", v)
			} else {
				num, de = intField("error.code", v, math.MinInt32, math.MaxInt32)
				hasNum = true
			}
		case "rpcCode":
			num, de = intField("error.rpcCode", v, math.MinInt32, math.MaxInt32)
			hasNum = true
		case "message":
			e.Message, de = stringField("error.message", v)
		case "details":
			if kindOf(v) != 'n' {
				e.Data = json.RawMessage(v)
			}
		case "notSent":
			e.notSent = kindOf(v) == 't'
		case "attempts":
			var n int64
			n, de = intField("error.attempts", v, 0, 1<<20)
			e.attempts = int(n)
		}
		return de
	})
	if err != nil {
		return nil, err
	}
	if c, ok := ParseCode(sym); ok && c != CodeOK {
		e.Code = c
	} else if hasNum {
		e.Code, _ = CodeFromJSONRPC(int(num))
	}
	return e, nil
}

// SubprotocolV2 is the WebSocket subprotocol of the binary native frames
// (package envelope/binframe): the same frames, protobuf-encoded.
const SubprotocolV2 = "agentmesh.v2"
