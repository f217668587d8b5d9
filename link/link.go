package link

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/envelope/binframe"
	"github.com/agentmesh/agentmesh/internal/deadline"
	"github.com/agentmesh/agentmesh/link/wsconn"
	"github.com/agentmesh/agentmesh/stream"
)

// Link is one native-envelope WebSocket (agentmesh.v2 or v1) between
// two parties that may both call and serve: hub and agent, or hub and SDK
// client. Many calls are multiplexed over it, paired by a link-scoped seq.
//
// A Link is safe for concurrent use. When it closes, every call waiting on
// it fails at once with UNAVAILABLE, and every handler it started sees its
// context cancelled.
type Link struct {
	c       *Conn
	v2      bool // binary frames (agentmesh.v2): set in New, from the negotiated subprotocol
	lim     envelope.Limits
	serve   func(context.Context, *Link, *envelope.Request) (*envelope.Response, error) // handles incoming requests; nil refuses them
	log     *slog.Logger
	backend string

	seq     atomic.Uint64
	mu      sync.Mutex
	pending map[uint64]chan linkResult
	// async holds the calls made with Go (nil until the first), and
	// asyncDeadlines their deadlines, one timer for all; both under mu.
	async          map[uint64]*asyncCall
	asyncDeadlines asyncHeap
	streams        map[uint64]*callerStream   // streaming calls awaiting chunks (nil until the first)
	parked         map[*servedStream]struct{} // relayed streams waiting for the connection to drain
	relays         atomic.Int64               // served streams with a feeder attached (relayed)
	serving        map[uint64]Canceler
	closed         bool

	ctx    context.Context // cancelled when the link closes
	cancel context.CancelFunc
	// base is ctx without its cancellation: the parent of every served
	// request's context. A child of ctx would register with it and leave
	// it again, under ctx's lock, once per request; closing the link
	// cancels every served request through the serving map.
	base context.Context
	wg   sync.WaitGroup // workers serving incoming requests
	work chan task      // hands a request to an idle worker
	// results pools the calls' answer channels. It is the link's own, not
	// a package-wide pool: a channel made inside a testing/synctest bubble
	// belongs to that bubble, and one handed to a link of another bubble
	// (or of none) is a fatal error there; a link lives in one bubble.
	results sync.Pool

	accepted bool // accepted by a hub (not dialled): told goaway when it drains
	// goaway is closed when the peer sent a goaway frame; made by the
	// first to want it (GoAway, the frame), for the hub's accepted links
	// never watch it: 100 bytes less per idle link.
	goaway     atomic.Pointer[chan struct{}]
	goneAway   atomic.Bool // the peer's goaway came (goaway closed once, by whoever set it)
	sentGoAway sync.Once   // SendGoAway's frame, queued once; callers wait for it

	maxServing int
	fast       FastHandler
	inline     func(method string) bool // WithInline
	inlineN    atomic.Int32             // inline requests being served (not in the serving map)
	nserving   atomic.Int64
	late       atomic.Int64 // responses for calls no longer waiting
	onClose    func(*Link, error)
	owner      any    // set by whoever accepted or dialled it (WithOwner)
	Remote     string // the peer's address, for logs
	hubPeer    bool   // a link to another hub (WithHubPeer)
	callBound  bool   // accepted: running calls are bounded (not WithoutCallBound)
	parent     context.Context
}

// framePool holds the frames readers decode into, one per message being
// decoded: a Frame per link would be 600 bytes more per idle link, and
// would keep its last message alive.
var framePool = sync.Pool{New: func() any { return new(envelope.Frame) }}

type linkResult struct {
	res  *envelope.Response
	err  *envelope.Error
	lost bool // the link closed: not an answer from the peer
}

// Option configures a Link.
type Option func(*Link)

// WithHandler sets the invoker that serves requests arriving on the link.
func WithHandler(h envelope.Invoker) Option {
	return func(l *Link) {
		l.serve = func(ctx context.Context, _ *Link, req *envelope.Request) (*envelope.Response, error) {
			return h(ctx, req)
		}
	}
}

// WithLogger sets the logger.
func WithLogger(lg *slog.Logger) Option { return func(l *Link) { l.log = lg } }

// WithOnClose sets a hook called once, after the link closed and its
// pending calls were failed.
func WithOnClose(f func(*Link, error)) Option { return func(l *Link) { l.onClose = f } }

// WithOwner attaches v to the link, for whoever accepted or dialled it
// (a hub keeps the peer's principal there): Owner returns it.
func WithOwner(v any) Option { return func(l *Link) { l.owner = v } }

