package link

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/stream"
)

// Streams on a link. A request frame with "stream":C is a streaming call
// with C chunks of initial credit: the callee sends chunk frames in
// order, numbered from 1, each within the credit, then an end frame; the
// caller sends credit frames as it consumes chunks, and a cancel frame
// if it gives up. Chunks and grants go out with Conn.SendCredited: flow
// control bounds them, not the send queue, and they must not be dropped
// (a lost grant would stall the stream).

// MaxRelayCredit bounds the credit a served stream passes on to whatever
// feeds it (the agent behind a hub): a caller may grant more, but the
// chunks a relay holds for it are bounded here, about 256 × the chunk
// size; more is passed on as they are delivered.
const MaxRelayCredit = 256

// servedStream is the callee's side of a stream the link serves: the
// Sink its handler's chunks go to (a hub's relay through Chunk, an
// agent's handler through Send), and the Canceler the link cancels it
// with. The caller's grants arrive with grant.
type servedStream struct {
	l      *Link
	seq    uint64
	cancel context.CancelFunc

	mu      sync.Mutex
	granted uint64 // by the caller, in all
	sent    uint64 // chunks sent (the last sequence number)
	passed  uint64 // passed on to the attached feeder, in all (sent <= passed <= granted)
	feed    func(uint64)
	room    chan struct{} // one token: credit arrived, or the stream ended
	ended   bool
}

func newServedStream(l *Link, seq, credit uint64, cancel context.CancelFunc) *servedStream {
	return &servedStream{l: l, seq: seq, cancel: cancel, granted: credit, room: make(chan struct{}, 1)}
}

// CancelServed implements Canceler: the caller cancelled, or the link
// closed.
func (s *servedStream) CancelServed() {
	s.mu.Lock()
	s.ended = true
	s.mu.Unlock()
	s.wake()
	s.cancel()
}

func (s *servedStream) wake() {
	select {
	case s.room <- struct{}{}:
	default:
	}
}

// grant adds the caller's credit frame's n chunks (the link's reader).
func (s *servedStream) grant(n uint64) {
	s.mu.Lock()
	s.granted += n
	feed, give := s.topUpLocked()
	s.mu.Unlock()
	s.wake()
	if give > 0 {
		feed(give)
	}
}

// topUpLocked passes on what the caller granted beyond what the feeder
// has, up to MaxRelayCredit outstanding.
func (s *servedStream) topUpLocked() (func(uint64), uint64) {
	if s.feed == nil {
		return nil, 0
	}
	limit := min(s.granted, s.sent+MaxRelayCredit)
	if limit <= s.passed {
		return nil, 0
	}
	give := limit - s.passed
	s.passed = limit
	return s.feed, give
}

// Attach implements stream.Sink.
func (s *servedStream) Attach(feed func(uint64)) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.feed = feed
	if feed == nil {
		return 0
	}
	s.passed = min(s.granted, s.sent+MaxRelayCredit)
	return s.passed - s.sent
}

// Chunk implements stream.Sink: a relayed chunk, within what was passed
// on to the feeder.
func (s *servedStream) Chunk(data []byte) *envelope.Error {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return envelope.NewError(envelope.CodeCancelled, "the stream's caller is gone")
	}
	if s.sent >= s.passed {
		s.mu.Unlock()
		return stream.BeyondCredit()
	}
	s.sent++
	n := s.sent
	var feed func(uint64)
	var give uint64
	if s.passed-s.sent <= MaxRelayCredit/2 {
		feed, give = s.topUpLocked()
	}
	s.mu.Unlock()
	s.l.sendChunk(s.seq, n, data)
	if give > 0 {
		feed(give)
	}
	return nil
}

// Send implements stream.Sender: it waits for credit, then sends.
func (s *servedStream) Send(ctx context.Context, data []byte) error {
	limit := s.l.c.cfg.Limits.MaxBytes
	if limit <= 0 {
		limit = envelope.DefaultLimits().MaxBytes
	}
	if limit -= 128; len(data) > limit { // the chunk frame's own members
		return envelope.Errorf(envelope.CodeInvalidParams, "a chunk of %d bytes is over the %d-byte frame limit", len(data), limit)
	}
	for {
		s.mu.Lock()
		if s.ended {
			s.mu.Unlock()
			if err := ctx.Err(); err != nil {
				return envelope.AsError(err)
			}
			return envelope.NewError(envelope.CodeCancelled, "the stream's caller cancelled it")
		}
		if s.sent < s.granted {
			s.sent++
			n := s.sent
			s.mu.Unlock()
			if !s.l.sendChunk(s.seq, n, data) {
				return UnavailableNotSent("link closed")
			}
			return nil
		}
		s.mu.Unlock()
		if s.l.c.cfg.StreamStall != nil {
			s.l.c.cfg.StreamStall()
		}
		select {
		case <-s.room:
		case <-ctx.Done():
			return envelope.AsError(ctx.Err())
		}
	}
}

