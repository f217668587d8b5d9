package mesh

import (
	"errors"
	"io"
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
	// arrived for that long (default 3 × PingInterval).
	IdleTimeout time.Duration
	// WriteTimeout bounds one write, so a stuck peer cannot pin the writer
	// (default 10 s).
	WriteTimeout time.Duration
	// QueueSize bounds frames waiting for the writer (default 256; with
	// batching, one write drains up to 128 of them).
	QueueSize int
	// Limits bound each incoming message (default 1 MiB, depth 64).
	Limits envelope.Limits
	// Bytes, if set, is told the size of every message read (in) and
	// written (out), for metrics. It must not block.
	Bytes func(in, out int)
	// Late, if set, is told of every response that arrived for a call no
	// longer waiting for it (cancelled, timed out): it is counted, then
	// dropped. It must not block.
	Late func()
}

func (c ConnConfig) withDefaults() ConnConfig {
	if c.PingInterval <= 0 {
		c.PingInterval = 5 * time.Second
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = 3 * c.PingInterval
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

var errConnClosed = errors.New("connection closed")

// wsConn runs one WebSocket with exactly one reader and one writer
// goroutine (gorilla allows no more). Frames to send go through a bounded
// queue; onMessage runs on the reader goroutine and must not block.
type wsConn struct {
	ws        *websocket.Conn
	cfg       ConnConfig
	batch     bool // frames queued together go out as one JSON-array message (native links only)
	out       chan *[]byte
	closing   chan struct{}
	closeOnce sync.Once
	err       error // why it closed; read after closing is closed
	onClose   func(error)
	wg        sync.WaitGroup
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
	}
}

// start runs the reader and writer goroutines; onClose runs once, on the
// goroutine that noticed the end, after the connection is closed.
func (c *wsConn) start(onMessage func([]byte), onClose func(error)) {
	c.onClose = onClose
	c.wg.Add(2)
	go c.readLoop(onMessage)
	go c.writeLoop()
}

func (c *wsConn) readLoop(onMessage func([]byte)) {
	defer c.wg.Done()
	idle := c.cfg.IdleTimeout
	_ = c.ws.SetReadDeadline(time.Now().Add(idle))
	c.ws.SetPongHandler(func(string) error { return c.ws.SetReadDeadline(time.Now().Add(idle)) })
	hint := 512
	for {
		typ, data, err := c.readMessage(hint)
		if err != nil {
			c.shutdown(err)
			return
		}
		hint = max(512, min(len(data)+len(data)/4, c.cfg.Limits.MaxBytes))
		_ = c.ws.SetReadDeadline(time.Now().Add(idle))
		if c.cfg.Bytes != nil {
			c.cfg.Bytes(len(data), 0)
		}
		if typ != websocket.TextMessage && typ != websocket.BinaryMessage {
			continue
		}
		onMessage(data)
	}
}

// readMessage reads one message into a buffer of about hint bytes (the
// size of the last one), growing it if needed: one allocation per message
// instead of the doublings of gorilla's ReadMessage. The buffer is not
// reused, since decoded frames keep pointing into it.
func (c *wsConn) readMessage(hint int) (int, []byte, error) {
	typ, r, err := c.ws.NextReader()
	if err != nil {
		return typ, nil, err
	}
	buf := make([]byte, 0, hint)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return typ, buf, nil
		}
		if err != nil {
			return typ, nil, err
		}
	}
}

func (c *wsConn) writeLoop() {
	defer c.wg.Done()
	ping := time.NewTicker(c.cfg.PingInterval)
	defer ping.Stop()
	for {
		select {
		case b := <-c.out:
			c.writing.Store(true)
			_ = c.ws.SetWriteDeadline(time.Now().Add(c.cfg.WriteTimeout))
			var n int
			var err error
			if c.batch && len(c.out) == 0 {
				// Let the goroutines that are about to queue a frame do so,
				// so that one write carries them all.
				runtime.Gosched()
			}
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
		_ = c.ws.WriteControl(websocket.CloseMessage,
			websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
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
