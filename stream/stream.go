// Package stream is the flow-control contract of streaming calls: a call
// whose callee sends chunks before its end (envelope.Request.Stream).
//
// Credit flows from the consumer to the producer, chunks the other way,
// as with HTTP/2's windows: the consumer grants chunks, the producer
// sends only what it was granted, and whatever forwards a stream (a link,
// the hub) holds no more than the credit it passed on. A Sink is the
// consumer's side as the forwarder sees it; a Pipe is an in-process
// consumer (a client, a surface relaying to HTTP); link's served streams
// are the other Sink, the one a hub relays a stream to a remote caller
// through, and the Sender an agent's handler sends with.
package stream

import (
	"context"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
)

// Credit is a grant of flow-control credit: chunks, and bytes of chunk
// data. A stream's initial credit with Bytes 0 has no byte window (only
// chunks count); in a later grant, 0 grants none of that kind. A
// producer sends a chunk while it has a chunk of credit and, with a byte
// window, has sent fewer bytes than granted: a chunk may overshoot the
// byte window by its own size (chunks are not split).
type Credit struct{ Chunks, Bytes uint64 }

// Sink is where a streaming call's chunks go and where its credit comes
// from.
type Sink interface {
	// Chunk delivers the next chunk, raw JSON valid only during the call,
	// without blocking. It is called only within the credit granted: a
	// chunk beyond it is refused with an error, which ends the stream.
	Chunk(data []byte) *envelope.Error
	// Attach makes grant receive every later grant of credit (nil: stop)
	// and returns the credit granted and not yet used: the initial credit
	// of the call that feeds the sink (one at a time; a retry attaches
	// again). grant must not block.
	Attach(grant func(Credit)) Credit
}

// Sender is a Sink a handler sends to: Send blocks until the consumer
// has granted credit for the chunk, ctx ends, or the stream is gone.
type Sender interface {
	Sink
	Send(ctx context.Context, data []byte) error
	// Sent is how many chunks went out so far (the last sequence number).
	Sent() uint64
}

type sinkKey struct{}

// With returns ctx carrying s: the sink of the streaming call made with
// ctx (a link's Call sends a request with Stream set as a stream into it).
func With(ctx context.Context, s Sink) context.Context { return context.WithValue(ctx, sinkKey{}, s) }

// From returns the sink ctx carries, or nil.
func From(ctx context.Context) Sink {
	s, _ := ctx.Value(sinkKey{}).(Sink)
	return s
}

// SenderFrom returns the Sender of the streaming call a handler serves
// (nil when the call is not a stream).
func SenderFrom(ctx context.Context) Sender {
	s, _ := From(ctx).(Sender)
	return s
}

// DefaultWindow is a consumer's credit when it names none: the chunks it
// may hold unread. A Pipe grants half of it again each time half of it
// was read, so the window sets how often a grant crosses the mesh: at
// 64, small chunks went at half the rate of 256 (bench -stream -window).
const DefaultWindow = 256

// DefaultWindowBytes is a consumer's byte window when it names none: the
// chunk data it may hold unread (and a chunk's size over it).
const DefaultWindowBytes = 4 << 20

// Window is a consumer's window: the chunks and bytes it may hold unread
// (zero fields take DefaultWindow, DefaultWindowBytes).
type Window struct{ Chunks, Bytes int }

// RelayWindow is the window of a surface that relays a stream to a
// protocol of its own (SSE, JSON-RPC notifications, agentick or Multica
// events): what the hub holds per stream for a client slow to read, on
// top of the transport's own queue.
var RelayWindow = Window{Chunks: 64, Bytes: 1 << 20}

// DefaultTimeout bounds a whole stream whose caller set no deadline: the
// kOS seed's stream ttl (300000 ms), longer than a call's.
const DefaultTimeout = 5 * time.Minute

// ChunkMethod is the method of the JSON-RPC notifications that carry a
// streaming call's chunks on a WebSocket, before its response:
// {"jsonrpc":"2.0","method":"stream.chunk","params":{"id":<the call's id>,"n":K,"data":<chunk>}}.
const ChunkMethod = "stream.chunk"

// BeyondCredit is the error of a chunk sent without credit for it.
func BeyondCredit() *envelope.Error {
	return envelope.NewError(envelope.CodeInternal, "stream chunk beyond the credit granted (flow-control violation)")
}