// Sent implements stream.Sender.
func (s *servedStream) Sent() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sent
}

// sendChunk queues the n-th chunk of the stream seq.
func (l *Link) sendChunk(seq, n uint64, data []byte) bool {
	b := GetBuf()
	*b = envelope.AppendChunkFrame(*b, seq, n, data)
	return l.c.SendCredited(b)
}

// grantCredit queues a grant of n chunks to the stream seq.
func (l *Link) grantCredit(seq, n uint64) {
	b := GetBuf()
	*b = envelope.AppendCreditFrame(*b, seq, n)
	l.c.SendCredited(b)
}

// callerStream is a streaming call this side made, in the link's
// streams table until its end.
type callerStream struct {
	sink stream.Sink
	n    atomic.Uint64 // chunks received (the reader writes it)
}

// callStream is Call for a request with Stream set: its chunks go to
// the sink ctx carries (stream.With), its credit comes from it.
func (l *Link) callStream(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
	sink := stream.From(ctx)
	if sink == nil {
		return nil, envelope.NewError(envelope.CodeInvalidRequest, "a streaming call needs a consumer for its chunks (stream.With)").MarkNotSent()
	}
	seq := l.seq.Add(1)
	ch := l.results.Get().(chan linkResult)
	cs := &callerStream{sink: sink}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		l.results.Put(ch)
		return nil, UnavailableNotSent("link closed")
	}
	l.pending[seq] = ch
	if l.streams == nil {
		l.streams = map[uint64]*callerStream{}
	}
	l.streams[seq] = cs
	l.mu.Unlock()
	defer func() {
		sink.Attach(nil)
		l.mu.Lock()
		delete(l.streams, seq)
		l.mu.Unlock()
	}()

	credit := sink.Attach(func(n uint64) { l.grantCredit(seq, n) })
	if credit == 0 {
		l.forget(seq, ch)
		return nil, envelope.NewError(envelope.CodeInvalidRequest, "a stream needs at least one chunk of credit").MarkNotSent()
	}
	r := *req
	r.Headers.SetDeadline(ctx)
	b := GetBuf()
	*b = envelope.AppendStreamRequestFrame(*b, seq, &r, credit)
	if !l.c.TrySend(b) {
		l.forget(seq, ch)
		if l.Err() != nil {
			return nil, UnavailableNotSent("link closed")
		}
		return nil, envelope.NewError(envelope.CodeOverloaded, "link send queue is full").MarkNotSent()
	}
	var res linkResult
	select {
	case res = <-ch:
		l.results.Put(ch)
	case <-ctx.Done():
		if !l.forget(seq, ch) {
			<-ch // a deliverer holds it: take it, to drop it
			l.results.Put(ch)
		}
		cb := GetBuf()
		*cb = envelope.AppendCancelFrame(*cb, seq)
		l.c.SendCredited(cb)
		res = linkResult{err: envelope.AsError(ctx.Err())}
	}
	if res.err == nil {
		return res.res, nil
	}
	return nil, streamError(res.err, cs.n.Load())
}

// streamError is the error a stream ended with after n chunks: once a
// chunk was delivered the stream is never retried (the attempts mark),
// and the error tells the last sequence number delivered (details
// {"lastSeq": n}, unless the error carries details of its own).
func streamError(e *envelope.Error, n uint64) *envelope.Error {
	if n == 0 {
		return e
	}
	if len(e.Data) == 0 {
		e = e.WithData(map[string]uint64{"lastSeq": n})
	}
	if e.Attempts() == 0 {
		e = e.WithAttempts(1)
	}
	return e
}

// onChunk hands a chunk to its stream's sink (the reader). A chunk out of
// order, or one the sink refuses (beyond its credit, or its consumer
// gone), ends the stream: its call fails, and the peer is told to cancel.
func (l *Link) onChunk(f *envelope.Frame) {
	l.mu.Lock()
	cs := l.streams[f.Seq]
	l.mu.Unlock()
	if cs == nil {
		return // the stream ended on this side (cancelled, timed out)
	}
	var err *envelope.Error
	if want := cs.n.Load() + 1; f.N != want {
		err = envelope.Errorf(envelope.CodeInternal, "stream chunk %d arrived where %d was due", f.N, want)
	} else if err = cs.sink.Chunk(f.Data); err == nil {
		cs.n.Store(f.N)
		return
	}
	l.mu.Lock()
	delete(l.streams, f.Seq)
	l.mu.Unlock()
	cb := GetBuf()
	*cb = envelope.AppendCancelFrame(*cb, f.Seq)
	l.c.SendCredited(cb)
	l.deliver(f.Seq, linkResult{err: err})
}

// onCredit hands a grant to the stream this side serves (the reader).
func (l *Link) onCredit(f *envelope.Frame) {
	l.mu.Lock()
	s, _ := l.serving[f.Seq].(*servedStream)
	l.mu.Unlock()
	if s != nil {
		s.grant(f.N)
	}
}
