package wsconn

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/mono"
)

// Config tunes one WebSocket connection. The zero value takes the defaults.
type Config struct {
	// PingInterval is how often a ping goes out (default 5 s). TCP does not
	// notice a vanished peer for ~15 minutes on these hosts, so every link
	// carries its own heartbeat.
	PingInterval time.Duration
	// IdleTimeout closes the connection when nothing (not even a pong)
	// arrived for that long (default 2 × PingInterval: dead after two
	// missed pings, RELIABILITY.md S21).
	IdleTimeout time.Duration
	// PeerPingMin is the shortest sustained interval allowed between the
	// peer's pings (default 1 s, or PingInterval if shorter, so that a peer
	// configured like this side is never cut off; negative: no limit). A
	// peer that pings faster, beyond a burst of pingBurst, is closed with
	// 1008 "too many pings", as gRPC answers an abusive client with GOAWAY
	// ENHANCE_YOUR_CALM.
	PeerPingMin time.Duration
	// WriteTimeout bounds one write, so a stuck peer cannot pin the writer
	// (default 10 s).
	WriteTimeout time.Duration
	// QueueSize bounds frames waiting for the writer (default 256; with
	// batching, one write drains up to 128 of them).
	QueueSize int
	// MaxUnwrittenBytes bounds, on a connection the hub serves calls on
	// (a plain JSON-RPC WebSocket, or a native link a client or agent
	// opened), the bytes of the requests admitted and not yet answered
	// plus the bytes of the answers queued for the writer or being
	// written (default 4 MiB; negative: no bound). A call read past it is
	// refused OVERLOADED, not sent (tryAdmit). When the answers alone
	// reach it, the peer is not reading: the hub stops reading the
	// connection until they fall below it, so that such a client fills
	// its own socket, not the hub's memory. 4 MiB is 128 calls of 32 KiB
	// in flight, far beyond what a multiplexing client such as meshctl
	// bench -c 128 holds with ordinary params. What a client that stops
	// reading makes the hub hold grows with it (measured: RSS about 2.5 ×
	// the bound + 6 MiB, the garbage collector's headroom included).
	MaxUnwrittenBytes int
	// MaxUnwrittenCalls bounds, on the same connections, the calls
	// admitted whose answers are not yet written (default 4096; negative:
	// no bound), as MaxUnwrittenBytes does.
	MaxUnwrittenCalls int
	// CloseGrace is how long a connection closed as a slow consumer is
	// kept after its close frame went to the kernel (default 2 s): the
	// hub discards what the peer still sends, so that the socket is not
	// reset (a reset would drop the close frame still queued), until the
	// peer's kernel has taken every byte or the grace ends.
	CloseGrace time.Duration
	// JSONFrames makes a dialled link offer only the JSON frames
	// (agentmesh.v1). By default it offers the binary frames
	// (agentmesh.v2) first, and speaks v1 with a hub that has only v1.
	JSONFrames bool
	// Limits bound each incoming message (default 1 MiB, depth 64).
	Limits envelope.Limits
	// TLS configures the dialler for wss:// hubs (ClientTLS); nil: the
	// system's roots, no client certificate.
	TLS *tls.Config
	// Dial, if set, opens the connection a dialled link runs over instead
	// of TCP (tests: an in-memory network, internal/memnet). nil: TCP.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Bytes, if set, is told the size of every message read (in) and
	// written (out), for metrics. It must not block.
	Bytes func(in, out int)
	// PingAbuse, if set, is told when the connection is closed because the
	// peer pinged too often (PeerPingMin). For metrics; it must not block.
	PingAbuse func()
	// LateResponse, if set, is told of every response that arrives on a
	// link for a call no longer waiting (timed out or cancelled): it is
	// dropped, never delivered. For metrics; it must not block.
	LateResponse func()
	// InvalidFrame, if set, is told of every native message refused by
	// its message-level checks (invalid JSON or UTF-8, nesting too deep):
	// "answered" when its seq was recovered and its caller told, "closed"
	// when it was not and the link was closed 1007. For metrics; it must
	// not block.
	InvalidFrame func(outcome string)
	// SlowConsumer, if set, is told when the connection is closed 1008
	// "slow consumer": its writer made no progress for WriteTimeout. For
	// metrics; it must not block.
	SlowConsumer func()
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.PingInterval <= 0 {
		c.PingInterval = 5 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 2 * c.PingInterval
	}
	if c.PeerPingMin == 0 {
		c.PeerPingMin = min(time.Second, c.PingInterval)
	}
	if c.WriteTimeout <= 0 {
		c.WriteTimeout = 10 * time.Second
	}
	if c.QueueSize <= 0 {
		c.QueueSize = 256
	}
	if c.MaxUnwrittenBytes == 0 {
		c.MaxUnwrittenBytes = 4 << 20
	}
	if c.MaxUnwrittenCalls == 0 {
		c.MaxUnwrittenCalls = 4096
	}
	if c.CloseGrace <= 0 {
		c.CloseGrace = 2 * time.Second
	}
	if c.Limits.MaxBytes <= 0 {
		c.Limits.MaxBytes = envelope.DefaultLimits().MaxBytes
	}
	if c.Limits.MaxDepth <= 0 {
		c.Limits.MaxDepth = envelope.DefaultLimits().MaxDepth
	}
	return c
}

