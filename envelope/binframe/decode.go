package binframe

import (
	"encoding/binary"
	"math"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/agentmesh/agentmesh/envelope"
)

// Decoding: a message checked whole (Precheck), then each frame's
// fields, with the checks of the JSON decoder.

// Precheck reports the refusal of a v2 message as a whole: larger
// than the limit, or not a sequence of whole length-prefixed frames.
// What is inside each frame is checked as it is decoded.
func Precheck(data []byte, lim envelope.Limits) *envelope.Error {
	lim = norm(lim)
	if len(data) > lim.MaxBytes {
		return envelope.Errorf(envelope.CodeInvalidRequest, "message of %d bytes exceeds the limit of %d bytes", len(data), lim.MaxBytes)
	}
	if len(data) == 0 {
		return ErrDamaged
	}
	for len(data) > 0 {
		if len(data) < frameHead {
			return ErrDamaged
		}
		n := binary.BigEndian.Uint32(data)
		if n == 0 || uint64(n) > uint64(len(data)-frameHead) {
			return ErrDamaged
		}
		data = data[frameHead+int(n):]
	}
	return nil
}

// ErrDamaged is Precheck's refusal of a message whose frames do not fill
// it exactly: no encoder makes one, so the stream was damaged on the way
// (or its sender is broken), and nothing in it can be trusted, not even
// a seq to answer: a receiver closes the link (1007), so that its calls
// fail over at once, as for a lost link.
var ErrDamaged = envelope.NewError(envelope.CodeInvalidRequest, "the frames do not fill the message: the stream is damaged")

// Each decodes a v2 message that passed Precheck: fn runs
// for each frame in order, with the frame's error if it is invalid. Each
// frame is decoded into f, which fn may read only until it returns. The
// JSON members (params, result, data, details) are checked against lim
// when check is set; otherwise they are left unchecked (CheckBody).
func Each(data []byte, lim envelope.Limits, check bool, f *envelope.Frame, fn func(*envelope.Frame, *envelope.Error)) {
	lim = norm(lim)
	lim.MaxDepth-- // a body nests inside its frame, as in v1
	for len(data) >= frameHead {
		n := int(binary.BigEndian.Uint32(data))
		if n > len(data)-frameHead {
			return
		}
		err := decodeBinaryFrame(data[frameHead:frameHead+n], f)
		if err == nil && check {
			err = checkBodies(f, lim)
		}
		fn(f, err)
		data = data[frameHead+n:]
	}
}

// CheckBody checks a JSON body (params, result, data) taken unchecked
// from a binary frame, against the limits of the message it came in; the
// refusal names it (name).
func CheckBody(name string, v []byte, lim envelope.Limits) *envelope.Error {
	if len(v) == 0 {
		return nil
	}
	lim = norm(lim)
	lim.MaxDepth--
	return checkBody(name, v, lim)
}

func checkBodies(f *envelope.Frame, lim envelope.Limits) *envelope.Error {
	switch f.Type {
	case envelope.FrameRequest:
		return checkBody("params", f.Request.Params, lim)
	case envelope.FrameResponse, envelope.FrameEnd:
		if f.Err != nil {
			return checkBody("error.details", f.Err.Data, lim)
		}
		return checkBody("result", f.Response.Result, lim)
	case envelope.FrameChunk:
		return checkBody("data", f.Data, lim)
	}
	return nil
}

// checkBody is the limits' check of one JSON member, the refusal naming
// it: PARSE_ERROR for bytes that are not JSON, as a v1 message's.
func checkBody(name string, v []byte, lim envelope.Limits) *envelope.Error {
	if len(v) == 0 {
		return nil
	}
	if e := lim.Check(v); e != nil {
		return &envelope.Error{Code: e.Code, Message: name + ": " + e.Message}
	}
	return nil
}

// field is one decoded protobuf field.
type field struct {
	num protowire.Number
	typ protowire.Type
	v   uint64 // a varint's or fixed64's value
	b   []byte // a bytes field's value
}

