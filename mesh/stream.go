package mesh

import (
	"context"
	"encoding/json"
	"io"
	"iter"
	"sync"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/stream"
)

// Stream is a streaming call in progress (Client.Stream): read its chunks
// with Recv or All, then Close it.
type Stream struct {
	ctx    context.Context
	pipe   *stream.Pipe
	stop   func()
	cancel context.CancelFunc
	once   sync.Once
}

// StreamOption adjusts one stream.
type StreamOption func(*streamOpts)

type streamOpts struct {
	call   []CallOption
	window stream.Window
}

// Window sets the chunks the stream may hold unread (its credit; default
// stream.DefaultWindow): the agent is held back once they are.
func Window(n int) StreamOption { return func(o *streamOpts) { o.window.Chunks = n } }

// WindowBytes sets the bytes of chunk data the stream may hold unread
// (default stream.DefaultWindowBytes; a chunk may overshoot it by its own
// size).
func WindowBytes(n int) StreamOption { return func(o *streamOpts) { o.window.Bytes = n } }

// WithCallOptions applies call options (To, WithHeaders, CallTimeout) to
// the stream's request; CallTimeout bounds the whole stream.
func WithCallOptions(opts ...CallOption) StreamOption {
	return func(o *streamOpts) { o.call = append(o.call, opts...) }
}

// Stream calls a streaming method (the kOS seed's stream(method, params,
// options)) and returns at once; the call runs through the client's
// chain as Call does (its span, breaker, bulkhead, and retries before the
// first chunk only). The stream's deadline is CallTimeout, else ctx's,
// else the seed's stream ttl (5 min). Only ws:// clients stream.
func (c *Client) Stream(ctx context.Context, method string, params any, opts ...StreamOption) (*Stream, error) {
	if !c.useWS && c.cfg.transport == nil {
		return nil, envelope.NewError(envelope.CodeInvalidRequest, "mesh: streams need a WebSocket hub URL (ws:// or wss://)").MarkNotSent()
	}
	var o streamOpts
	for _, f := range opts {
		f(&o)
	}
	var co callOpts
	for _, f := range o.call {
		f(&co)
	}
	raw, err := marshalParams(params)
	if err != nil {
		return nil, err
	}
	req := &envelope.Request{
		ID: envelope.NewID(), Origin: c.cfg.origin, Destination: co.destination,
		Timestamp: time.Now().UnixMilli(), Method: method, Params: raw, Version: envelope.Version, Stream: true,
	}
	if co.headers != nil {
		co.headers(&req.Headers)
	}
	timeout := co.timeout
	if _, ok := ctx.Deadline(); !ok && timeout <= 0 {
		timeout = stream.DefaultTimeout
	}
	var cancel context.CancelFunc = func() {}
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, timeout)
	}
	if err := ctx.Err(); err != nil {
		cancel()
		return nil, envelope.AsError(err).MarkNotSent()
	}
	p, stop := stream.Open(ctx, c.invoke, req, o.window)
	return &Stream{ctx: ctx, pipe: p, stop: stop, cancel: cancel}, nil
}

// Recv returns the next chunk, waiting for it: io.EOF after the last
// chunk of a stream that ended well, the stream's *envelope.Error
// otherwise (one that broke after chunks were delivered says the last
// sequence number in its details, "lastSeq", and is never retried).
func (s *Stream) Recv() (json.RawMessage, error) {
	// Not s.ctx: at its deadline it would race the stream's own end and
	// lose its error's lastSeq; the call ends by that deadline anyway.
	return s.pipe.Next(context.Background())
}

// All ranges over the chunks; a stream that does not end well yields its
// error last. Breaking out of the loop leaves the stream open: Close it.
func (s *Stream) All() iter.Seq2[json.RawMessage, error] {
	return func(yield func(json.RawMessage, error) bool) {
		for {
			c, err := s.Recv()
			if err == io.EOF {
				return
			}
			if !yield(c, err) || err != nil {
				return
			}
		}
	}
}

// Result is the stream's end ({"chunks": N} from an agent's stream
// handler); nil until the stream ended well.
func (s *Stream) Result() *envelope.Response { return s.pipe.Result() }

// Received is how many chunks arrived so far.
func (s *Stream) Received() uint64 { return s.pipe.Received() }

// Close cancels the stream if it still runs (the agent's handler sees its
// context cancelled) and waits for it to end. Safe to call more than once.
func (s *Stream) Close() {
	s.once.Do(func() {
		s.stop()
		s.cancel()
	})
}