// WithContext sets the parent of the link's context and of every served
// request's context (default context.Background()): values set once per
// link reach each request without a cost per request. Its cancellation
// does not close the link.
func WithContext(ctx context.Context) Option {
	return func(l *Link) { l.parent = context.WithoutCancel(ctx) }
}

// Owner returns what WithOwner attached (nil if nothing).
func (l *Link) Owner() any { return l.owner }

// Accepted marks a link accepted by a hub (not dialled): it is told
// goaway when the hub drains, and what it owes the peer is bounded
// (Config.MaxUnwrittenBytes, MaxUnwrittenCalls).
func Accepted() Option { return func(l *Link) { l.accepted = true; l.callBound = true } }

// WithoutCallBound lifts an accepted link's bound on running calls: a
// peer hub's link carries every caller of that hub, each bounded there,
// and one of them must not refuse the others' calls (only a peer hub
// that does not read is paused).
func WithoutCallBound() Option { return func(l *Link) { l.callBound = false } }

// IsAccepted reports whether the link was accepted (Accepted), not dialled.
func (l *Link) IsAccepted() bool { return l.accepted }

// WithHubPeer marks a link to another hub: the responses it carries were
// encoded and checked by that hub, so one that fails its checks was
// damaged on the way; its call is answered UNAVAILABLE (indeterminate:
// the callee may have run), as for a lost link, not INTERNAL.
func WithHubPeer() Option { return func(l *Link) { l.hubPeer = true } }

// WithMaxServing bounds the requests served concurrently for the peer
// (default 10,000); past it the peer gets OVERLOADED at once.
func WithMaxServing(n int) Option { return func(l *Link) { l.maxServing = n } }

// New starts a Link over an established WebSocket. It starts the
// link's reader and writer goroutines; Close stops them.
func New(ws *websocket.Conn, cfg Config, opts ...Option) *Link {
	d := cfg.WithDefaults()
	return NewShared(ws, &d, opts...)
}

// NewShared is New with a configuration the links of one server share
// (wsconn.NewConnShared): defaults set, never changed afterwards.
func NewShared(ws *websocket.Conn, cfg *Config, opts ...Option) *Link {
	c := wsconn.NewConnShared(ws, cfg)
	c.Batched() // both ends of a native link read batches
	lim := c.Config().Limits
	v2 := ws.Subprotocol() == envelope.SubprotocolV2
	if v2 {
		c.Binary()
		c.SetCheck(binframe.Precheck)
	} else {
		c.SetCheck(envelope.PrecheckFrames)
	}
	l := &Link{
		c:          c,
		v2:         v2,
		lim:        lim,
		pending:    map[uint64]chan linkResult{},
		serving:    map[uint64]Canceler{},
		log:        slog.New(slog.DiscardHandler),
		backend:    "WebSocket",
		maxServing: 10000,
		work:       make(chan task),
		parent:     context.Background(),
		Remote:     ws.RemoteAddr().String(),
	}
	l.results.New = newResultChan
	for _, o := range opts {
		o(l)
	}
	if l.accepted {
		// The hub serves this peer's calls: bound what it owes it
		// (Config.MaxUnwrittenBytes). Only the accepting side
		// pauses its reader, so two ends never wait on each other.
		c.WithBackpressure()
		if !l.callBound {
			c.NoCallBound()
		}
	} else {
		c.TrackRoom() // a dialled link (a client's, an agent's): its lone frames are written by their senders too
	}
	c.OnDrained(l.unpark)
	l.ctx, l.cancel = context.WithCancel(l.parent)
	l.base = context.WithoutCancel(l.ctx)
	l.c.Start(l.onMessage, l.connClosed)
	return l
}

// Shutdown starts closing the link with err (a *envelope.Error's code
// picks the close frame) without waiting: safe from any goroutine.
func (l *Link) Shutdown(err error) { l.c.Shutdown(err) }

// Context returns a context cancelled when the link closes.
func (l *Link) Context() context.Context { return l.ctx }

// Pending returns how many calls on this link await an answer.
func (l *Link) Pending() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.pending) + len(l.async)
}

// Serving returns how many requests from the peer this side is serving.
func (l *Link) Serving() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.serving) + int(l.inlineN.Load())
}

// quiet reports that the link serves nothing and has nothing left to write.
func (l *Link) Quiet() bool { return l.Serving() == 0 && l.c.Unwritten() == 0 }