// next reads the field at the start of data; n < 0: malformed.
func next(data []byte, fd *field) (n int) {
	num, typ, n := protowire.ConsumeTag(data)
	if n < 0 {
		return n
	}
	fd.num, fd.typ = num, typ
	var m int
	switch typ {
	case protowire.VarintType:
		fd.v, m = protowire.ConsumeVarint(data[n:])
	case protowire.Fixed64Type:
		fd.v, m = protowire.ConsumeFixed64(data[n:])
	case protowire.Fixed32Type:
		var v uint32
		v, m = protowire.ConsumeFixed32(data[n:])
		fd.v = uint64(v)
	case protowire.BytesType:
		fd.b, m = protowire.ConsumeBytes(data[n:])
	default:
		return -1 // groups are not used
	}
	if m < 0 {
		return m
	}
	return n + m
}

var errMalformed = envelope.NewError(envelope.CodeInvalidRequest, "malformed binary frame")

func (fd *field) want(t protowire.Type, name string) *envelope.Error {
	if fd.typ != t {
		return envelope.Errorf(envelope.CodeInvalidRequest, "%s has the wrong wire type", name)
	}
	return nil
}

func (fd *field) str(name string) (string, *envelope.Error) {
	if e := fd.want(protowire.BytesType, name); e != nil {
		return "", e
	}
	if !utf8.Valid(fd.b) {
		return "", envelope.Errorf(envelope.CodeInvalidRequest, "%s is not valid UTF-8", name)
	}
	return string(fd.b), nil
}

func (fd *field) intern(name string) (string, *envelope.Error) {
	if e := fd.want(protowire.BytesType, name); e != nil {
		return "", e
	}
	if !utf8.Valid(fd.b) {
		return "", envelope.Errorf(envelope.CodeInvalidRequest, "%s is not valid UTF-8", name)
	}
	return envelope.Intern(fd.b), nil
}

func (fd *field) uint(name string, lo, hi uint64) (uint64, *envelope.Error) {
	if e := fd.want(protowire.VarintType, name); e != nil {
		return 0, e
	}
	if fd.v < lo || fd.v > hi {
		return 0, envelope.Errorf(envelope.CodeInvalidRequest, "%s must be a whole number from %d to %d", name, lo, hi)
	}
	return fd.v, nil
}

func (fd *field) bytes(name string) ([]byte, *envelope.Error) {
	if e := fd.want(protowire.BytesType, name); e != nil {
		return nil, e
	}
	return fd.b, nil
}

// walk calls fn for each field of a message in order, until fn refuses
// one; a field that cannot be read is errMalformed.
func walk(data []byte, fn func(fd field) *envelope.Error) *envelope.Error {
	var fd field
	for len(data) > 0 {
		n := next(data, &fd)
		if n < 0 {
			return errMalformed
		}
		data = data[n:]
		if e := fn(fd); e != nil {
			return e
		}
	}
	return nil
}

