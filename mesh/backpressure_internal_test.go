package mesh

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/envelope"
)

// pipeListener hands out the server ends of net.Pipe connections: an
// http.Server over it upgrades WebSockets with no socket at all, so that
// a test runs in a synctest bubble.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *pipeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

func (l *pipeListener) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	c, s := net.Pipe()
	select {
	case l.conns <- s:
		return c, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// pipeWS returns the two ends of a WebSocket over net.Pipe: the server's
// (for a wsConn) and the client's. Both are closed when the test ends.
func pipeWS(t *testing.T) (server, client *websocket.Conn) {
	t.Helper()
	l := newPipeListener()
	got := make(chan *websocket.Conn, 1)
	up := websocket.Upgrader{}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := up.Upgrade(w, r, nil)
		if err != nil {
			t.Error(err)
			return
		}
		got <- ws
	})}
	go func() { _ = srv.Serve(l) }()
	d := websocket.Dialer{NetDialContext: l.dial}
	client, _, err := d.Dial("ws://pipe/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	server = <-got
	t.Cleanup(func() {
		_ = srv.Close()
		_ = client.Close()
		_ = server.Close()
	})
	return server, client
}

// TestBackpressureBounds: a wsConn with backpressure stops reading at
// each of its bounds (calls whose answers are not yet written, bytes held)
// and reads on once under them; nothing is lost on the way, and a
// connection without backpressure reads on regardless. In a synctest
// bubble over net.Pipe: "stops reading" is every goroutine blocked with
// the peer's messages unread.
func TestBackpressureBounds(t *testing.T) {
	const msgSize = 1000
	msg := []byte(`"` + strings.Repeat("x", msgSize-2) + `"`)
	type held struct{ n int }
	run := func(t *testing.T, cfg ConnConfig, bp, peerReads bool, send int, check func(t *testing.T, c *wsConn, got func() int, release func(int))) {
		synctest.Test(t, func(t *testing.T) {
			sws, cws := pipeWS(t)
			c := newWSConn(sws, cfg)
			if bp {
				c.withBackpressure()
			}
			var mu sync.Mutex
			var admitted []held
			c.start(func(data []byte, _ *envelope.Error) {
				c.admit(1, len(data))
				mu.Lock()
				admitted = append(admitted, held{len(data)})
				mu.Unlock()
			}, nil)
			defer c.Close()
			if peerReads { // and answers pings: net.Pipe holds no byte unread
				go func() {
					for {
						if _, _, err := cws.ReadMessage(); err != nil {
							return
						}
					}
				}()
			}
			go func() {
				for range send {
					if cws.WriteMessage(websocket.TextMessage, msg) != nil {
						return
					}
				}
			}()
			synctest.Wait()
			got := func() int { mu.Lock(); defer mu.Unlock(); return len(admitted) }
			release := func(k int) {
				mu.Lock()
				r := admitted[:k]
				admitted = admitted[k:]
				mu.Unlock()
				for _, h := range r {
					c.release(1, h.n)
				}
				synctest.Wait()
			}
			check(t, c, got, release)
			_ = cws.Close()
		})
	}

	t.Run("calls", func(t *testing.T) {
		run(t, ConnConfig{MaxUnwrittenCalls: 4, MaxUnwrittenBytes: -1}, true, false, 10, func(t *testing.T, c *wsConn, got func() int, release func(int)) {
			if n := got(); n != 4 {
				t.Fatalf("read %d messages with 4 calls allowed unanswered; want 4", n)
			}
			release(2)
			if n := got(); n != 4 {
				t.Fatalf("after 2 answers: %d held; want 4 (2 more read)", n)
			}
			release(4)
			if n := got(); n != 4 {
				t.Fatalf("after 4 more answers: %d held; want the last 4", n)
			}
			release(4)
			if n := got(); n != 0 {
				t.Fatalf("%d still held; want 0: all 10 read", n)
			}
		})
	})
	t.Run("bytes", func(t *testing.T) {
		run(t, ConnConfig{MaxUnwrittenCalls: -1, MaxUnwrittenBytes: 3 * msgSize}, true, false, 10, func(t *testing.T, c *wsConn, got func() int, release func(int)) {
			if n := got(); n != 3 {
				t.Fatalf("read %d messages of %d bytes with %d bytes allowed; want 3", n, msgSize, 3*msgSize)
			}
			// A frame of this side's own (a request: trySend) queued to a
			// peer that does not read is not owed: the room freed by an
			// answer is taken by the next message.
			own := getBuf()
			*own = append((*own)[:0], msg...)
			if !c.trySend(own) {
				t.Fatal("trySend refused")
			}
			release(1)
			if n := got(); n != 3 {
				t.Fatalf("a request of ours queued unwritten and one call released: %d held; want 3", n)
			}
			// An answer queued unwritten (send) counts: it takes the room
			// freed by the next release.
			b := getBuf()
			*b = append((*b)[:0], msg...)
			if !c.send(b) {
				t.Fatal("send refused")
			}
			release(1)
			if n := got(); n != 2 {
				t.Fatalf("an answer queued unwritten and one call released: %d held; want 2 (the answer fills the room)", n)
			}
		})
	})
	t.Run("no backpressure", func(t *testing.T) {
		run(t, ConnConfig{MaxUnwrittenCalls: 4, MaxUnwrittenBytes: msgSize}, false, false, 10, func(t *testing.T, c *wsConn, got func() int, release func(int)) {
			if n := got(); n != 10 {
				t.Fatalf("read %d of 10 messages on a connection without backpressure; want all", n)
			}
		})
	})
	t.Run("paused past the idle timeout", func(t *testing.T) {
		// A paused reader reads nothing, not even pongs: the idle
		// deadline must not close the connection under it.
		run(t, ConnConfig{MaxUnwrittenCalls: 1, MaxUnwrittenBytes: -1, PingInterval: time.Second}, true, true, 3, func(t *testing.T, c *wsConn, got func() int, release func(int)) {
			time.Sleep(time.Minute)
			synctest.Wait()
			select {
			case <-c.done():
				t.Fatalf("a paused connection closed: %v", c.err)
			default:
			}
			for i := range 3 {
				if n := got(); n != 1 {
					t.Fatalf("message %d: %d held after a minute's pause; want 1 (read, the next waiting)", i+1, n)
				}
				release(1)
				select {
				case <-c.done():
					t.Fatalf("closed once reading again after a minute's pause: %v", c.err)
				default:
				}
			}
		})
	})
}
