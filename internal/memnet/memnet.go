// Package memnet is an in-memory network for tests: a net.Listener whose
// Dial returns the client end of a buffered, full-duplex pipe, in the
// manner of grpc-go's bufconn and connect-go's memhttp. Unlike net.Pipe, a
// write returns once its bytes fit in the peer's buffer (as TCP's does
// once they fit in the socket buffers), and blocks when the buffer is
// full, so that a peer that stops reading pushes back as over a socket.
// Deadlines work as net.Conn's, with timers: inside a testing/synctest
// bubble they follow the bubble's fake clock, so that tests of heartbeats,
// ping timeouts and deadlines run in no real time.
package memnet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultBufferSize is each direction's buffer when Listen is given 0.
const DefaultBufferSize = 256 << 10

// Addr is an address on the in-memory network.
type Addr string

func (Addr) Network() string  { return "memnet" }
func (a Addr) String() string { return string(a) }

// Listener accepts the connections its Dial makes. Safe for concurrent use.
type Listener struct {
	name    string
	bufSize int
	conns   chan net.Conn
	done    chan struct{}
	once    sync.Once
	dials   atomic.Int64
}

// Listen returns a listener named name (its address; any string) whose
// connections buffer size bytes each way (DefaultBufferSize for 0).
func Listen(name string, size int) *Listener {
	if size <= 0 {
		size = DefaultBufferSize
	}
	return &Listener{name: name, bufSize: size, conns: make(chan net.Conn), done: make(chan struct{})}
}

// Accept waits for the next Dial, or the listener's Close.
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops accepting; connections already made are not closed.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

// Addr returns the listener's name as an address.
func (l *Listener) Addr() net.Addr { return Addr(l.name) }