// decodeBinaryFrame decodes one frame's fields into f, which it clears
// first: the checks of the v1 decoder (decodeFrameEnd), on binary
// fields. On error f keeps Type and Seq when they were read.
func decodeBinaryFrame(data []byte, f *envelope.Frame) *envelope.Error {
	*f = envelope.Frame{}
	var typ uint64
	var stream, seenSeq bool
	var hdr, met, errb, params, result []byte
	var r struct {
		id, origin, dest, method, version string
		ts                                int64
	}
	if err := walk(data, func(fd field) (e *envelope.Error) {
		switch fd.num {
		case bType:
			if typ != 0 { // the first one says what the frame is (RecoverFrameSeq): no second opinion
				return envelope.NewError(envelope.CodeInvalidRequest, "type is given twice")
			}
			typ, e = fd.uint("type", 1, 255)
			f.Type = envelope.FrameType(typ)
		case bSeq:
			if seenSeq {
				return envelope.NewError(envelope.CodeInvalidRequest, "seq is given twice")
			}
			seenSeq = true
			f.Seq, e = fd.uint("seq", 0, math.MaxInt64)
		case bN:
			f.N, e = fd.uint("n", 0, math.MaxInt64)
		case bBytes:
			f.Bytes, e = fd.uint("bytes", 0, math.MaxInt64)
		case bData:
			f.Data, e = fd.bytes("data")
		case bID:
			r.id, e = fd.str("id")
		case bOrigin:
			r.origin, e = fd.intern("origin")
		case bDestination:
			r.dest, e = fd.intern("destination")
		case bTimestamp:
			var v uint64
			v, e = fd.uint("timestamp", 0, math.MaxInt64)
			r.ts = int64(v)
		case bMethod:
			r.method, e = fd.intern("method")
		case bVersion:
			r.version, e = fd.intern("version")
		case bParams:
			params, e = fd.bytes("params")
		case bResult:
			result, e = fd.bytes("result")
		case bHeaders:
			hdr, e = fd.bytes("headers")
		case bMetrics:
			met, e = fd.bytes("metrics")
		case bError:
			errb, e = fd.bytes("error")
		case bStream:
			var v uint64
			v, e = fd.uint("stream", 0, 1)
			stream = v == 1
		}
		return e
	}); err != nil {
		return err
	}
	if f.Type != envelope.FrameChunk {
		f.Data = nil // a chunk's member only
	}
	switch f.Type {
	case envelope.FrameRequest:
		if r.method == "" {
			return envelope.NewError(envelope.CodeInvalidRequest, "method is missing")
		}
		q := &f.Request
		q.ID, q.Origin, q.Destination, q.Timestamp, q.Method, q.Version = r.id, r.origin, r.dest, r.ts, r.method, r.version
		if len(params) > 0 {
			q.Params = params
		}
		if stream {
			if f.N < 1 || f.N > math.MaxInt32 {
				return envelope.NewError(envelope.CodeInvalidRequest, "stream must be the initial credit, a whole number of chunks from 1")
			}
			q.Stream = true
		} else {
			f.N, f.Bytes = 0, 0
		}
		return decodeHeadersV2(hdr, &q.Headers)
	case envelope.FrameResponse, envelope.FrameEnd:
		if f.Type == envelope.FrameResponse {
			f.N = 0
		}
		f.Bytes = 0
		s := &f.Response
		s.ID, s.Origin, s.Destination, s.Timestamp = r.id, r.origin, r.dest, r.ts
		if e := decodeHeadersV2(hdr, &s.Headers); e != nil {
			return e
		}
		if e := decodeMetricsV2(met, &s.Metrics); e != nil {
			return e
		}
		if errb != nil {
			e, derr := decodeErrorV2(errb)
			if derr != nil {
				return derr
			}
			f.Err = e
		} else {
			s.Result = result
		}
	case envelope.FrameCancel:
		f.N, f.Bytes = 0, 0
	case envelope.FrameGoAway:
		f.Seq, f.N, f.Bytes = 0, 0, 0 // a goaway is about the whole link
	case envelope.FrameChunk:
		f.Bytes = 0
		if f.N == 0 {
			return envelope.NewError(envelope.CodeInvalidRequest, "a chunk's n (its sequence number, from 1) is missing")
		}
		if f.Data == nil {
			f.Data = nullJSON
		}
	case envelope.FrameCredit:
		if f.N == 0 && f.Bytes == 0 {
			return envelope.NewError(envelope.CodeInvalidRequest, "a credit frame must grant at least 1 chunk (n) or 1 byte (bytes)")
		}
	default:
		return envelope.Errorf(envelope.CodeInvalidRequest, "unknown frame type %d", typ)
	}
	return nil
}

func decodeHeadersV2(data []byte, h *envelope.Headers) *envelope.Error {
	if err := walk(data, func(fd field) (e *envelope.Error) {
		var v uint64
		switch fd.num {
		case hTraceID:
			h.TraceID, e = fd.str("headers.traceId")
		case hTraceparent:
			h.Traceparent, e = fd.str("headers.traceparent")
		case hTracestate:
			h.Tracestate, e = fd.str("headers.tracestate")
		case hBaggage:
			h.Baggage, e = fd.str("headers.baggage")
		case hAuthToken:
			h.AuthToken, e = fd.str("headers.authToken")
		case hUserID:
			h.UserID, e = fd.str("headers.userId")
		case hTTL:
			v, e = fd.uint("headers.ttl", 0, uint64(envelope.MaxTTL.Milliseconds()))
			h.TTL = int64(v)
		case hPriority:
			h.Priority, e = fd.intern("headers.priority")
			switch h.Priority {
			case "", envelope.PriorityLow, envelope.PriorityNormal, envelope.PriorityHigh, envelope.PriorityCritical:
			default:
				if e == nil {
					e = envelope.Errorf(envelope.CodeInvalidRequest, "headers.priority %q is not one of low, normal, high, critical", h.Priority)
				}
			}
		case hRetryCount:
			v, e = fd.uint("headers.retryCount", 0, 1<<20)
			h.RetryCount = int(v)
		case hCorrelationID:
			h.CorrelationID, e = fd.str("headers.correlationId")
		case hIdempotencyKey:
			h.IdempotencyKey, e = fd.str("headers.idempotencyKey")
			if e == nil && len(h.IdempotencyKey) > 255 {
				e = envelope.NewError(envelope.CodeInvalidRequest, "headers.idempotencyKey is longer than 255 bytes")
			}
		case hHops:
			v, e = fd.uint("headers.hops", 0, 16)
			h.Hops = int(v)
		}
		return e
	}); err != nil {
		return err
	}
	return nil
}