// Conn runs one WebSocket with one reader goroutine and at most one
// writer goroutine (gorilla allows no more). Frames to send go into a
// bounded queue; the writer is started when a frame is queued and exits
// after writerLinger with nothing to write, so an idle connection holds
// one goroutine and no queue; an accepted one hands its reader's wait to
// a fresh goroutine with a small stack (frameReader). Pings go out from a timer; every write,
// data or control, goes through the connection's wire (frame.go). onMessage runs on
// the reader goroutine and must not block.
type Conn struct {
	ws    *websocket.Conn
	wire  wire    // what is written (this side frames: frame.go; it reads an accepted connection's frames too, readframe.go, and gorilla a dialled one's)
	cfg   *Config // shared by the connections of one server (NewConnShared)
	batch bool    // frames queued together go out as one message (native links only): a JSON array, or (binary) one after another
	// binary: the frames are binary (agentmesh.v2); msgType is the
	// messages' WebSocket type.
	binary  bool
	msgType int
	// check, if set, refuses a message in the read buffer, before it is
	// copied out: onMessage then gets only its head and the refusal.
	check     func([]byte, envelope.Limits) *envelope.Error // with the connection's limits: a plain func, not a closure per link
	fr        *frameReader                                  // reads an accepted connection's frames (nil: gorilla does)
	closing   chan struct{}
	closeOnce sync.Once
	err       error // why it closed; read after closing is closed
	onClose   func(error)
	wg        sync.WaitGroup
	pings     pingPolicy // the peer's pings; reader goroutine only
	ping      *time.Timer

	qmu      sync.Mutex
	q        []*[]byte     // frames waiting for the writer
	spare    []*[]byte     // the writer's emptied batch, reused as the next queue
	writerOn bool          // a writer goroutine runs (or is about to)
	idle     bool          // the writer waits for frames on wake
	closed   bool          // no more frames are taken
	room     chan struct{} // closed when the writer takes a batch, for senders waiting on a full queue
	wake     chan struct{} // tells an idle writer that frames are queued
	writing  atomic.Int32  // frames the writer took and has not written yet

	// Backpressure (bp), on the connections the hub serves calls on: see
	// Config.MaxUnwrittenBytes and admit, release, underBounds.
	bp          bool
	noCallBound bool          // running calls are not bounded here (a peer hub's link: the origin hub bounds its callers)
	acc         []int32       // per frame in q: the bytes it counts (0: a frame of this side's own, not owed); under qmu
	qbytes      atomic.Int64  // bytes of the owed frames queued or being written; changed under qmu
	qowed       atomic.Int64  // those frames; changed under qmu
	inCalls     atomic.Int64  // calls admitted whose answers are not queued yet
	inBytes     atomic.Int64  // their requests' bytes
	paused      atomic.Bool   // the reader waits for the counts to fall
	resume      chan struct{} // closed when the paused reader may go on; under qmu
	raw         syscall.RawConn
	// wraw is the plain TCP or unix socket's RawConn, set by TrackRoom
	// and never changed (raw may be dropped by waitSendRoom): writeWire
	// tries it first (tryWrite). nil under TLS or any other conn.
	wraw     syscall.RawConn
	roomKept atomic.Bool // raw is set: the writer keeps room for a close frame
	credit   int         // bytes the kernel can take without a new look (under wmu)
	// wmu is held by whoever writes data messages: the writer goroutine,
	// or a sender writing its frame itself (enqueueLimit: writeInline).
	wmu        sync.Mutex
	lastQueued int64        // mono: when the last frame was queued (under qmu; lone)
	prevQuiet  bool         // it came after a quiet inlineGap (under qmu)
	inlined    atomic.Int64 // frames their senders wrote (tests)
	lingering  atomic.Bool  // closed as a slow consumer: the reader lingers, then closes
	heard      atomic.Int64 // mono: when the reader last moved its deadline (it read something); 0 while paused
	pingsSent  atomic.Int64 // pings this side wrote (tests)
	peerPinged atomic.Int64 // unix nanos: when the peer's last ping arrived
	quit       atomic.Bool  // Close was called: a linger ends at once
	// drained, if set, runs (on the writer) after a write that left the
	// bytes owed under the budget, once drainWanted was set: relayed
	// streams parked on the budget go on (Link.unpark).
	drained     func()
	drainWanted atomic.Bool
}

