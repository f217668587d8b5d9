package envelope

import (
	"encoding/binary"
	"math"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// The v2 native frames (subprotocol agentmesh.v2): the same frames as v1,
// in binary. A message (a WebSocket binary message) holds one frame or
// several, each a 4-byte big-endian length and that many bytes of a
// protobuf-encoded Frame message (sdk/agentmesh.proto). The routing
// fields are read without looking at the body: params, result, a chunk's
// data and an error's details are length-prefixed JSON, taken as bytes.
// A receiver checks them as JSON (CheckBody) where it decodes or re-encodes
// them as JSON; a hub that forwards a call from one v2 link to another
// never does.
//
// Field numbers are the contract (sdk/agentmesh.proto): new fields get new
// numbers, and a decoder skips the ones it does not know.

// SubprotocolV2 is the WebSocket subprotocol of the binary native frames.
const SubprotocolV2 = "agentmesh.v2"

// Frame message fields.
const (
	bType        = 1  // varint: FrameType
	bSeq         = 2  // varint
	bN           = 3  // varint: chunk number, credit grant, end's count, stream's initial credit
	bBytes       = 4  // varint: credit's byte grant, stream's byte window
	bData        = 5  // bytes (JSON): a chunk's data
	bID          = 6  // string
	bOrigin      = 7  // string
	bDestination = 8  // string
	bTimestamp   = 9  // varint, unix milliseconds
	bMethod      = 10 // string
	bVersion     = 11 // string
	bParams      = 12 // bytes (JSON)
	bResult      = 13 // bytes (JSON)
	bHeaders     = 14 // Headers message
	bMetrics     = 15 // Metrics message
	bError       = 16 // Error message
	bStream      = 17 // varint (bool): a stream request; N is its initial credit, Bytes its byte window
)

// Headers message fields: strings but ttl (varint, ms), retry count and
// hops (varints).
const (
	hTraceID = iota + 1
	hTraceparent
	hTracestate
	hBaggage
	hAuthToken
	hUserID
	hTTL
	hPriority
	hRetryCount
	hCorrelationID
	hIdempotencyKey
	hHops
)

// Metrics message fields: doubles (fixed64) but retries (varint) and
// backend (string).
const (
	mLatencyMs = iota + 1
	mRetries
	mBackend
	mQueueTime
	mProcessingTime
)

// Error message fields.
const (
	eCode     = 1 // string: the symbolic code, e.g. "TIMEOUT"
	eRPCCode  = 2 // sint32 (zigzag): the JSON-RPC code, used when code is unknown or absent
	eMessage  = 3 // string
	eDetails  = 4 // bytes (JSON)
	eNotSent  = 5 // varint (bool)
	eAttempts = 6 // varint
)

// frameHead is the length prefix of each frame in a v2 message.
const frameHead = 4

func beginFrame(b []byte) ([]byte, int) { return append(b, 0, 0, 0, 0), len(b) }

func endFrame(b []byte, at int) []byte {
	binary.BigEndian.PutUint32(b[at:], uint32(len(b)-at-frameHead))
	return b
}

func appendVarintField(b []byte, num protowire.Number, v uint64) []byte {
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

func appendStringField(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendBytesField(b []byte, num protowire.Number, v []byte) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendBytes(b, v)
}

func appendNonZero(b []byte, num protowire.Number, v int64) []byte {
	if v == 0 {
		return b
	}
	return appendVarintField(b, num, uint64(v))
}

func appendDouble(b []byte, num protowire.Number, v float64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.Fixed64Type)
	return protowire.AppendFixed64(b, math.Float64bits(v))
}

func strSize(s string) int {
	if s == "" {
		return 0
	}
	return 1 + protowire.SizeBytes(len(s)) // field numbers < 16: a 1-byte tag
}

func varSize(v int64) int {
	if v == 0 {
		return 0
	}
	return 1 + protowire.SizeVarint(uint64(v))
}

// AppendRequestFrameV2 is AppendRequestFrame in binary.
func AppendRequestFrameV2(b []byte, seq uint64, r *Request) []byte {
	b, at := beginFrame(b)
	b = appendRequestFields(b, seq, r)
	return endFrame(b, at)
}

// AppendStreamRequestFrameV2 is AppendStreamRequestFrame in binary.
func AppendStreamRequestFrameV2(b []byte, seq uint64, r *Request, chunks, bytes uint64) []byte {
	b, at := beginFrame(b)
	b = appendRequestFields(b, seq, r)
	b = appendVarintField(b, bStream, 1)
	b = appendVarintField(b, bN, max(chunks, 1))
	if bytes > 0 {
		b = appendVarintField(b, bBytes, bytes)
	}
	return endFrame(b, at)
}

func appendRequestFields(b []byte, seq uint64, r *Request) []byte {
	b = appendVarintField(b, bType, uint64(FrameRequest))
	b = appendVarintField(b, bSeq, seq)
	b = appendStringField(b, bID, r.ID)
	b = appendStringField(b, bOrigin, r.Origin)
	b = appendStringField(b, bDestination, r.Destination)
	b = appendNonZero(b, bTimestamp, r.Timestamp)
	b = appendStringField(b, bMethod, r.Method)
	b = appendStringField(b, bVersion, orVersion(r.Version))
	if len(r.Params) > 0 {
		b = appendBytesField(b, bParams, r.Params)
	}
	return appendHeadersV2(b, &r.Headers)
}

func appendHeadersV2(b []byte, h *Headers) []byte {
	n := strSize(h.TraceID) + strSize(h.Traceparent) + strSize(h.Tracestate) + strSize(h.Baggage) +
		strSize(h.AuthToken) + strSize(h.UserID) + varSize(h.TTL) + strSize(h.Priority) +
		varSize(int64(h.RetryCount)) + strSize(h.CorrelationID) + strSize(h.IdempotencyKey) + varSize(int64(h.Hops))
	if n == 0 {
		return b
	}
	b = protowire.AppendTag(b, bHeaders, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(n))
	b = appendStringField(b, hTraceID, h.TraceID)
	b = appendStringField(b, hTraceparent, h.Traceparent)
	b = appendStringField(b, hTracestate, h.Tracestate)
	b = appendStringField(b, hBaggage, h.Baggage)
	b = appendStringField(b, hAuthToken, h.AuthToken)
	b = appendStringField(b, hUserID, h.UserID)
	b = appendNonZero(b, hTTL, h.TTL)
	b = appendStringField(b, hPriority, h.Priority)
	b = appendNonZero(b, hRetryCount, int64(h.RetryCount))
	b = appendStringField(b, hCorrelationID, h.CorrelationID)
	b = appendStringField(b, hIdempotencyKey, h.IdempotencyKey)
	return appendNonZero(b, hHops, int64(h.Hops))
}

// AppendResponseFrameV2 is AppendResponseFrame in binary.
func AppendResponseFrameV2(b []byte, seq uint64, res *Response, e *Error) []byte {
	b, at := beginFrame(b)
	b = appendVarintField(b, bType, uint64(FrameResponse))
	b = appendVarintField(b, bSeq, seq)
	b = appendResponseFieldsV2(b, res, e)
	return endFrame(b, at)
}

// AppendEndFrameV2 is AppendEndFrame in binary.
func AppendEndFrameV2(b []byte, seq, n uint64, res *Response, e *Error) []byte {
	b, at := beginFrame(b)
	b = appendVarintField(b, bType, uint64(FrameEnd))
	b = appendVarintField(b, bSeq, seq)
	b = appendVarintField(b, bN, n)
	b = appendResponseFieldsV2(b, res, e)
	return endFrame(b, at)
}

func appendResponseFieldsV2(b []byte, res *Response, e *Error) []byte {
	if res != nil {
		b = appendStringField(b, bID, res.ID)
		b = appendStringField(b, bOrigin, res.Origin)
		b = appendStringField(b, bDestination, res.Destination)
		b = appendNonZero(b, bTimestamp, res.Timestamp)
	}
	if e != nil {
		b = appendErrorV2(b, e)
	} else if res != nil && len(res.Result) > 0 {
		b = appendBytesField(b, bResult, res.Result)
	}
	if res != nil {
		b = appendMetricsV2(b, &res.Metrics)
		b = appendHeadersV2(b, &res.Headers)
	}
	return b
}

func appendMetricsV2(b []byte, m *Metrics) []byte {
	n := 0
	for _, f := range [...]float64{m.LatencyMs, m.QueueTime, m.ProcessingTime} {
		if f != 0 {
			n += 9
		}
	}
	n += varSize(int64(m.Retries)) + strSize(m.Backend)
	if n == 0 {
		return b
	}
	b = protowire.AppendTag(b, bMetrics, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(n))
	b = appendDouble(b, mLatencyMs, m.LatencyMs)
	b = appendNonZero(b, mRetries, int64(m.Retries))
	b = appendStringField(b, mBackend, m.Backend)
	b = appendDouble(b, mQueueTime, m.QueueTime)
	return appendDouble(b, mProcessingTime, m.ProcessingTime)
}

func appendErrorV2(b []byte, e *Error) []byte {
	code := e.Code.String()
	rpc := protowire.EncodeZigZag(int64(e.Code.JSONRPC()))
	n := strSize(code) + 1 + protowire.SizeVarint(rpc) + strSize(e.Message) + varSize(int64(e.attempts))
	if len(e.Data) > 0 {
		n += 1 + protowire.SizeBytes(len(e.Data))
	}
	if e.notSent {
		n += 2
	}
	b = protowire.AppendTag(b, bError, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(n))
	b = appendStringField(b, eCode, code)
	b = appendVarintField(b, eRPCCode, rpc)
	b = appendStringField(b, eMessage, e.Message)
	if len(e.Data) > 0 {
		b = appendBytesField(b, eDetails, e.Data)
	}
	if e.notSent {
		b = appendVarintField(b, eNotSent, 1)
	}
	return appendNonZero(b, eAttempts, int64(e.attempts))
}

// AppendChunkFrameV2 is AppendChunkFrame in binary.
func AppendChunkFrameV2(b []byte, seq, n uint64, data []byte) []byte {
	b, at := beginFrame(b)
	b = appendVarintField(b, bType, uint64(FrameChunk))
	b = appendVarintField(b, bSeq, seq)
	b = appendVarintField(b, bN, n)
	if len(data) == 0 {
		data = nullJSON
	}
	b = appendBytesField(b, bData, data)
	return endFrame(b, at)
}

// AppendCreditFrameV2 is AppendCreditFrame in binary.
func AppendCreditFrameV2(b []byte, seq, n, bytes uint64) []byte {
	b, at := beginFrame(b)
	b = appendVarintField(b, bType, uint64(FrameCredit))
	b = appendVarintField(b, bSeq, seq)
	b = appendNonZero(b, bN, int64(n))
	b = appendNonZero(b, bBytes, int64(bytes))
	return endFrame(b, at)
}

// AppendCancelFrameV2 is AppendCancelFrame in binary.
func AppendCancelFrameV2(b []byte, seq uint64) []byte {
	b, at := beginFrame(b)
	b = appendVarintField(b, bType, uint64(FrameCancel))
	b = appendVarintField(b, bSeq, seq)
	return endFrame(b, at)
}

// AppendGoAwayFrameV2 is AppendGoAwayFrame in binary.
func AppendGoAwayFrameV2(b []byte) []byte {
	b, at := beginFrame(b)
	b = appendVarintField(b, bType, uint64(FrameGoAway))
	return endFrame(b, at)
}

// PrecheckBinary reports the refusal of a v2 message as a whole: larger
// than the limit, or not a sequence of whole length-prefixed frames.
// What is inside each frame is checked as it is decoded.
func PrecheckBinary(data []byte, lim Limits) *Error {
	lim = lim.norm()
	if len(data) > lim.MaxBytes {
		return Errorf(CodeInvalidRequest, "message of %d bytes exceeds the limit of %d bytes", len(data), lim.MaxBytes)
	}
	if len(data) == 0 {
		return NewError(CodeInvalidRequest, "empty message")
	}
	for len(data) > 0 {
		if len(data) < frameHead {
			return NewError(CodeInvalidRequest, "a frame's length is cut short")
		}
		n := binary.BigEndian.Uint32(data)
		if n == 0 || uint64(n) > uint64(len(data)-frameHead) {
			return Errorf(CodeInvalidRequest, "a frame's length (%d) does not fit the message", n)
		}
		data = data[frameHead+int(n):]
	}
	return nil
}

// EachBinaryFrame decodes a v2 message that passed PrecheckBinary: fn runs
// for each frame in order, with the frame's error if it is invalid. Each
// frame is decoded into f, which fn may read only until it returns. The
// JSON members (params, result, data, details) are checked against lim
// when check is set; otherwise they are left unchecked (CheckBody).
func EachBinaryFrame(data []byte, lim Limits, check bool, f *Frame, fn func(*Frame, *Error)) {
	lim = lim.norm()
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
func CheckBody(name string, v []byte, lim Limits) *Error {
	if len(v) == 0 {
		return nil
	}
	lim = lim.norm()
	lim.MaxDepth--
	return checkBody(name, v, lim)
}

func checkBodies(f *Frame, lim Limits) *Error {
	switch f.Type {
	case FrameRequest:
		return checkBody("params", f.Request.Params, lim)
	case FrameResponse, FrameEnd:
		if f.Err != nil {
			return checkBody("error.details", f.Err.Data, lim)
		}
		return checkBody("result", f.Response.Result, lim)
	case FrameChunk:
		return checkBody("data", f.Data, lim)
	}
	return nil
}

// checkBody is the limits' check of one JSON member, the refusal naming
// it: PARSE_ERROR for bytes that are not JSON, as a v1 message's.
func checkBody(name string, v []byte, lim Limits) *Error {
	if len(v) == 0 {
		return nil
	}
	if e := lim.check(v); e != nil {
		return &Error{Code: e.Code, Message: name + ": " + e.Message}
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

var errMalformed = NewError(CodeInvalidRequest, "malformed binary frame")

func (fd *field) want(t protowire.Type, name string) *Error {
	if fd.typ != t {
		return Errorf(CodeInvalidRequest, "%s has the wrong wire type", name)
	}
	return nil
}

func (fd *field) str(name string) (string, *Error) {
	if e := fd.want(protowire.BytesType, name); e != nil {
		return "", e
	}
	if !utf8.Valid(fd.b) {
		return "", Errorf(CodeInvalidRequest, "%s is not valid UTF-8", name)
	}
	return string(fd.b), nil
}

func (fd *field) intern(name string) (string, *Error) {
	if e := fd.want(protowire.BytesType, name); e != nil {
		return "", e
	}
	if !utf8.Valid(fd.b) {
		return "", Errorf(CodeInvalidRequest, "%s is not valid UTF-8", name)
	}
	return internBytes(fd.b), nil
}

func (fd *field) uint(name string, lo, hi uint64) (uint64, *Error) {
	if e := fd.want(protowire.VarintType, name); e != nil {
		return 0, e
	}
	if fd.v < lo || fd.v > hi {
		return 0, Errorf(CodeInvalidRequest, "%s must be a whole number from %d to %d", name, lo, hi)
	}
	return fd.v, nil
}

func (fd *field) bytes(name string) ([]byte, *Error) {
	if e := fd.want(protowire.BytesType, name); e != nil {
		return nil, e
	}
	return fd.b, nil
}

// decodeBinaryFrame decodes one frame's fields into f, which it clears
// first: the checks of the v1 decoder (decodeFrameEnd), on binary
// fields. On error f keeps Type and Seq when they were read.
func decodeBinaryFrame(data []byte, f *Frame) *Error {
	*f = Frame{}
	var typ uint64
	var stream bool
	var hdr, met, errb, params, result []byte
	var r struct {
		id, origin, dest, method, version string
		ts                                int64
	}
	var fd field
	for len(data) > 0 {
		n := next(data, &fd)
		if n < 0 {
			return errMalformed
		}
		data = data[n:]
		var e *Error
		switch fd.num {
		case bType:
			typ, e = fd.uint("type", 1, 255)
			f.Type = FrameType(typ)
		case bSeq:
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
		if e != nil {
			return e
		}
	}
	if f.Type != FrameChunk {
		f.Data = nil // a chunk's member only
	}
	switch f.Type {
	case FrameRequest:
		if r.method == "" {
			return NewError(CodeInvalidRequest, "method is missing")
		}
		q := &f.Request
		q.ID, q.Origin, q.Destination, q.Timestamp, q.Method, q.Version = r.id, r.origin, r.dest, r.ts, r.method, r.version
		if len(params) > 0 {
			q.Params = params
		}
		if stream {
			if f.N < 1 || f.N > math.MaxInt32 {
				return NewError(CodeInvalidRequest, "stream must be the initial credit, a whole number of chunks from 1")
			}
			q.Stream = true
		} else {
			f.N, f.Bytes = 0, 0
		}
		return decodeHeadersV2(hdr, &q.Headers)
	case FrameResponse, FrameEnd:
		if f.Type == FrameResponse {
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
	case FrameCancel:
	case FrameGoAway:
		f.Seq = 0
	case FrameChunk:
		f.Bytes = 0
		if f.N == 0 {
			return NewError(CodeInvalidRequest, "a chunk's n (its sequence number, from 1) is missing")
		}
		if f.Data == nil {
			f.Data = nullJSON
		}
	case FrameCredit:
		if f.N == 0 && f.Bytes == 0 {
			return NewError(CodeInvalidRequest, "a credit frame must grant at least 1 chunk (n) or 1 byte (bytes)")
		}
	default:
		return Errorf(CodeInvalidRequest, "unknown frame type %d", typ)
	}
	return nil
}

func decodeHeadersV2(data []byte, h *Headers) *Error {
	var fd field
	for len(data) > 0 {
		n := next(data, &fd)
		if n < 0 {
			return errMalformed
		}
		data = data[n:]
		var e *Error
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
			v, e = fd.uint("headers.ttl", 0, uint64(MaxTTL.Milliseconds()))
			h.TTL = int64(v)
		case hPriority:
			h.Priority, e = fd.intern("headers.priority")
			switch h.Priority {
			case "", PriorityLow, PriorityNormal, PriorityHigh, PriorityCritical:
			default:
				if e == nil {
					e = Errorf(CodeInvalidRequest, "headers.priority %q is not one of low, normal, high, critical", h.Priority)
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
				e = NewError(CodeInvalidRequest, "headers.idempotencyKey is longer than 255 bytes")
			}
		case hHops:
			v, e = fd.uint("headers.hops", 0, 16)
			h.Hops = int(v)
		}
		if e != nil {
			return e
		}
	}
	return nil
}

func decodeMetricsV2(data []byte, m *Metrics) *Error {
	var fd field
	for len(data) > 0 {
		n := next(data, &fd)
		if n < 0 {
			return errMalformed
		}
		data = data[n:]
		var e *Error
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
		if e != nil {
			return e
		}
	}
	return nil
}

func (fd *field) double(name string) (float64, *Error) {
	if e := fd.want(protowire.Fixed64Type, name); e != nil {
		return 0, e
	}
	v := math.Float64frombits(fd.v)
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, Errorf(CodeInvalidRequest, "%s must be a finite number", name)
	}
	return v, nil
}

func decodeErrorV2(data []byte) (*Error, *Error) {
	e := &Error{Code: CodeRPCError, wire: true}
	var sym string
	var num int64
	hasNum := false
	var fd field
	for len(data) > 0 {
		n := next(data, &fd)
		if n < 0 {
			return nil, errMalformed
		}
		data = data[n:]
		var de *Error
		switch fd.num {
		case eCode:
			sym, de = fd.intern("error.code")
		case eRPCCode:
			if de = fd.want(protowire.VarintType, "error.rpcCode"); de == nil {
				num = protowire.DecodeZigZag(fd.v)
				hasNum = true
				if num < math.MinInt32 || num > math.MaxInt32 {
					de = NewError(CodeInvalidRequest, "error.rpcCode is out of range")
				}
			}
		case eMessage:
			e.Message, de = fd.str("error.message")
		case eDetails:
			var d []byte
			if d, de = fd.bytes("error.details"); de == nil && len(d) > 0 && kindOf(d) != 'n' {
				e.Data = d
			}
		case eNotSent:
			var v uint64
			v, de = fd.uint("error.notSent", 0, 1)
			e.notSent = v == 1
		case eAttempts:
			var v uint64
			v, de = fd.uint("error.attempts", 0, 1<<20)
			e.attempts = int(v)
		}
		if de != nil {
			return nil, de
		}
	}
	if c, ok := ParseCode(sym); ok && c != CodeOK {
		e.Code = c
	} else if hasNum {
		e.Code, _ = CodeFromJSONRPC(int(num))
	}
	return e, nil
}

// RecoverFrameSeqV2 is RecoverFrameSeq for a v2 message refused as a
// whole: the first frame's type and seq, when its head holds them as its
// first two fields and it is a request or a response.
func RecoverFrameSeqV2(head []byte) (typ FrameType, seq uint64, ok bool) {
	if len(head) < frameHead {
		return 0, 0, false
	}
	head = head[frameHead:]
	var fd field
	n := next(head, &fd)
	if n < 0 || fd.num != bType || fd.typ != protowire.VarintType {
		return 0, 0, false
	}
	typ = FrameType(fd.v)
	if fd.v > 255 || (typ != FrameRequest && typ != FrameResponse) {
		return 0, 0, false
	}
	if n = next(head[n:], &fd); n < 0 || fd.num != bSeq || fd.typ != protowire.VarintType || fd.v == 0 || fd.v > math.MaxInt64 {
		return 0, 0, false
	}
	return typ, fd.v, true
}