// GoAway is closed once the peer sent a goaway frame: it takes no new
// requests on this link. The link stays open for the answers still due.
func (l *Link) GoAway() <-chan struct{} { return l.goawayChan() }

func (l *Link) goawayChan() chan struct{} {
	if p := l.goaway.Load(); p != nil {
		return *p
	}
	ch := make(chan struct{})
	if l.goaway.CompareAndSwap(nil, &ch) {
		return ch
	}
	return *l.goaway.Load()
}

// goingAway reports whether the peer sent a goaway frame.
func (l *Link) GoingAway() bool { return l.goneAway.Load() }

// SendGoAway tells the peer, once, that this side takes no new requests
// on the link (a draining hub). It does not close the link. It returns
// once the frame is queued, also when another goroutine queued it, so
// that a frame its caller queues next follows the goaway.
func (l *Link) SendGoAway() {
	l.sentGoAway.Do(func() {
		b := GetBuf()
		*b = l.appendGoAway(*b)
		l.c.Send(b)
	})
}

// Done is closed when the link has closed.
func (l *Link) Done() <-chan struct{} { return l.c.Done() }

// Stalled reports that the link has read nothing for longer than a ping
// and its pong take (wsconn.Conn.Stalled): it will be closed as dead
// unless something arrives.
func (l *Link) Stalled() bool { return l.c.Stalled() }

// LastHeard is when the link last read something (wsconn.Conn.LastHeard).
func (l *Link) LastHeard() time.Time { return l.c.LastHeard() }

// Err reports why the link closed (nil while open).
func (l *Link) Err() error {
	select {
	case <-l.c.Done():
		return l.c.Err()
	default:
		return nil
	}
}

// Close closes the link and waits for its goroutines, including handlers
// it started (their contexts are cancelled first).
func (l *Link) Close() {
	l.c.Close()
	l.wg.Wait()
}

// newResultChan makes a call's answer channel (Link.results pools them).
func newResultChan() any { return make(chan linkResult, 1) }

// Call sends req over the link and waits for its answer, the link's loss,
// or ctx's end. The time left on ctx travels in the ttl header; when ctx
// ends first, the peer is told to cancel. A full send queue (Config.
// QueueSize) is waited on too, within ctx: a thousand goroutines calling
// at once are all sent, in turn.
//
// A request with Stream set is a streaming call: its chunks go to the
// sink ctx carries (stream.With), which grants its credit, and the call
// returns at the stream's end. Once a chunk was delivered, its error is
// final (never retried) and tells the last sequence number (streamError).
func (l *Link) Call(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
	if req.Stream {
		return l.callStream(ctx, req)
	}
	if at, parentDone, ok := deadline.Lazy(ctx); ok {
		return l.callInHeap(ctx, req, at, parentDone)
	}
	seq := l.seq.Add(1)
	ch := l.results.Get().(chan linkResult)
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		l.results.Put(ch)
		return nil, UnavailableNotSent("link closed")
	}
	l.pending[seq] = ch
	l.mu.Unlock()

	r := *req
	r.Headers.SetDeadline(ctx)
	b := GetBuf()
	*b = l.appendRequest(*b, seq, &r)
	if !l.c.SendCtx(ctx, b) { // a full queue is waited on, within the call's deadline
		l.forget(seq, ch)
		if ctx.Err() == nil || l.Err() != nil {
			return nil, UnavailableNotSent("link closed")
		}
		return nil, envelope.AsError(ctx.Err()).MarkNotSent()
	}
	select {
	case res := <-ch:
		l.results.Put(ch)
		if res.err != nil {
			return nil, res.err
		}
		return res.res, nil
	case <-ctx.Done():
		if !l.forget(seq, ch) {
			// The answer came as the call gave up: a deliverer holds
			// it and is about to hand it over. Take it, to drop it.
			if r := <-ch; !r.lost {
				l.lateResponse()
			}
			l.results.Put(ch)
		}
		cb := GetBuf()
		*cb = l.appendCancel(*cb, seq)
		l.c.TrySend(cb)
		return nil, envelope.AsError(ctx.Err())
	}
}

// forget removes a pending call and reports whether it was still there.
// If a deliverer already took the entry it will send on ch exactly once,
// so ch is then not returned to the pool here.
func (l *Link) forget(seq uint64, ch chan linkResult) (mine bool) {
	l.mu.Lock()
	_, mine = l.pending[seq]
	delete(l.pending, seq)
	l.mu.Unlock()
	if mine {
		l.results.Put(ch)
	}
	return mine
}