// writerLinger is how long a writer goroutine waits for more frames
// before it exits. Under load it never exits; an idle link loses its
// writer (and the writer's stack) soon after its last frame.
const writerLinger = time.Second

// unwritten reports frames queued or being written.
func (c *Conn) Unwritten() int {
	c.qmu.Lock()
	n := len(c.q)
	c.qmu.Unlock()
	return n + int(c.writing.Load())
}

func NewConn(ws *websocket.Conn, cfg Config) *Conn {
	d := cfg.WithDefaults()
	return NewConnShared(ws, &d)
}

// NewConnShared is NewConn with a configuration that many connections
// share (a server's: 144 bytes less per idle link). It must have its
// defaults set (WithDefaults) and must not change afterwards; one that
// lacks them is copied with them set.
func NewConnShared(ws *websocket.Conn, cfg *Config) *Conn {
	if cfg.PingInterval <= 0 || cfg.IdleTimeout <= 0 || cfg.PeerPingMin == 0 || cfg.WriteTimeout <= 0 || cfg.QueueSize <= 0 || cfg.MaxUnwrittenBytes == 0 || cfg.MaxUnwrittenCalls == 0 || cfg.CloseGrace <= 0 || cfg.Limits.MaxBytes <= 0 || cfg.Limits.MaxDepth <= 0 {
		d := cfg.WithDefaults()
		cfg = &d
	}
	ws.SetReadLimit(int64(cfg.Limits.MaxBytes) + 1024)
	return &Conn{
		ws:      ws,
		wire:    newWire(ws),
		cfg:     cfg,
		closing: make(chan struct{}),
		wake:    make(chan struct{}, 1),
		pings:   newPingPolicy(cfg.PeerPingMin),
		msgType: websocket.TextMessage,
		fr:      newFrameReader(ws, cfg.Limits.MaxBytes+1024),
	}
}

// withBackpressure makes the reader pause at the bounds (MaxUnwrittenBytes,
// MaxUnwrittenCalls) and the writer hand the kernel whole frames only, so
// that a slow consumer can be closed with a close frame. Set before start.
func (c *Conn) WithBackpressure() {
	c.bp = true
	c.TrackRoom()
}

// TrackRoom makes the writer hand the kernel whole frames only, keeping
// room for a close frame, as WithBackpressure does, without its bounds;
// knowing the kernel's room also lets a lone frame be written by its
// sender (enqueueLimit). Set before Start. A connection that is not a
// socket writes as before.
func (c *Conn) TrackRoom() {
	c.raw = rawConn(c.ws.NetConn())
	if rawWrites && c.raw != nil && plainSocket(c.ws.NetConn()) {
		c.wraw = c.raw
	}
	c.roomKept.Store(c.raw != nil)
}