// Dial connects to the listener, waiting for its Accept within ctx.
func (l *Listener) Dial(ctx context.Context) (net.Conn, error) {
	// Each connection's client end has an address of its own, as a
	// socket's ephemeral port: one host ("NAME-client"), a port per
	// connection, so that what keys on the connection's address (the
	// hub's per-connection rate limit) tells connections apart, and what
	// keys on the host (per-IP budgets) sees one source, as on loopback.
	client, server := Pipe(l.bufSize, Addr(fmt.Sprintf("%s-client:%d", l.name, l.dials.Add(1))), Addr(l.name))
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
		return nil, &net.OpError{Op: "dial", Net: "memnet", Addr: Addr(l.name), Err: errors.New("connection refused")}
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// DialContext is Dial with net.Dialer's signature (network and address
// are ignored), for http.Transport.DialContext and websocket.Dialer.
func (l *Listener) DialContext(ctx context.Context, _, _ string) (net.Conn, error) {
	return l.Dial(ctx)
}

// Pipe returns the two ends of a connection that buffers size bytes each
// way: what a writes, b reads, and the reverse.
func Pipe(size int, aAddr, bAddr net.Addr) (a, b net.Conn) {
	ab, ba := newBuffer(size), newBuffer(size)
	ca := &conn{in: ba, out: ab, local: aAddr, remote: bAddr, closed: make(chan struct{})}
	cb := &conn{in: ab, out: ba, local: bAddr, remote: aAddr, closed: make(chan struct{})}
	ca.rd.init()
	ca.wd.init()
	cb.rd.init()
	cb.wd.init()
	return ca, cb
}

// buffer is one direction of a pipe.
type buffer struct {
	mu      sync.Mutex
	data    []byte
	size    int
	wclosed bool          // the writing end closed: the reader gets EOF once drained
	rclosed bool          // the reading end closed: writes fail
	changed chan struct{} // closed and replaced on every change
}

func newBuffer(size int) *buffer {
	return &buffer{size: size, changed: make(chan struct{})}
}

// notifyLocked wakes every waiter.
func (b *buffer) notifyLocked() {
	close(b.changed)
	b.changed = make(chan struct{})
}

type conn struct {
	in, out       *buffer
	local, remote net.Addr
	rd, wd        deadline
	closeOnce     sync.Once
	closed        chan struct{}
}

func (c *conn) LocalAddr() net.Addr  { return c.local }
func (c *conn) RemoteAddr() net.Addr { return c.remote }

func (c *conn) Read(p []byte) (int, error) {
	for {
		if isClosed(c.rd.wait()) {
			return 0, os.ErrDeadlineExceeded
		}
		b := c.in
		b.mu.Lock()
		select {
		case <-c.closed:
			b.mu.Unlock()
			return 0, net.ErrClosed
		default:
		}
		if len(b.data) > 0 {
			n := copy(p, b.data)
			b.data = b.data[n:]
			if len(b.data) == 0 {
				b.data = nil
			}
			b.notifyLocked()
			b.mu.Unlock()
			return n, nil
		}
		if b.wclosed {
			b.mu.Unlock()
			return 0, io.EOF
		}
		if len(p) == 0 {
			b.mu.Unlock()
			return 0, nil
		}
		ch := b.changed
		b.mu.Unlock()
		select {
		case <-ch:
		case <-c.closed:
		case <-c.rd.wait():
			return 0, os.ErrDeadlineExceeded
		}
	}
}

func (c *conn) Write(p []byte) (int, error) {
	written := 0
	for {
		if isClosed(c.wd.wait()) {
			return written, os.ErrDeadlineExceeded
		}
		b := c.out
		b.mu.Lock()
		select {
		case <-c.closed:
			b.mu.Unlock()
			return written, net.ErrClosed
		default:
		}
		if b.rclosed {
			b.mu.Unlock()
			return written, &net.OpError{Op: "write", Net: "memnet", Addr: c.remote, Err: errors.New("broken pipe")}
		}
		if room := b.size - len(b.data); room > 0 {
			n := min(room, len(p)-written)
			b.data = append(b.data, p[written:written+n]...)
			written += n
			b.notifyLocked()
		}
		if written == len(p) {
			b.mu.Unlock()
			return written, nil
		}
		ch := b.changed
		b.mu.Unlock()
		select {
		case <-ch:
		case <-c.closed:
		case <-c.wd.wait():
			return written, os.ErrDeadlineExceeded
		}
	}
}

// Close closes both directions: the peer reads what was written, then
// EOF; its writes fail.
func (c *conn) Close() error {
	c.closeOnce.Do(func() {
		close(c.closed)
		c.out.mu.Lock()
		c.out.wclosed = true
		c.out.notifyLocked()
		c.out.mu.Unlock()
		c.in.mu.Lock()
		c.in.rclosed = true
		c.in.data = nil
		c.in.notifyLocked()
		c.in.mu.Unlock()
		c.rd.stop()
		c.wd.stop()
	})
	return nil
}

func (c *conn) SetDeadline(t time.Time) error {
	c.rd.set(t)
	c.wd.set(t)
	return nil
}

func (c *conn) SetReadDeadline(t time.Time) error  { c.rd.set(t); return nil }
func (c *conn) SetWriteDeadline(t time.Time) error { c.wd.set(t); return nil }

// deadline is a settable deadline whose wait channel is closed once it
// passes (as net.Pipe's).
type deadline struct {
	mu    sync.Mutex
	timer *time.Timer
	ch    chan struct{} // closed when the deadline passed
}

func (d *deadline) init() { d.ch = make(chan struct{}) }

func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.ch // the timer fired: wait for it to close ch
	}
	d.timer = nil
	closed := isClosed(d.ch)
	if t.IsZero() {
		if closed {
			d.ch = make(chan struct{})
		}
		return
	}
	if dur := time.Until(t); dur > 0 {
		if closed {
			d.ch = make(chan struct{})
		}
		ch := d.ch
		d.timer = time.AfterFunc(dur, func() { close(ch) })
		return
	}
	if !closed {
		close(d.ch)
	}
}

func (d *deadline) wait() chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ch
}

// stop stops the timer for good (on Close). It leaves no stopped timer
// behind: set takes Stop's false for a timer that fired, and would wait
// for ever for a stopped one to close ch.
func (d *deadline) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.ch // the timer fired: wait for it to close ch, as set does
	}
	d.timer = nil
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
