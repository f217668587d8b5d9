package link

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/stream"
)

// Streams on a link. A request frame with "stream":C (and, optionally,
// "streamBytes":B) is a streaming call with C chunks and B bytes of
// initial credit: the callee sends chunk frames in order, numbered from
// 1, each within the credit, then an end frame; the caller sends credit
// frames as it consumes chunks, and a cancel frame if it gives up (see
// stream.Credit for the rule). Chunks go out with Conn.SendCredited:
// flow control bounds them, not the send queue; grants and cancels with
// Conn.SendControl, never dropped (a lost grant would stall the stream),
// and not counted as owed to the peer.

// relayStartBytes is a relayed stream's first byte window (Attach).
const relayStartBytes = 16 << 10

// MaxRelayCredit bounds the chunks of credit a relayed stream has
// outstanding at its feeder (the agent behind a hub): a caller may grant
// more, and it is passed on as chunks are delivered.
const MaxRelayCredit = 256

// The relay's window. What a hub holds for a caller is bounded by the
// caller's credit, and also, like an HTTP/2 connection window, by the
// connection's budget: the bytes owed to the caller
// (Config.MaxUnwrittenBytes, 4 MiB by default), shared by the streams
// relayed to it. The relay leg always has a byte window: a relayed
// stream has at most its share of the budget (budget / streams relayed
// on the link) of bytes outstanding at its feeder, whatever the chunks'
// sizes; while the connection holds more than the budget unwritten, no
// credit is passed on and the stream waits (parked) until its writer
// drains it. So a caller that stops reading makes the hub hold at most
// about 2 × the budget + one chunk per stream, whatever it granted.
// Credit is passed on in batches (half a window), not per chunk.

// servedStream is the callee's side of a stream the link serves: the
// Sink its handler's chunks go to (a hub's relay through Chunk, an
// agent's handler through Send), and the Canceler the link cancels it
// with. The caller's grants arrive with grant.
type servedStream struct {
	l      *Link
	seq    uint64
	cancel context.CancelFunc
	byteW  bool // the caller set a byte window

	mu      sync.Mutex
	granted stream.Credit // by the caller, in all
	sent    stream.Credit // sent (sent.Chunks is the last sequence number)
	passed  stream.Credit // passed on to the attached feeder, in all
	feed    func(stream.Credit)
	parked  bool          // waits for the connection to drain (in l.parked)
	room    chan struct{} // one token: credit arrived, or the stream ended
	ended   bool
}

func newServedStream(l *Link, seq uint64, credit stream.Credit, cancel context.CancelFunc) *servedStream {
	return &servedStream{l: l, seq: seq, cancel: cancel, granted: credit, byteW: credit.Bytes > 0, room: make(chan struct{}, 1)}
}

// CancelServed implements Canceler: the caller cancelled, or the link
// closed. The handler's context is cancelled first: a Send that sees the
// stream ended then sees its context done too, so the handler never ends
// on CANCELLED with a context still live (a context.AfterFunc of its
// own, stopped as it returns, missed the cancel: a lost-cancel flake of
// TestStreamCancelReachesHandler under load).
func (s *servedStream) CancelServed() {
	s.cancel()
	s.mu.Lock()
	s.ended = true
	s.mu.Unlock()
	s.wake()
}

func (s *servedStream) wake() {
	select {
	case s.room <- struct{}{}:
	default:
	}
}

// mayLocked reports whether the caller's credit allows one more chunk.
func (s *servedStream) mayLocked() bool {
	return s.sent.Chunks < s.granted.Chunks && (!s.byteW || s.sent.Bytes < s.granted.Bytes)
}

// grant adds the caller's credit frame (the link's reader).
func (s *servedStream) grant(c stream.Credit) {
	s.mu.Lock()
	s.granted.Chunks += c.Chunks
	s.granted.Bytes += c.Bytes
	feed, give := s.topUpLocked()
	s.mu.Unlock()
	s.wake()
	s.pass(feed, give)
}