// UnavailableNotSent is UNAVAILABLE for a request that provably never
// left this side: safe to retry even when not idempotent.
func UnavailableNotSent(msg string) *envelope.Error {
	return envelope.NewError(envelope.CodeUnavailable, msg).MarkNotSent()
}

func (l *Link) onMessage(data []byte, refused *envelope.Error) {
	if refused != nil {
		l.onRefused(data, refused)
		return
	}
	// The reader checked the message (c.check, PrecheckFrames, set in
	// New): decode it without a second scan.
	f := framePool.Get().(*envelope.Frame)
	if l.v2 {
		// Bodies unchecked: see onFrame, FastHandler and Completion.
		binframe.Each(data, l.lim, false, f, l.onFrame)
	} else {
		envelope.EachCheckedFrame(data, f, l.onFrame)
	}
	*f = envelope.Frame{} // let the message go
	framePool.Put(f)
}

// onRefused handles a message refused by its message-level checks
// (invalid JSON or UTF-8, nesting too deep); head is its beginning. When
// the head names the frame it was (a request or a response, and its
// seq), the error goes where the frame would have: to the peer, as the
// answer to its request, or to the call on this side that awaited the
// response. Otherwise nothing can be answered, and the caller on the
// other side would wait for its timeout: the link is closed with 1007
// (invalid payload), so that its calls fail at once and it reconnects.
func (l *Link) onRefused(head []byte, refused *envelope.Error) {
	typ, seq, ok := l.recoverFrameSeq(head)
	if refused == binframe.ErrDamaged {
		ok = false // a damaged stream: no seq in it is to be believed
	}
	answerable := ok && (typ == envelope.FrameRequest || typ == envelope.FrameResponse)
	// Counted before the peer can see the outcome (an answer or a close),
	// so that whoever saw it also sees it counted.
	if l.c.Config().InvalidFrame != nil {
		outcome := "answered"
		if !answerable {
			outcome = "closed"
		}
		l.c.Config().InvalidFrame(outcome)
	}
	switch {
	case ok && typ == envelope.FrameRequest:
		l.reply(seq, nil, refusal(refused))
	case ok && typ == envelope.FrameResponse:
		l.deliver(seq, linkResult{err: l.undecodable(refused)})
	default:
		l.log.Warn("closing the link: a frame failed its checks and names no seq to answer", "remote", l.Remote, "error", refused.Error())
		text := "invalid frame: " + refused.Message
		if len(text) > 120 { // a close frame carries at most 123 bytes of text
			text = text[:120]
		}
		l.c.Shutdown(wsconn.CloseWith(websocket.CloseInvalidFramePayloadData, text))
	}
}

// refusal is the answer to a request this side refused before any
// handler saw it (its frame failed its checks): not sent.
func refusal(e *envelope.Error) *envelope.Error {
	cp := *e // e may be shared (a decoder's sentinel)
	return cp.MarkNotSent()
}

// undecodable is the error of a call whose response failed its checks.
func (l *Link) undecodable(e *envelope.Error) *envelope.Error {
	if l.hubPeer {
		return envelope.Errorf(envelope.CodeUnavailable, "response damaged on the link to the peer hub: %s", e.Message)
	}
	return envelope.Errorf(envelope.CodeInternal, "undecodable response from peer: %s", e.Message)
}

// onFrame handles one decoded frame; f is the reader's scratch frame
// (framePool), overwritten by the next: what outlives the call is copied
// out of it.
func (l *Link) onFrame(f *envelope.Frame, err *envelope.Error) {
	if err == nil && l.v2 {
		err = l.checkBodies(f)
	}
	if err != nil {
		if f.Type == envelope.FrameRequest && f.Seq != 0 {
			b := GetBuf()
			*b = l.appendResponse(*b, f.Seq, nil, refusal(err))
			l.c.Send(b)
			return
		}
		if (f.Type == envelope.FrameResponse || f.Type == envelope.FrameEnd) && f.Seq != 0 {
			l.deliver(f.Seq, linkResult{err: l.undecodable(err)})
			return
		}
		l.log.Warn("dropping undecodable frame", "remote", l.Remote, "error", err.Error())
		return
	}
	switch f.Type {
	case envelope.FrameResponse:
		l.onResponse(f)
	case envelope.FrameRequest:
		l.startServing(f.Seq, &f.Request, stream.Credit{Chunks: f.N, Bytes: f.Bytes})
	case envelope.FrameChunk:
		l.onChunk(f)
	case envelope.FrameCredit:
		l.onCredit(f)
	case envelope.FrameEnd:
		l.onResponse(f)
	case envelope.FrameCancel:
		l.mu.Lock()
		c := l.serving[f.Seq]
		l.mu.Unlock()
		if c != nil {
			c.CancelServed()
		}
	case envelope.FrameGoAway:
		if l.goneAway.CompareAndSwap(false, true) {
			close(l.goawayChan())
		}
	}
}

