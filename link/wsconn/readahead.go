package wsconn

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/agentmesh/agentmesh/internal/tcptune"
)

// readAheadSize is how much one read from a connection's socket takes
// when its reader wants less and the socket holds more.
const readAheadSize = 64 << 10

var readAheadPool = sync.Pool{New: func() any {
	rb := &raBuf{b: make([]byte, readAheadSize)}
	rb.take = rb.readFD // bound once: a closure per read cost three allocations
	return rb
}}

// raBuf is a pooled read-ahead buffer with the read that fills it
// (readNow), and that read's outcome.
type raBuf struct {
	b    []byte
	n    int
	err  error
	take func(fd uintptr) bool // rb.readFD
}

// readAheadHeld counts the pooled buffers out of the pool (for tests:
// one held while a reader waits would be 64 KiB per idle connection).
var readAheadHeld atomic.Int64

func getReadAhead() *raBuf {
	readAheadHeld.Add(1)
	return readAheadPool.Get().(*raBuf)
}

func putReadAhead(b *raBuf) {
	if len(b.b) == carrySize {
		carryPool.Put(b)
		return
	}
	readAheadHeld.Add(-1)
	readAheadPool.Put(b)
}

// carrySize is the size of the small buffer that holds a frame's first
// bytes (a header cut short, a control frame) while its reader waits for
// the rest: a peer that stops in the middle of a header makes the hub
// hold these 256 bytes, not 64 KiB.
const carrySize = 256

// carried counts the moves into a small buffer (tests).
var carried atomic.Int64

var carryPool = sync.Pool{New: func() any { return &raBuf{b: make([]byte, carrySize)} }}

// carry moves the buffered bytes into a small buffer, before a wait.
func (ra *readAhead) carry() {
	if ra.buf == nil || len(ra.buf.b) == carrySize || ra.w-ra.r > carrySize {
		return
	}
	ra.moveTo(carryPool.Get().(*raBuf))
	carried.Add(1) // after the large buffer went back (tests count both)
}

// moveTo moves the buffered bytes to the start of b, which becomes the
// buffer; the old one goes back to its pool.
func (ra *readAhead) moveTo(b *raBuf) {
	n := copy(b.b, ra.buf.b[ra.r:ra.w])
	putReadAhead(ra.buf)
	ra.buf, ra.r, ra.w = b, 0, n
}

// dropEmpty gives the buffer back once its reader has taken every byte.
func (ra *readAhead) dropEmpty() {
	if ra.buf != nil && ra.r == ra.w {
		putReadAhead(ra.buf)
		ra.buf = nil
	}
}

// readAhead gives a connection a large read buffer that it holds only
// while the buffer has bytes its reader has not taken yet. The readers
// above a connection ask for little at a time (a WebSocket's 1 KiB
// buffer for frame headers and small frames, the continuation frames of
// a fragmented message, the HTTP server's 4 KiB): each such read was a
// syscall of its own, so a burst of small frames, or a megabyte sent in 4
// KiB fragments, cost a syscall per frame or two (S26: 3 ms of hub CPU
// per fragmented megabyte). Here, once a read has filled its reader's
// buffer (the socket may hold more), the next takes up to 64 KiB of what
// the socket holds, without waiting, and later reads are copies.
//
// A read that waits for data is made into the reader's own buffer, never
// the large one: an idle connection, whose reader sits in a read, holds
// no buffer, so idle memory stays as it was.
//
// A connection whose reader stops with bytes left in the buffer (held
// back by a slow consumer) keeps it until it reads again or is closed
// and collected: at most one buffer per connection, MaxConns × 64 KiB in
// the worst case, none when idle.
//
// It is not safe for concurrent reads (no net.Conn reader is).
type readAhead struct {
	raw  syscall.RawConn // nil: no read-ahead, plain reads
	conn net.Conn        // the connection read
	buf  *raBuf          // nil when empty
	r, w int
	more bool // the last read filled the reader's buffer
	// waits counts the reads since the last pace that found nothing
	// read ahead and went to the socket, which may have made them wait.
	waits int
	// A frameReader's fill (readahead_unix.go): the read it hands the
	// socket (bound once, on the first fill), whether that read may
	// wait, and its outcome.
	fillFn   func(fd uintptr) bool
	fillWait bool
	filled   int
	fillErr  error
}

// buffered returns the bytes read ahead and not taken yet, in place.
func (ra *readAhead) buffered() []byte {
	if ra.buf == nil {
		return nil
	}
	return ra.buf.b[ra.r:ra.w]
}

// take marks the first n buffered bytes taken; the buffer goes back to
// the pool once all are.
func (ra *readAhead) take(n int) {
	if n == 0 {
		return
	}
	ra.r += n
	ra.dropEmpty()
}

