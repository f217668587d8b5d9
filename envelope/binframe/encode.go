// Package binframe is the binary encoding of the native frames
// (subprotocol agentmesh.v2): the same frames as package envelope's JSON
// (agentmesh.v1), in binary. A message (a WebSocket binary message) holds one frame or
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
package binframe

import (
	"bytes"
	"encoding/binary"
	"math"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/agentmesh/agentmesh/envelope"
)

// Subprotocol is the WebSocket subprotocol of the binary native frames.
const Subprotocol = envelope.SubprotocolV2

// Frame message fields.
const (
	bType        = 1  // varint: envelope.FrameType
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
	bHeaders     = 14 // envelope.Headers message
	bMetrics     = 15 // envelope.Metrics message
	bError       = 16 // envelope.Error message
	bStream      = 17 // varint (bool): a stream request; N is its initial credit, Bytes its byte window
)

// envelope.Headers message fields: strings but ttl (varint, ms), retry count and
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

// envelope.Metrics message fields: doubles (fixed64) but retries (varint) and
// backend (string).
const (
	mLatencyMs = iota + 1
	mRetries
	mBackend
	mQueueTime
	mProcessingTime
)

// envelope.Error message fields.
const (
	eCode     = 1 // string: the symbolic code, e.g. "TIMEOUT"
	eRPCCode  = 2 // sint32 (zigzag): the JSON-RPC code, used when code is unknown or absent
	eMessage  = 3 // string
	eDetails  = 4 // bytes (JSON)
	eNotSent  = 5 // varint (bool)
	eAttempts = 6 // varint
)

// nullJSON is a chunk's data when it has none.
var nullJSON = []byte("null")

func orVersion(v string) string {
	if v == "" {
		return envelope.Version
	}
	return v
}

func norm(l envelope.Limits) envelope.Limits {
	d := envelope.DefaultLimits()
	if l.MaxBytes <= 0 {
		l.MaxBytes = d.MaxBytes
	}
	if l.MaxDepth <= 0 {
		l.MaxDepth = d.MaxDepth
	}
	return l
}

// isNull reports whether the JSON value v is null.
func isNull(v []byte) bool {
	v = bytes.TrimLeft(v, " \t\r\n")
	return len(v) > 0 && v[0] == 'n'
}

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

// AppendRequest is AppendRequestFrame in binary.
func AppendRequest(b []byte, seq uint64, r *envelope.Request) []byte {
	b, at := beginFrame(b)
	b = appendRequestFields(b, seq, r)
	return endFrame(b, at)
}

// AppendStreamRequest is AppendStreamRequestFrame in binary.
func AppendStreamRequest(b []byte, seq uint64, r *envelope.Request, chunks, bytes uint64) []byte {
	b, at := beginFrame(b)
	b = appendRequestFields(b, seq, r)
	b = appendVarintField(b, bStream, 1)
	b = appendVarintField(b, bN, max(chunks, 1))
	if bytes > 0 {
		b = appendVarintField(b, bBytes, bytes)
	}
	return endFrame(b, at)
}

func appendRequestFields(b []byte, seq uint64, r *envelope.Request) []byte {
	b = appendVarintField(b, bType, uint64(envelope.FrameRequest))
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

func appendHeadersV2(b []byte, h *envelope.Headers) []byte {
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

// AppendResponse is AppendResponseFrame in binary.
func AppendResponse(b []byte, seq uint64, res *envelope.Response, e *envelope.Error) []byte {
	b, at := beginFrame(b)
	b = appendVarintField(b, bType, uint64(envelope.FrameResponse))
	b = appendVarintField(b, bSeq, seq)
	b = appendResponseFieldsV2(b, res, e)
	return endFrame(b, at)
}

// AppendEnd is AppendEndFrame in binary.
func AppendEnd(b []byte, seq, n uint64, res *envelope.Response, e *envelope.Error) []byte {
	b, at := beginFrame(b)
	b = appendVarintField(b, bType, uint64(envelope.FrameEnd))
	b = appendVarintField(b, bSeq, seq)
	b = appendVarintField(b, bN, n)
	b = appendResponseFieldsV2(b, res, e)
	return endFrame(b, at)
}

func appendResponseFieldsV2(b []byte, res *envelope.Response, e *envelope.Error) []byte {
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

func appendMetricsV2(b []byte, m *envelope.Metrics) []byte {
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

func appendErrorV2(b []byte, e *envelope.Error) []byte {
	code := e.Code.String()
	rpc := protowire.EncodeZigZag(int64(e.Code.JSONRPC()))
	n := strSize(code) + 1 + protowire.SizeVarint(rpc) + strSize(e.Message) + varSize(int64(e.Attempts()))
	if len(e.Data) > 0 {
		n += 1 + protowire.SizeBytes(len(e.Data))
	}
	if e.NotSent() {
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
	if e.NotSent() {
		b = appendVarintField(b, eNotSent, 1)
	}
	return appendNonZero(b, eAttempts, int64(e.Attempts()))
}

// AppendChunk is AppendChunkFrame in binary.
func AppendChunk(b []byte, seq, n uint64, data []byte) []byte {
	b, at := beginFrame(b)
	b = appendVarintField(b, bType, uint64(envelope.FrameChunk))
	b = appendVarintField(b, bSeq, seq)
	b = appendVarintField(b, bN, n)
	if len(data) == 0 {
		data = nullJSON
	}
	b = appendBytesField(b, bData, data)
	return endFrame(b, at)
}

// AppendCredit is AppendCreditFrame in binary.
func AppendCredit(b []byte, seq, n, bytes uint64) []byte {
	b, at := beginFrame(b)
	b = appendVarintField(b, bType, uint64(envelope.FrameCredit))
	b = appendVarintField(b, bSeq, seq)
	b = appendNonZero(b, bN, int64(n))
	b = appendNonZero(b, bBytes, int64(bytes))
	return endFrame(b, at)
}

// AppendCancel is AppendCancelFrame in binary.
func AppendCancel(b []byte, seq uint64) []byte {
	b, at := beginFrame(b)
	b = appendVarintField(b, bType, uint64(envelope.FrameCancel))
	b = appendVarintField(b, bSeq, seq)
	return endFrame(b, at)
}

// AppendGoAway is AppendGoAwayFrame in binary.
func AppendGoAway(b []byte) []byte {
	b, at := beginFrame(b)
	b = appendVarintField(b, bType, uint64(envelope.FrameGoAway))
	return endFrame(b, at)
}
