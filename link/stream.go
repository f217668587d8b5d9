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
// feeds it (the agent behind a hub), in chunks: a caller may grant more,
// and it is passed on as chunks are delivered.
const MaxRelayCredit = 256

// The relay's window. What a hub holds for a caller is bounded by the
// caller's credit, and also, like an HTTP/2 connection window, by the
// connection's budget: the bytes owed to the caller
// (Config.MaxUnwrittenBytes, 4 MiB by default), shared by the streams
// relayed to it. A relayed stream starts with 1 chunk of credit passed
// on (the chunks' size is not known yet), then keeps at most its share
// of the budget (budget / streams relayed on the link, at least 1 chunk)
// outstanding at its last chunk's size; while the connection holds more
// than the budget unwritten, no credit is passed on: the streams wait
// (parked) until its writer drains it. So a caller that stops reading
// makes the hub hold about 2 × the budget + one chunk per stream,
// whatever credit it granted.

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
	size    int    // the last relayed chunk's size (0: none yet)
	feed    func(uint64)
	parked  bool          // waits for the connection to drain (in l.parked)
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
	s.pass(feed, give)
}

// pass hands give chunks of credit to feed, or, when the stream was
// parked, makes sure a drain that came before it was noticed.
func (s *servedStream) pass(feed func(uint64), give uint64) {
	if give > 0 {
		feed(give)
		return
	}
	if s.l.c.TakeDrained() {
		s.l.unpark() // the writer drained it between the check and the park
	}
}

// topUp passes on what the relay's window allows now.
func (s *servedStream) topUp() {
	s.mu.Lock()
	feed, give := s.topUpLocked()
	s.mu.Unlock()
	s.pass(feed, give)
}

// topUpLocked passes on what the caller granted beyond what the feeder
// has, within the relay's window, or parks the stream until the
// connection drains.
func (s *servedStream) topUpLocked() (func(uint64), uint64) {
	if s.feed == nil || s.ended {
		return nil, 0
	}
	limit := min(s.granted, s.sent+MaxRelayCredit)
	if s.size > 0 {
		limit = min(limit, s.sent+uint64(max(1, s.l.relayShare()/s.size)))
	} else {
		limit = min(limit, s.sent+1)
	}
	if limit <= s.passed {
		return nil, 0
	}
	if s.l.c.OverBudget() {
		if !s.parked {
			s.parked = true
			s.l.park(s)
		}
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
	if (feed == nil) != (s.feed == nil) {
		s.l.relays.Add(map[bool]int64{true: 1, false: -1}[feed != nil])
	}
	s.feed = feed
	if feed == nil {
		return 0
	}
	s.passed = min(s.granted, s.sent+1) // one chunk, until its size is known
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
	s.size = len(data) + 48
	n := s.sent
	s.mu.Unlock()
	s.l.sendChunk(s.seq, n, data)
	s.topUp() // after the chunk is queued: the budget sees it
	return nil
}

// Send implements stream.Sender: it waits for credit, then sends.
func (s *servedStream) Send(ctx context.Context, data []byte) error {
	limit := s.l.c.Config().Limits.MaxBytes
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

// relayShare is a relayed stream's share of the connection's budget.
func (l *Link) relayShare() int {
	return l.c.Budget() / int(max(l.relays.Load(), 1))
}

// park holds s until the connection drains below its budget.
func (l *Link) park(s *servedStream) {
	l.mu.Lock()
	if l.parked == nil {
		l.parked = map[*servedStream]struct{}{}
	}
	l.parked[s] = struct{}{}
	l.mu.Unlock()
	l.c.WantDrained()
}

// unpark tops up the parked streams: the connection's writer drained it
// below its budget (Conn.drained).
func (l *Link) unpark() {
	l.mu.Lock()
	parked := l.parked
	l.parked = nil
	l.mu.Unlock()
	for s := range parked {
		s.mu.Lock()
		s.parked = false
		s.mu.Unlock()
		s.topUp()
	}
}
