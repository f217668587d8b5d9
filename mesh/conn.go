package mesh

import (
	"crypto/tls"
	"errors"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/envelope"
)

// ConnConfig tunes one WebSocket connection. The zero value takes the defaults.
type ConnConfig struct {
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
	// Limits bound each incoming message (default 1 MiB, depth 64).
	Limits envelope.Limits
	// TLS configures the dialler for wss:// hubs (ClientTLS); nil: the
	// system's roots, no client certificate.
	TLS *tls.Config
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
}

func (c ConnConfig) withDefaults() ConnConfig {
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
	if c.Limits.MaxBytes <= 0 {
		c.Limits.MaxBytes = envelope.DefaultLimits().MaxBytes
	}
	if c.Limits.MaxDepth <= 0 {
		c.Limits.MaxDepth = envelope.DefaultLimits().MaxDepth
	}
	return c
}

// closeError ends a connection with its WebSocket close code and text.
type closeError struct {
	code int
	text string
}

func (e *closeError) Error() string { return e.text }

var (
	errConnClosed   = errors.New("connection closed")
	errTooManyPings = errors.New("peer pings too often: too many pings")
)

// pingBurst is how many pings a peer may send at once; past that it must
// keep to the sustained rate of one per PeerPingMin.
const pingBurst = 5

// pingPolicy enforces PeerPingMin with the generic cell rate algorithm:
// tat is the theoretical arrival time of the next ping at the sustained
// rate; a ping at or before tat - burst × min breaks the policy. One
// comparison and no allocation per ping; the reader goroutine owns it.
type pingPolicy struct {
	min   time.Duration // <= 0: no limit
	burst time.Duration // pingBurst × min
	tat   time.Time
}

func newPingPolicy(min time.Duration) pingPolicy {
	return pingPolicy{min: min, burst: pingBurst * min}
}

// allow records a ping received at now and reports whether the peer keeps
// within the policy.
func (p *pingPolicy) allow(now time.Time) bool {
	if p.min <= 0 {
		return true
	}
	tat := p.tat
	if tat.Before(now) {
		tat = now
	}
	if tat.Sub(now) >= p.burst {
		return false
	}
	p.tat = tat.Add(p.min)
	return true
}

// wsConn runs one WebSocket with exactly one reader and one writer
// goroutine (gorilla allows no more). Frames to send go through a bounded
// queue; onMessage runs on the reader goroutine and must not block.
type wsConn struct {
	ws    *websocket.Conn
	cfg   ConnConfig
	batch bool // frames queued together go out as one JSON-array message (native links only)
	// check, if set, refuses a message in the read buffer, before it is
	// copied out: onMessage then gets only its head and the refusal.
	check     func([]byte) *envelope.Error
	out       chan *[]byte
	closing   chan struct{}
	closeOnce sync.Once
	err       error // why it closed; read after closing is closed
	onClose   func(error)
	wg        sync.WaitGroup
	pings     pingPolicy  // the peer's pings; reader goroutine only
	writing   atomic.Bool // the writer holds frames taken from out
}

// unwritten reports frames queued or being written (a frame the writer
// just took may be missed for an instant: callers poll).
func (c *wsConn) unwritten() int {
	n := len(c.out)
	if c.writing.Load() {
		n++
	}
	return n
}

func newWSConn(ws *websocket.Conn, cfg ConnConfig) *wsConn {
	cfg = cfg.withDefaults()
	ws.SetReadLimit(int64(cfg.Limits.MaxBytes) + 1024)
	return &wsConn{
		ws:      ws,
		cfg:     cfg,
		out:     make(chan *[]byte, cfg.QueueSize),
		closing: make(chan struct{}),
		pings:   newPingPolicy(cfg.PeerPingMin),
	}
}