// pass hands give to feed, or, when the stream was parked, makes sure a
// drain that came before it was noticed.
func (s *servedStream) pass(feed func(stream.Credit), give stream.Credit) {
	if feed != nil {
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

// topUpLocked returns the credit to pass on to the feeder now, within
// the caller's grant and the relay's window, in batches (half a window,
// or whatever there is once the feeder has nothing left), or parks the
// stream until the connection drains. feed is nil when nothing is given.
func (s *servedStream) topUpLocked() (func(stream.Credit), stream.Credit) {
	if s.feed == nil || s.ended {
		return nil, stream.Credit{}
	}
	share := uint64(s.l.relayShare())
	chunks := min(s.granted.Chunks, s.sent.Chunks+MaxRelayCredit)
	bytes := s.sent.Bytes + share
	if s.byteW {
		bytes = min(bytes, s.granted.Bytes)
	}
	var give stream.Credit
	if chunks > s.passed.Chunks {
		give.Chunks = chunks - s.passed.Chunks
	}
	if bytes > s.passed.Bytes {
		give.Bytes = bytes - s.passed.Bytes
	}
	if give == (stream.Credit{}) {
		return nil, give
	}
	starved := s.passed.Chunks <= s.sent.Chunks || s.passed.Bytes <= s.sent.Bytes
	if !starved && give.Chunks < MaxRelayCredit/2 && give.Bytes < share/2 {
		return nil, stream.Credit{} // not worth a frame yet
	}
	if s.l.c.OverBudget() {
		if !s.parked {
			s.parked = true
			s.l.park(s)
		}
		return nil, stream.Credit{}
	}
	s.passed.Chunks += give.Chunks
	s.passed.Bytes += give.Bytes
	return s.feed, give
}

// Attach implements stream.Sink: the relay leg starts with the caller's
// chunks (up to MaxRelayCredit) and relayStartBytes; its window grows to
// its share of the budget as chunks come (topUp). Starting with the
// whole share, streams opened together would each take the share of the
// few before them (budget / 1, / 2, …), some ln(n) budgets in all.
func (s *servedStream) Attach(feed func(stream.Credit)) stream.Credit {
	s.mu.Lock()
	defer s.mu.Unlock()
	if (feed == nil) != (s.feed == nil) {
		if feed != nil {
			s.l.relays.Add(1)
		} else {
			s.l.relays.Add(-1)
		}
	}
	s.feed = feed
	if feed == nil {
		return stream.Credit{}
	}
	start := min(uint64(s.l.relayShare()), relayStartBytes)
	s.passed.Chunks = min(s.granted.Chunks, s.sent.Chunks+MaxRelayCredit)
	s.passed.Bytes = s.sent.Bytes + start
	if s.byteW {
		s.passed.Bytes = max(min(s.passed.Bytes, s.granted.Bytes), s.sent.Bytes+1)
	}
	return stream.Credit{Chunks: s.passed.Chunks - s.sent.Chunks, Bytes: s.passed.Bytes - s.sent.Bytes}
}

// Chunk implements stream.Sink: a relayed chunk, within what was passed
// on to the feeder. It is queued under the stream's lock, so that no
// chunk follows the end (serveOne ends the stream under it first).
func (s *servedStream) Chunk(data []byte) *envelope.Error {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return envelope.NewError(envelope.CodeCancelled, "the stream's caller is gone")
	}
	if s.sent.Chunks >= s.passed.Chunks || s.sent.Bytes >= s.passed.Bytes {
		s.mu.Unlock()
		return stream.BeyondCredit()
	}
	s.sent.Chunks++
	s.sent.Bytes += uint64(len(data))
	s.l.sendChunk(s.seq, s.sent.Chunks, data)
	s.mu.Unlock()
	s.topUp() // after the chunk is queued: the budget sees it
	return nil
}

// Send implements stream.Sender: it waits for credit, then sends. Safe
// for concurrent use (chunks go out in the order their senders took
// credit).
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
		if s.mayLocked() {
			s.sent.Chunks++
			s.sent.Bytes += uint64(len(data))
			ok := s.l.sendChunk(s.seq, s.sent.Chunks, data)
			more := s.mayLocked()
			s.mu.Unlock()
			if more {
				s.wake() // another sender may be waiting for what is left
			}
			if !ok {
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
	return s.sent.Chunks
}

// end ends the stream (its handler returned) and returns the chunks
// sent: after it no chunk is queued (Chunk and Send check ended under
// the lock they queue under).
func (s *servedStream) end() uint64 {
	s.mu.Lock()
	s.ended = true
	n := s.sent.Chunks
	s.mu.Unlock()
	s.wake()
	s.cancel()
	return n
}

// sendChunk queues the n-th chunk of the stream seq.
func (l *Link) sendChunk(seq, n uint64, data []byte) bool {
	b := GetBuf()
	*b = l.appendChunk(*b, seq, n, data)
	return l.c.SendCredited(b)
}

// grantCredit queues a grant of c to the stream seq.
func (l *Link) grantCredit(seq uint64, c stream.Credit) {
	b := GetBuf()
	*b = l.appendCredit(*b, seq, c.Chunks, c.Bytes)
	l.c.SendControl(b)
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
		return nil, envelope.NewError(envelope.CodeInvalidRequest, "a streaming call needs a consumer for its chunks (stream.With)").WithAttempts(1)
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

	credit := sink.Attach(func(c stream.Credit) { l.grantCredit(seq, c) })
	if credit.Chunks == 0 {
		l.forget(seq, ch)
		return nil, envelope.NewError(envelope.CodeInternal, "a stream's consumer granted no credit").WithAttempts(1)
	}
	r := *req
	r.Headers.SetDeadline(ctx)
	b := GetBuf()
	*b = l.appendStreamRequest(*b, seq, &r, credit.Chunks, credit.Bytes)
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
		*cb = l.appendCancel(*cb, seq)
		l.c.SendControl(cb)
		res = linkResult{err: envelope.AsError(ctx.Err())}
	}
	if res.err == nil {
		return res.res, nil
	}
	return nil, streamError(res.err, cs.n.Load())
}

// streamError is the error a stream ended with after n chunks: once a
// chunk was delivered the stream is never retried nor redirected (the
// attempts mark; not marked not-sent), and the error tells the last
// sequence number delivered (details {"lastSeq": n}, unless the error
// carries details of its own).
func streamError(e *envelope.Error, n uint64) *envelope.Error {
	if n == 0 {
		return e
	}
	if len(e.Data) == 0 {
		e = e.WithData(map[string]uint64{"lastSeq": n})
	}
	if e.NotSent() {
		e = e.WithMaybeSent()
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
	*cb = l.appendCancel(*cb, f.Seq)
	l.c.SendControl(cb)
	l.deliver(f.Seq, linkResult{err: err})
}

// onCredit hands a grant to the stream this side serves (the reader).
func (l *Link) onCredit(f *envelope.Frame) {
	l.mu.Lock()
	s, _ := l.serving[f.Seq].(*servedStream)
	l.mu.Unlock()
	if s != nil {
		s.grant(stream.Credit{Chunks: f.N, Bytes: f.Bytes})
	}
}

// relayShare is a relayed stream's share of the connection's budget.
func (l *Link) relayShare() int {
	return max(l.c.Budget()/int(max(l.relays.Load(), 1)), 1)
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
// below its budget (Conn.OnDrained).
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