// tryAdmit counts calls read from the peer, of n bytes, until release,
// if they fit under the bounds with what already runs and what is owed;
// false: they are to be refused (OVERLOADED, not sent). Calls always fit
// when none runs, so that one larger than the bound still runs. Only
// the reader admits, so the check and the count need no lock.
func (c *Conn) TryAdmit(calls, n int) bool {
	if !c.bp || c.noCallBound {
		return true
	}
	if c.inCalls.Load() > 0 {
		if m := c.cfg.MaxUnwrittenBytes; m > 0 && c.qbytes.Load()+c.inBytes.Load()+int64(n) > int64(m) {
			return false
		}
		if m := c.cfg.MaxUnwrittenCalls; m > 0 && c.inCalls.Load()+c.qowed.Load()+int64(calls) > int64(m) {
			return false
		}
	}
	c.inCalls.Add(int64(calls))
	c.inBytes.Add(int64(n))
	return true
}

// release ends what admit counted: the calls' answers are queued (or
// there is none to send).
func (c *Conn) Release(calls, n int) {
	if !c.bp || c.noCallBound {
		return
	}
	c.inCalls.Add(-int64(calls))
	c.inBytes.Add(-int64(n))
	if c.paused.Load() {
		c.qmu.Lock()
		c.wakeReaderLocked()
		c.qmu.Unlock()
	}
}

// over reports whether the answers owed to the peer and not yet written
// reach a bound: the peer is not reading, and the reader pauses. Running
// calls do not pause it (tryAdmit refuses the calls past the bound
// instead): the same reader carries an agent's answers to the hub's
// calls, its heartbeats and cancels, which a pause would hold up while
// the agent's own long calls run (a review found an agent expired so).
func (c *Conn) over() bool {
	if m := c.cfg.MaxUnwrittenBytes; m > 0 && c.qbytes.Load() >= int64(m) {
		return true
	}
	if m := c.cfg.MaxUnwrittenCalls; m > 0 && c.qowed.Load() >= int64(m) {
		return true
	}
	return false
}

// wakeReaderLocked lets a paused reader go on once under the bounds.
func (c *Conn) wakeReaderLocked() {
	if c.resume != nil && (c.closed || !c.over()) {
		close(c.resume)
		c.resume = nil
	}
}

// underBounds waits, on the reader goroutine, until the connection is
// under its bounds; false if it closed meanwhile. While it waits nothing
// is read, so the idle deadline is lifted: the writer's own deadline
// closes a peer that does not read, and calls in flight end by theirs.
func (c *Conn) underBounds() (ok, waited bool) {
	if !c.over() {
		return true, false // a closed connection fails the next read
	}
	c.qmu.Lock()
	if c.closed || !c.over() {
		closed := c.closed
		c.qmu.Unlock()
		return !closed, false
	}
	_ = c.setReadDeadline(time.Time{})
	var keepalive *time.Timer
	for !c.closed {
		c.paused.Store(true) // before the check: release sees it or the check sees its count
		if !c.over() {
			break
		}
		ch := make(chan struct{})
		c.resume = ch
		c.qmu.Unlock()
		if keepalive == nil {
			keepalive = time.NewTimer(pausedPong)
		}
		select {
		case <-ch:
		case <-c.closing:
		case <-keepalive.C:
			// The peer's pings are not read while paused, nor answered:
			// an unsolicited pong (RFC 6455 5.5.3) keeps a peer that
			// reads, and counts pongs as life (this mesh's links do),
			// from taking the hub for dead while its long calls run.
			_ = writeControl(c, websocket.PongMessage, "", time.Now().Add(time.Second))
			keepalive.Reset(pausedPong)
		}
		c.qmu.Lock()
	}
	if keepalive != nil {
		keepalive.Stop()
	}
	c.paused.Store(false)
	c.resume = nil
	closed := c.closed
	c.qmu.Unlock()
	if !closed {
		_ = c.setReadDeadline(time.Now().Add(c.cfg.IdleTimeout))
	}
	return !closed, true
}