// start runs the reader and writer goroutines; onClose runs once, on the
// goroutine that noticed the end, after the connection is closed.
func (c *wsConn) start(onMessage func(data []byte, refused *envelope.Error), onClose func(error)) {
	c.onClose = onClose
	c.wg.Add(2)
	go c.readLoop(onMessage)
	go c.writeLoop()
}

func (c *wsConn) readLoop(onMessage func([]byte, *envelope.Error)) {
	defer c.wg.Done()
	idle := c.cfg.IdleTimeout
	_ = c.ws.SetReadDeadline(time.Now().Add(idle))
	c.ws.SetPongHandler(func(string) error { return c.ws.SetReadDeadline(time.Now().Add(idle)) })
	c.ws.SetPingHandler(c.onPing)
	for {
		typ, data, refused, err := c.readMessage()
		if err != nil {
			c.shutdown(err)
			return
		}
		_ = c.ws.SetReadDeadline(time.Now().Add(idle))
		if c.cfg.Bytes != nil {
			c.cfg.Bytes(len(data), 0)
		}
		if typ != websocket.TextMessage && typ != websocket.BinaryMessage {
			continue
		}
		onMessage(data, refused)
	}
}

// onPing runs on the reader goroutine for every ping: it enforces the
// peer ping policy, then answers with a pong as gorilla's default handler
// does. An error ends the read loop, which closes the connection.
func (c *wsConn) onPing(data string) error {
	if !c.pings.allow(time.Now()) {
		if c.cfg.PingAbuse != nil {
			c.cfg.PingAbuse()
		}
		return errTooManyPings
	}
	err := c.ws.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(time.Second))
	if err == nil || errors.Is(err, websocket.ErrCloseSent) {
		return nil
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return nil // the writer is stuck; its own timeout will tell
	}
	return err
}

// readMessage reads one message through a pooled scratch buffer and
// returns it in a slice of its exact size (decoded frames keep pointing
// into it, so it is not reused): one allocation per message, none for a
// message refused while it is read. A message refused by c.check comes
// back as its first envelope.RecoverHeadLen bytes, with the refusal.
func (c *wsConn) readMessage() (int, []byte, *envelope.Error, error) {
	typ, r, err := c.ws.NextReader()
	if err != nil {
		return typ, nil, nil, err
	}
	check := c.check
	if typ != websocket.TextMessage && typ != websocket.BinaryMessage {
		check = nil
	}
	buf, refused, err := readChecked(r, c.cfg.Limits.MaxBytes+1024, check, envelope.RecoverHeadLen)
	return typ, buf, refused, err
}

func (c *wsConn) writeLoop() {
	defer c.wg.Done()
	ping := time.NewTicker(c.cfg.PingInterval)
	defer ping.Stop()
	var lastWrite time.Time
	for {
		select {
		case b := <-c.out:
			c.writing.Store(true)
			now := time.Now()
			_ = c.ws.SetWriteDeadline(now.Add(c.cfg.WriteTimeout))
			var n int
			var err error
			if c.batch && len(c.out) == 0 && now.Sub(lastWrite) < batchYieldGap {
				// Frames are coming back to back: let the goroutines that
				// are about to queue one do so, so that one write carries
				// them all. A frame after a pause goes out at once: the
				// yield would queue it behind every runnable goroutine,
				// and on a hub busy with other connections (S26) that
				// adds up for a call crossing four links.
				runtime.Gosched()
			}
			lastWrite = now
			if c.batch && len(c.out) > 0 {
				n, err = c.writeBatch(b)
			} else {
				n, err = len(*b), c.ws.WriteMessage(websocket.TextMessage, *b)
				putBuf(b)
			}
			if c.cfg.Bytes != nil {
				c.cfg.Bytes(0, n)
			}
			c.writing.Store(false)
			if err != nil {
				c.shutdown(err)
				return
			}
		case <-ping.C:
			if err := c.ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(c.cfg.WriteTimeout)); err != nil {
				c.shutdown(err)
				return
			}
		case <-c.closing:
			for {
				select {
				case b := <-c.out:
					putBuf(b)
				default:
					return
				}
			}
		}
	}
}