// onResponse hands a response to the call awaiting it: a Call's gets a
// copy, a Go call's completion the reader's frame itself (Completion).
func (l *Link) onResponse(f *envelope.Frame) {
	if f.Err != nil && l.hubPeer && f.Err.NotSent() && (f.Err.Code == envelope.CodeInvalidRequest || f.Err.Code == envelope.CodeParseError) {
		// The peer hub's link refused a request of ours as malformed
		// before any handler saw it (refusal): this hub encoded it, so
		// it was damaged on the way, as a damaged response is
		// (undecodable). Not sent: safe to try again.
		f.Err = envelope.Errorf(envelope.CodeUnavailable, "request damaged on the link to the peer hub: %s", f.Err.Message).MarkNotSent()
	}
	l.mu.Lock()
	if ch, ok := l.pending[f.Seq]; ok {
		delete(l.pending, f.Seq)
		l.mu.Unlock()
		if e := l.CheckBody("result", f.Response.Result); e != nil && f.Err == nil {
			ch <- linkResult{err: l.undecodable(e)}
			return
		}
		if f.Err != nil {
			ch <- linkResult{err: f.Err}
		} else {
			res := f.Response
			ch <- linkResult{res: &res}
		}
		return
	}
	done := l.takeAsyncLocked(f.Seq)
	l.mu.Unlock()
	switch {
	case done == nil:
		l.lateResponse()
	case f.Err != nil:
		done.Complete(nil, f.Err)
	default:
		done.Complete(&f.Response, nil)
	}
}

func (l *Link) deliver(seq uint64, r linkResult) {
	l.mu.Lock()
	ch, ok := l.pending[seq]
	if ok {
		delete(l.pending, seq)
	}
	l.mu.Unlock()
	if ok {
		ch <- r // buffered 1, and only one deliverer removes the entry
		return
	}
	if l.deliverAsync(seq, r) {
		return
	}
	// The call gave up (its deadline passed or it was cancelled) before
	// the answer came: drop it, and count it.
	l.lateResponse()
}

func (l *Link) lateResponse() {
	l.late.Add(1)
	if l.c.Config().LateResponse != nil {
		l.c.Config().LateResponse()
	}
}

// LateResponses returns how many responses arrived on this link for calls
// that were no longer waiting (timed out or cancelled); they were dropped.
func (l *Link) LateResponses() int64 { return l.late.Load() }

func (l *Link) reply(seq uint64, res *envelope.Response, e *envelope.Error) {
	b := GetBuf()
	*b = l.appendResponse(*b, seq, res, e)
	l.c.Send(b)
}

// connClosed runs once when the connection closes: it fails every pending
// call and cancels every handler.
func (l *Link) connClosed(err error) {
	l.mu.Lock()
	l.closed = true
	pending := l.pending
	l.pending = map[uint64]chan linkResult{}
	serving := make([]Canceler, 0, len(l.serving))
	for _, c := range l.serving {
		serving = append(serving, c)
	}
	l.mu.Unlock()
	l.cancel()
	for _, c := range serving {
		c.CancelServed() // served requests' contexts derive from l.base, not l.ctx
	}
	for _, ch := range pending {
		ch <- linkResult{err: envelope.WrapError(envelope.CodeUnavailable, "link to peer lost", err), lost: true}
	}
	l.failAsync(func() *envelope.Error { return envelope.WrapError(envelope.CodeUnavailable, "link to peer lost", err) })
	if l.onClose != nil {
		l.onClose(l, err)
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Drain closes l once busy() reports nothing left on it (calls it
// awaits, requests it serves) and nothing is left to write (twice in a
// row, 10 ms apart), the link closed, or ctx ended: what a party does
// with a link whose hub sent a goaway.
func Drain(ctx context.Context, l *Link, busy func() int) {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for quiet := 0; quiet < 2; {
		if busy() > 0 || l.c.Unwritten() > 0 {
			quiet = 0
		} else {
			quiet++
		}
		select {
		case <-t.C:
		case <-l.Done():
		case <-ctx.Done():
		}
		if l.Err() != nil || ctx.Err() != nil {
			break
		}
	}
	l.Close()
}
