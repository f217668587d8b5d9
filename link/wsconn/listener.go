package wsconn

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentmesh/agentmesh/internal/tcptune"
)

// CapListener refuses connections past max at once, with a 503 and a
// close, instead of queueing them (netutil.LimitListener stops accepting,
// which leaves them in the kernel's backlog until they time out): a flood
// of connections is answered in microseconds and the hub's descriptors
// stay bounded (S27).
type CapListener struct {
	net.Listener
	max     int64
	active  atomic.Int64
	refused func()
}

// NewCapListener wraps ln: at most max connections open at once;
// refused, if set, is told of each connection refused (for metrics).
func NewCapListener(ln net.Listener, max int64, refused func()) *CapListener {
	return &CapListener{Listener: ln, max: max, refused: refused}
}

var busyReply = []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nConnection: close\r\nRetry-After: 1\r\nContent-Length: 20\r\n\r\ntoo many connections")

// Accept accepts the next connection under the cap.
func (l *CapListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.active.Add(1) > l.max {
			l.active.Add(-1)
			if l.refused != nil {
				l.refused()
			}
			_ = c.SetWriteDeadline(time.Now().Add(10 * time.Millisecond))
			_, _ = c.Write(busyReply)
			_ = c.Close()
			continue
		}
		tcptune.Thin(c)
		return &cappedConn{Conn: c, l: l, readAhead: newReadAhead(c)}, nil
	}
}

type cappedConn struct {
	net.Conn
	l    *CapListener
	once sync.Once
	readAhead
}

func (c *cappedConn) Read(p []byte) (int, error) { return c.readAhead.read(p) }

// CloseWrite half-closes the connection when the underlying one can: the
// HTTP server sends its last response (413, 431) and a FIN this way, then
// waits before closing, so that a client still sending a refused request
// reads the answer instead of a reset. Hiding it behind the wrapper made
// such clients wait for the full close (500 ms) to see the end.
func (c *cappedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (c *cappedConn) Close() error {
	c.once.Do(func() { c.l.active.Add(-1) })
	return c.Conn.Close()
}

// TuneLink bounds the retransmission timeout of an accepted link that
// carries a peer hub's calls (as on the links a process dials): a hub
// calls it on the peer links it accepts.
func TuneLink(c net.Conn) { tcptune.BoundRTO(beneath(c, true)) }