// pausedPong is how often a paused reader's connection sends the peer an
// unsolicited pong: under the 2.5 s in which a peer hub's link is dead
// (--peer-heartbeat 1 s), and a client's 10 s.
const pausedPong = time.Second

// setReadDeadline sets the read deadline from the reader goroutine. Once
// the connection lingers (closed as a slow consumer) the deadline is now,
// whatever the reader asked: shutdown sets lingering, then the deadline,
// so one of the two sees the other and the reader cannot move shutdown's
// wake-up away.
func (c *Conn) setReadDeadline(t time.Time) error {
	err := c.ws.SetReadDeadline(t)
	if t.IsZero() {
		c.heard.Store(0) // paused: not reading, so silence says nothing
	} else {
		h := mono.Of(t) - int64(c.cfg.IdleTimeout)
		if h == 0 {
			h = -1 // 0 says paused
		}
		c.heard.Store(h)
	}
	if c.lingering.Load() {
		err = c.ws.SetReadDeadline(time.Now())
	}
	return err
}

// readerExit ends the reader goroutine: a connection closed as a slow
// consumer lingers first (linger), and is closed here.
func (c *Conn) readerExit() {
	if c.lingering.Load() {
		c.linger()
		_ = c.ws.Close()
	}
	if c.fr != nil {
		c.fr.ra.release()
	}
}

// linger keeps a connection closed as a slow consumer open for up to
// CloseGrace after its close frame was handed to the kernel: it reads
// and discards what the peer still sends, for closing a socket with
// unread bytes resets it, and a reset drops what the kernel still holds
// to send, the close frame among it. It ends once the peer's kernel has
// taken every byte (from there a reset loses nothing the peer can still
// read), when the peer closes, or at the grace's end.
func (c *Conn) linger() {
	nc := c.ws.NetConn()
	end := time.Now().Add(c.cfg.CloseGrace)
	buf := make([]byte, 4096)
	for {
		if c.quit.Load() { // checked at least every 20 ms (the read's deadline)
			return
		}
		now := time.Now()
		if !now.Before(end) {
			return
		}
		if q, _, ok := sendQueue(c.raw); !ok || q == 0 {
			return
		}
		d := now.Add(20 * time.Millisecond)
		if d.After(end) {
			d = end
		}
		_ = nc.SetReadDeadline(d)
		if _, err := nc.Read(buf); err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				return
			}
		}
	}
}

// start runs the reader goroutine and the ping timer; onClose runs once,
// on the goroutine that noticed the end, after the connection is closed.
func (c *Conn) Start(onMessage func(data []byte, refused *envelope.Error), onClose func(error)) {
	c.onClose = onClose
	// c.ping is set before the timer can fire or shutdown can run.
	c.ping = time.AfterFunc(time.Hour, c.sendPing)
	first := c.cfg.PingInterval
	if c.wire.server && c.mayskip() {
		first += first / 4 // a peer that pings at the same interval pings first (pingWait)
	}
	c.ping.Reset(onPingGrid(time.Now(), first, c.cfg.PingInterval))
	c.wg.Add(1)
	go c.readLoop(onMessage, false)
}