// batchYieldGap: a frame queued within this long of the previous write
// means a burst, worth a scheduler round to batch what follows.
const batchYieldGap = 200 * time.Microsecond

// maxBatchFrames bounds the frames one batched message carries.
const maxBatchFrames = 128

// writeBatch sends first and the frames queued behind it as one message,
// a JSON array: one write (and one syscall) for many frames under load.
// The batch stays under half the peer's message limit.
func (c *wsConn) writeBatch(first *[]byte) (int, error) {
	w, err := c.ws.NextWriter(websocket.TextMessage)
	if err != nil {
		putBuf(first)
		return 0, err
	}
	budget := c.cfg.Limits.MaxBytes / 2
	n := len(*first) + 2
	_, _ = w.Write([]byte{'['})
	_, err = w.Write(*first)
	putBuf(first)
	for i := 1; i < maxBatchFrames && err == nil; i++ {
		var b *[]byte
		select {
		case b = <-c.out:
		default:
		}
		if b == nil {
			break
		}
		if n+len(*b)+1 > budget {
			// Too big to join: close this batch, send b on its own.
			_, _ = w.Write([]byte{']'})
			if err = w.Close(); err == nil {
				err = c.ws.WriteMessage(websocket.TextMessage, *b)
			}
			n += len(*b)
			putBuf(b)
			return n, err
		}
		n += len(*b) + 1
		_, _ = w.Write([]byte{','})
		_, err = w.Write(*b)
		putBuf(b)
	}
	_, _ = w.Write([]byte{']'})
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	return n, err
}

// trySend queues a frame without waiting; false if the queue is full or
// the connection closed. The buffer belongs to the connection afterwards.
func (c *wsConn) trySend(b *[]byte) bool {
	if c.enqueue(b) {
		return true
	}
	putBuf(b)
	return false
}

// send queues a frame, waiting up to WriteTimeout for room; a peer that
// does not drain its queue for that long is cut off.
func (c *wsConn) send(b *[]byte) bool {
	if c.enqueue(b) {
		return true
	}
	t := time.NewTimer(c.cfg.WriteTimeout)
	defer t.Stop()
	select {
	case c.out <- b:
		return true
	case <-c.closing:
	case <-t.C:
		c.shutdown(errors.New("peer does not read: send queue full"))
	}
	putBuf(b)
	return false
}

func (c *wsConn) enqueue(b *[]byte) bool {
	select {
	case <-c.closing:
		return false
	default:
	}
	select {
	case c.out <- b:
		return true
	default:
		return false
	}
}

// shutdown starts closing without waiting: safe from the reader or writer.
func (c *wsConn) shutdown(err error) {
	c.closeOnce.Do(func() {
		if err == nil {
			err = errConnClosed
		}
		c.err = err
		close(c.closing)
		code, text := websocket.CloseNormalClosure, ""
		var ce *closeError
		switch {
		case errors.Is(err, errTooManyPings):
			code, text = websocket.ClosePolicyViolation, "too many pings"
		case errors.As(err, &ce):
			code, text = ce.code, ce.text
		}
		_ = c.ws.WriteControl(websocket.CloseMessage,
			websocket.FormatCloseMessage(code, text), time.Now().Add(time.Second))
		_ = c.ws.Close()
		if c.onClose != nil {
			c.onClose(err)
		}
	})
}

// Close closes the connection and waits for its goroutines.
func (c *wsConn) Close() {
	c.shutdown(nil)
	c.wg.Wait()
}

// done is closed once the connection started closing.
func (c *wsConn) done() <-chan struct{} { return c.closing }

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

func getBuf() *[]byte { return bufPool.Get().(*[]byte) }

func putBuf(b *[]byte) {
	if cap(*b) > 64<<10 {
		return // keep the pool from pinning huge buffers
	}
	*b = (*b)[:0]
	bufPool.Put(b)
}