func decodeMetricsV2(data []byte, m *envelope.Metrics) *envelope.Error {
	if err := walk(data, func(fd field) (e *envelope.Error) {
		switch fd.num {
		case mLatencyMs:
			m.LatencyMs, e = fd.double("metrics.latencyMs")
		case mRetries:
			var v uint64
			v, e = fd.uint("metrics.retries", 0, 1<<20)
			m.Retries = int(v)
		case mBackend:
			m.Backend, e = fd.intern("metrics.backend")
		case mQueueTime:
			m.QueueTime, e = fd.double("metrics.queueTime")
		case mProcessingTime:
			m.ProcessingTime, e = fd.double("metrics.processingTime")
		}
		return e
	}); err != nil {
		return err
	}
	return nil
}

func (fd *field) double(name string) (float64, *envelope.Error) {
	if e := fd.want(protowire.Fixed64Type, name); e != nil {
		return 0, e
	}
	v := math.Float64frombits(fd.v)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, envelope.Errorf(envelope.CodeInvalidRequest, "%s must be a finite number", name)
	}
	return v, nil
}

func decodeErrorV2(data []byte) (*envelope.Error, *envelope.Error) {
	code := envelope.CodeRPCError
	var sym, msg string
	var details []byte
	var num int64
	hasNum, notSent, attempts := false, false, 0
	if err := walk(data, func(fd field) (de *envelope.Error) {
		switch fd.num {
		case eCode:
			sym, de = fd.intern("error.code")
		case eRPCCode:
			if de = fd.want(protowire.VarintType, "error.rpcCode"); de == nil {
				num = protowire.DecodeZigZag(fd.v)
				hasNum = true
				if num < math.MinInt32 || num > math.MaxInt32 {
					de = envelope.NewError(envelope.CodeInvalidRequest, "error.rpcCode is out of range")
				}
			}
		case eMessage:
			msg, de = fd.str("error.message")
		case eDetails:
			var d []byte
			if d, de = fd.bytes("error.details"); de == nil && len(d) > 0 && !isNull(d) {
				details = d
			}
		case eNotSent:
			var v uint64
			v, de = fd.uint("error.notSent", 0, 1)
			notSent = v == 1
		case eAttempts:
			var v uint64
			v, de = fd.uint("error.attempts", 0, 1<<20)
			attempts = int(v)
		}
		return de
	}); err != nil {
		return nil, err
	}
	if c, ok := envelope.ParseCode(sym); ok && c != envelope.CodeOK {
		code = c
	} else if hasNum {
		code, _ = envelope.CodeFromJSONRPC(int(num))
	}
	e := envelope.WireError(code, msg, details)
	if notSent {
		e.MarkNotSent()
	}
	if attempts > 0 {
		e = e.WithAttempts(attempts)
	}
	return e, nil
}

// RecoverFrameSeq is RecoverFrameSeq for a v2 message refused as a
// whole: the first frame's type and seq, when its head holds them as its
// first two fields and it is a request or a response.
func RecoverFrameSeq(head []byte) (typ envelope.FrameType, seq uint64, ok bool) {
	if len(head) < frameHead {
		return 0, 0, false
	}
	head = head[frameHead:]
	var fd field
	n := next(head, &fd)
	if n < 0 || fd.num != bType || fd.typ != protowire.VarintType {
		return 0, 0, false
	}
	typ = envelope.FrameType(fd.v)
	if fd.v > 255 || (typ != envelope.FrameRequest && typ != envelope.FrameResponse) {
		return 0, 0, false
	}
	if n = next(head[n:], &fd); n < 0 || fd.num != bSeq || fd.typ != protowire.VarintType || fd.v == 0 || fd.v > math.MaxInt64 {
		return 0, 0, false
	}
	return typ, fd.v, true
}
