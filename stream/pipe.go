package stream

import (
	"context"
	"encoding/json"
	"io"
	"sync"

	"github.com/agentmesh/agentmesh/envelope"
)

// Pipe is an in-process consumer of a stream: a Sink that holds at most
// its window of chunks unread, and grants credit back as they are read.
// Next reads them in order; Finish records the stream's end. Safe for
// one reader and one feeder at a time.
type Pipe struct {
	window Credit

	mu      sync.Mutex
	buf     [][]byte
	granted Credit // granted in all
	used    Credit // received
	owed    Credit // read and not yet granted back
	grant   func(Credit)
	done    bool
	res     *envelope.Response
	err     error
	wake    chan struct{} // one token: something arrived
}

// NewPipe returns a pipe granting w (the defaults for its zero fields).
func NewPipe(w Window) *Pipe {
	if w.Chunks <= 0 {
		w.Chunks = DefaultWindow
	}
	if w.Bytes <= 0 {
		w.Bytes = DefaultWindowBytes
	}
	c := Credit{uint64(w.Chunks), uint64(w.Bytes)}
	return &Pipe{window: c, granted: c, wake: make(chan struct{}, 1)}
}

// Chunk implements Sink.
func (p *Pipe) Chunk(data []byte) *envelope.Error {
	c := append([]byte(nil), data...)
	p.mu.Lock()
	if p.done {
		p.mu.Unlock()
		return envelope.NewError(envelope.CodeCancelled, "the stream's reader is gone")
	}
	if p.used.Chunks >= p.granted.Chunks || p.used.Bytes >= p.granted.Bytes {
		p.mu.Unlock()
		return BeyondCredit()
	}
	p.used.Chunks++
	p.used.Bytes += uint64(len(data))
	p.buf = append(p.buf, c)
	p.mu.Unlock()
	p.signal()
	return nil
}

// Attach implements Sink.
func (p *Pipe) Attach(grant func(Credit)) Credit {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.grant = grant
	c := Credit{p.granted.Chunks - p.used.Chunks, 1}
	if p.granted.Bytes > p.used.Bytes {
		c.Bytes = p.granted.Bytes - p.used.Bytes
	}
	return c
}

func (p *Pipe) signal() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Finish records the stream's end: Next returns io.EOF (res) or err once
// the chunks before it are read.
func (p *Pipe) Finish(res *envelope.Response, err error) {
	p.mu.Lock()
	if !p.done {
		p.done, p.res, p.err = true, res, err
	}
	p.mu.Unlock()
	p.signal()
}

// Next returns the next chunk, waiting for it; io.EOF after the last
// chunk of a stream that ended well, the stream's error after the last
// of one that did not, ctx's error if it ends first.
func (p *Pipe) Next(ctx context.Context) (json.RawMessage, error) {
	for {
		p.mu.Lock()
		if len(p.buf) > 0 {
			c := p.buf[0]
			p.buf[0] = nil
			p.buf = p.buf[1:]
			if len(p.buf) == 0 {
				p.buf = nil // let the array go; a stream reads on
			}
			p.owed.Chunks++
			p.owed.Bytes += uint64(len(c))
			var grant func(Credit)
			var n Credit
			if (p.owed.Chunks >= max(p.window.Chunks/2, 1) || p.owed.Bytes >= p.window.Bytes/2) && !p.done {
				grant, n = p.grant, p.owed
				p.granted.Chunks += n.Chunks
				p.granted.Bytes += n.Bytes
				p.owed = Credit{}
			}
			p.mu.Unlock()
			if grant != nil {
				grant(n)
			}
			return c, nil
		}
		if p.done {
			err := p.err
			p.mu.Unlock()
			if err == nil {
				return nil, io.EOF
			}
			return nil, err
		}
		p.mu.Unlock()
		select {
		case <-p.wake:
		case <-ctx.Done():
			return nil, envelope.AsError(ctx.Err())
		}
	}
}

// Result is the stream's end (nil until it ended well).
func (p *Pipe) Result() *envelope.Response {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.res
}

// Received is how many chunks arrived so far.
func (p *Pipe) Received() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.used.Chunks
}

// Open runs invoke with req (its Stream set) into a new pipe, on a
// goroutine, and returns the pipe and a stop function: stop cancels the
// call if it still runs and waits for the goroutine (call it once done
// reading).
func Open(ctx context.Context, invoke envelope.Invoker, req *envelope.Request, window Window) (p *Pipe, stop func()) {
	p = NewPipe(window)
	ctx, cancel := context.WithCancel(With(ctx, p))
	req.Stream = true
	done := make(chan struct{})
	go func() {
		defer close(done)
		res, err := invoke(ctx, req)
		p.Finish(res, err)
	}()
	return p, func() {
		cancel()
		<-done
	}
}

// Relay runs req as a stream through invoke (in a pipe of window)
// and hands each chunk, numbered from 1, to emit on the calling
// goroutine, in order; emit may block (a transport with no room holds
// the producer back through the credit) and its error cancels the
// stream. It returns the stream's end: what a surface that relays a
// stream to a protocol of its own (SSE, JSON-RPC notifications, agentick
// or Multica events) needs.
func Relay(ctx context.Context, invoke envelope.Invoker, req *envelope.Request, window Window, emit func(n uint64, data json.RawMessage) error) (*envelope.Response, error) {
	p, stop := Open(ctx, invoke, req, window)
	defer stop()
	for n := uint64(1); ; n++ {
		c, err := p.Next(ctx)
		if err == io.EOF {
			return p.Result(), nil
		}
		if err != nil {
			return nil, err
		}
		if err := emit(n, c); err != nil {
			return nil, err
		}
	}
}