// release gives the buffer back, bytes and all: its reader is done.
func (ra *readAhead) release() {
	if ra.buf != nil {
		putReadAhead(ra.buf)
		ra.buf = nil
	}
}

// room readies the buffer for a fill: a new one, or the one held with
// its bytes moved to its start when few bytes are left behind them (a
// frame's header cut by the buffer's end must be read whole).
func (ra *readAhead) room() {
	if ra.buf == nil {
		ra.buf = getReadAhead()
		ra.r, ra.w = 0, 0
	} else if len(ra.buf.b) == carrySize {
		ra.moveTo(getReadAhead())
	} else if len(ra.buf.b)-ra.w < 1024 {
		ra.w = copy(ra.buf.b, ra.buf.b[ra.r:ra.w])
		ra.r = 0
	}
}

// fillBlocking is fill where the socket cannot be read without waiting
// (no RawConn: an in-memory connection, a platform without the raw
// read): it waits in the connection's Read, holding a 256-byte buffer.
func (ra *readAhead) fillBlocking() (bool, error) {
	ra.waits++
	switch {
	case ra.buf == nil:
		// The wait holds a small buffer, as gorilla's reader did: an idle
		// connection must not hold 64 KiB.
		ra.buf = carryPool.Get().(*raBuf)
		ra.r, ra.w = 0, 0
	case ra.w == len(ra.buf.b):
		ra.w = copy(ra.buf.b, ra.buf.b[ra.r:ra.w]) // a header needs at most 139 of the 256
		ra.r = 0
	}
	n, err := ra.conn.Read(ra.buf.b[ra.w:])
	ra.w += n
	ra.dropEmpty()
	if n > 0 {
		return true, nil // an error comes back with the next read
	}
	if err == nil {
		err = io.ErrNoProgress
	}
	return false, err
}

// readInto reads into p, empty of buffered bytes: a large p straight
// from the socket (a large message's payload, copied once), a small one
// through a fill.
func (ra *readAhead) readInto(p []byte) (int, error) {
	if len(p) >= 16<<10 {
		ra.waits++
		return ra.conn.Read(p)
	}
	if _, err := ra.fill(true); err != nil {
		return 0, err
	}
	n := copy(p, ra.buffered())
	ra.take(n)
	return n, nil
}

// Pacing: a reader of a large message calls pace every 64 KiB of it.
// If that piece took paceWaits or more reads that went to the socket, the
// sender is writing it in small pieces more slowly than the hub reads
// them (a megabyte in 4 KiB WebSocket fragments, each its own write), and
// the hub wakes up for each. pace then waits paceDelay, so that the next
// read takes many of the sender's writes at once. A sender that keeps up
// is not paced; one that trickles gets its message read at most
// paceDelay later than it ends. (S26, whose attackers send such
// fragments: the hub's CPU under attack fell by a quarter.)
const (
	paceWaits = 8
	paceDelay = time.Millisecond
)

// pace waits paceDelay if the last 64 KiB of a message trickled in, and
// reports whether it did.
func (ra *readAhead) pace() bool {
	w := ra.waits
	ra.waits = 0
	if w < paceWaits || ra.buf != nil {
		return false
	}
	time.Sleep(paceDelay) // bounded; a close meanwhile fails the next read
	return true
}

func newReadAhead(c net.Conn) readAhead {
	ra := readAhead{conn: c}
	if sc, ok := c.(syscall.Conn); ok && readAheadOS {
		ra.raw, _ = sc.SyscallConn()
	}
	return ra
}

func (ra *readAhead) read(p []byte) (int, error) {
	if ra.buf != nil {
		n := copy(p, ra.buf.b[ra.r:ra.w])
		ra.r += n
		ra.dropEmpty()
		return n, nil
	}
	if ra.more && ra.raw != nil && len(p) > 0 && len(p) < readAheadSize/2 {
		if n, ok, err := ra.readNow(p); ok {
			return n, err
		}
	}
	ra.waits++
	n, err := ra.conn.Read(p)
	ra.more = n == len(p)
	return n, err
}

// readAheadConn is a dialed connection read through a readAhead (the
// hub's accepted ones get theirs from CapListener).
type readAheadConn struct {
	net.Conn
	readAhead
}

func (c *readAheadConn) Read(p []byte) (int, error) { return c.readAhead.read(p) }

// DialReadAhead dials as gorilla's default dialer does, with a
// readAhead: a link's replies arrive many frames at a time under load.
func DialReadAhead(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	tcptune.Thin(c)
	tcptune.BoundRTO(c)
	return &readAheadConn{Conn: c, readAhead: newReadAhead(c)}, nil
}