// shutdown starts closing without waiting: safe from any goroutine.
func (c *Conn) Shutdown(err error) {
	c.closeOnce.Do(func() {
		if err == nil {
			err = errConnClosed
		}
		c.err = err
		c.qmu.Lock()
		c.closed = true
		dropped := c.q
		c.q = nil
		for _, n := range c.acc {
			if n > 0 {
				c.qbytes.Add(-int64(n))
				c.qowed.Add(-1)
			}
		}
		c.acc = nil
		if c.room != nil {
			close(c.room)
			c.room = nil
		}
		c.wakeReaderLocked()
		c.qmu.Unlock()
		for _, b := range dropped {
			PutBuf(b)
		}
		close(c.closing)
		if c.ping != nil {
			c.ping.Stop()
		}
		code, text := websocket.CloseNormalClosure, ""
		var ce *closeError
		switch {
		case errors.Is(err, errTooManyPings):
			code, text = websocket.ClosePolicyViolation, "too many pings"
		case errors.Is(err, errSlowConsumer):
			code, text = websocket.ClosePolicyViolation, "slow consumer"
			if c.cfg.SlowConsumer != nil {
				c.cfg.SlowConsumer() // counted before the peer can see the close
			}
		case errors.As(err, &ce):
			code, text = ce.code, ce.text
		}
		// No close frame to a peer that went silent (read deadline) or
		// stopped taking bytes (write timeout), nor to one that does not
		// read when the writer kept no room for the frame: it would not
		// arrive, and WriteControl waits up to its deadline for the
		// writer, which is stuck on the full socket buffer, delaying
		// onClose (the pending calls' UNAVAILABLE) by that second
		// (measured in the netns lab, S05: detection 3.5 s, not 2.5 s),
		// and whoever called Shutdown (a Multica sender, measured: the
		// refusal of its message to a stuck device came 1 s late).
		var ne net.Error
		timedOut := errors.As(err, &ne) && ne.Timeout()
		if !timedOut && (!errors.Is(err, ErrNotReading) || c.roomKept.Load()) {
			werr := writeControl(c, websocket.CloseMessage,
				websocket.FormatCloseMessage(code, text), time.Now().Add(time.Second))
			if werr == nil && errors.Is(err, ErrNotReading) {
				// The writer handed the kernel whole frames only, with
				// room to spare (waitSendRoom): the close frame follows
				// the last of them. The reader discards what the peer
				// still sends until the kernel delivered it (linger),
				// then closes; the deadline wakes it if it is reading.
				c.lingering.Store(true)
				_ = c.ws.NetConn().SetReadDeadline(time.Now())
			}
		}
		if !c.lingering.Load() {
			_ = c.ws.Close()
		}
		if c.onClose != nil {
			c.onClose(err)
		}
	})
}

// Close closes the connection and waits for its goroutines (it cuts a
// slow consumer's linger short).
func (c *Conn) Close() {
	c.quit.Store(true)
	c.Shutdown(nil)
	c.wg.Wait()
}

// done is closed once the connection started closing.
func (c *Conn) Done() <-chan struct{} { return c.closing }

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

func GetBuf() *[]byte { return bufPool.Get().(*[]byte) }

func PutBuf(b *[]byte) {
	if cap(*b) > 64<<10 {
		return // keep the pool from pinning huge buffers
	}
	*b = (*b)[:0]
	bufPool.Put(b)
}

// plainSocket reports whether nc's writes go to a TCP or unix socket as
// they are, through the read-side wrappers only (rawConn sees through
// TLS too; a write to the socket must not).
func plainSocket(nc net.Conn) bool {
	switch beneath(nc, false).(type) {
	case *net.TCPConn, *net.UnixConn:
		return true
	}
	return false // TLS, or a conn of some other kind: its Write is its own
}

// rawConn finds the socket beneath a connection the hub accepted or
// dialled (through its readAhead and TLS wrappers); nil if there is none.
func rawConn(nc net.Conn) syscall.RawConn {
	sc, ok := beneath(nc, true).(syscall.Conn)
	if !ok {
		return nil
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return raw
}

// beneath is the connection under this package's read-side wrappers
// (CapListener's, DialReadAhead's) and, throughTLS, a TLS layer.
func beneath(nc net.Conn, throughTLS bool) net.Conn {
	for {
		switch c := nc.(type) {
		case *cappedConn:
			nc = c.Conn
		case *readAheadConn:
			nc = c.Conn
		case *tls.Conn:
			if !throughTLS {
				return nc
			}
			nc = c.NetConn()
		default:
			return nc
		}
	}
}

// Config returns the connection's configuration, defaults applied.
func (c *Conn) Config() Config { return *c.cfg }

// SetCheck sets the message-level check run on every message read, in
// the read buffer, before the message is copied out (for example
// envelope.PrecheckJSONRPC); a message it refuses reaches the reader's
// callback as refused. Call it before Start.
func (c *Conn) SetCheck(check func([]byte, envelope.Limits) *envelope.Error) { c.check = check }
