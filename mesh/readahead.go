package mesh

import (
	"context"
	"io"
	"net"
	"sync"
)

// readAheadSize is how much one read from a connection's socket asks for
// when its reader wants less.
const readAheadSize = 64 << 10

var readAheadPool = sync.Pool{New: func() any { b := make([]byte, readAheadSize); return &b }}

// readAhead gives a connection a large read buffer that it holds only
// while the buffer has bytes its reader has not taken yet. The readers
// above a connection ask for little at a time (a WebSocket's 1 KiB
// buffer for frame headers and small frames, the continuation frames of
// a fragmented message, the HTTP server's 4 KiB): each such read was a
// syscall of its own, so a burst of small frames, or a megabyte sent in 4
// KiB fragments, cost a syscall per frame or two (S26: 3 ms of hub CPU
// per fragmented megabyte). Here one syscall takes up to 64 KiB of what
// the socket holds and later reads are copies. An idle connection holds
// no buffer, so idle memory stays as it was.
//
// It is not safe for concurrent reads (no net.Conn reader is).
type readAhead struct {
	buf  *[]byte // nil when empty
	r, w int
	err  error // the read's error, returned once the buffer is drained
}

func (ra *readAhead) read(src io.Reader, p []byte) (int, error) {
	if ra.buf != nil {
		n := copy(p, (*ra.buf)[ra.r:ra.w])
		ra.r += n
		if ra.r == ra.w {
			readAheadPool.Put(ra.buf)
			ra.buf = nil
		}
		return n, nil
	}
	if err := ra.err; err != nil {
		ra.err = nil
		return 0, err
	}
	if len(p) >= readAheadSize/2 || len(p) == 0 {
		return src.Read(p)
	}
	bp := readAheadPool.Get().(*[]byte)
	n, err := src.Read(*bp)
	if n <= len(p) {
		copy(p, (*bp)[:n])
		readAheadPool.Put(bp)
		return n, err
	}
	copy(p, (*bp)[:len(p)])
	ra.buf, ra.r, ra.w, ra.err = bp, len(p), n, err
	return len(p), nil
}

// readAheadConn is a dialed connection read through a readAhead (the
// hub's accepted ones get theirs from capListener).
type readAheadConn struct {
	net.Conn
	readAhead
}

func (c *readAheadConn) Read(p []byte) (int, error) { return c.readAhead.read(c.Conn, p) }

// dialReadAhead dials as gorilla's default dialer does, with a
// readAhead: a link's replies arrive many frames at a time under load.
func dialReadAhead(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &readAheadConn{Conn: c}, nil
}
