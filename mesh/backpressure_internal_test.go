package mesh

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
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

// TestBackpressureBounds: a wsConn with backpressure, whose peer does not
// read the answers queued for it, stops reading at each of its bounds
// (calls whose answers are not yet written, bytes held) and reads on once
// under them; nothing is lost on the way. Calls that are only running,
// with every answer written, never stop it; nor does anything on a
// connection without backpressure. In a synctest bubble over net.Pipe:
// "stops reading" is every goroutine blocked with the peer's messages
// unread.
func TestBackpressureBounds(t *testing.T) {
	const msgSize = 1000
	msg := []byte(`"` + strings.Repeat("x", msgSize-2) + `"`)
	type held struct{ n int }
	type env struct {
		c       *wsConn
		got     func() int // calls admitted and not released
		release func(int)  // releases the first k of them
		answer  func()     // queues an answer of msgSize (send)
		read    func()     // the peer starts reading
		pongs   func() int // the pongs the peer got
	}
	run := func(t *testing.T, cfg ConnConfig, bp bool, owed, send int, check func(t *testing.T, e env)) {
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
			e := env{c: c}
			e.answer = func() {
				b := getBuf()
				*b = append((*b)[:0], msg...)
				if !c.send(b) {
					t.Fatal("send refused")
				}
				synctest.Wait()
			}
			// Answers the peer does not read: net.Pipe holds no byte, so
			// the writer stays in its first write, as on a full socket.
			for range owed {
				e.answer()
			}
			go func() {
				for range send {
					if cws.WriteMessage(websocket.TextMessage, msg) != nil {
						return
					}
				}
			}()
			synctest.Wait()
			e.got = func() int { mu.Lock(); defer mu.Unlock(); return len(admitted) }
			e.release = func(k int) {
				mu.Lock()
				r := admitted[:k]
				admitted = admitted[k:]
				mu.Unlock()
				for _, h := range r {
					c.release(1, h.n)
				}
				synctest.Wait()
			}
			var pongs atomic.Int32
			cws.SetPongHandler(func(string) error { pongs.Add(1); return nil })
			e.pongs = func() int { return int(pongs.Load()) }
			e.read = func() {
				go func() {
					for {
						if _, _, err := cws.ReadMessage(); err != nil {
							return
						}
					}
				}()
				synctest.Wait()
			}
			check(t, e)
			_ = cws.Close()
		})
	}

	t.Run("calls", func(t *testing.T) {
		// One answer unwritten: 3 calls more reach the bound of 4.
		run(t, ConnConfig{MaxUnwrittenCalls: 4, MaxUnwrittenBytes: -1}, true, 1, 10, func(t *testing.T, e env) {
			if n := e.got(); n != 3 {
				t.Fatalf("read %d messages with 4 calls allowed unanswered, 1 answer unwritten; want 3", n)
			}
			e.release(2)
			if n := e.got(); n != 3 {
				t.Fatalf("after 2 answers queued: %d held; want 3 (2 more read)", n)
			}
			e.read() // the peer reads: the answer is written, one more call is read
			if n := e.got(); n != 4 {
				t.Fatalf("the answer written: %d held; want 4", n)
			}
			e.release(4)
			if n := e.got(); n != 4 {
				t.Fatalf("after 4 more answers: %d held; want the last 4 of 10", n)
			}
		})
	})
	t.Run("bytes", func(t *testing.T) {
		run(t, ConnConfig{MaxUnwrittenCalls: -1, MaxUnwrittenBytes: 4 * msgSize}, true, 1, 10, func(t *testing.T, e env) {
			// The unwritten answer counts its buffer's capacity (>= msgSize).
			if n := e.got(); n != 3 {
				t.Fatalf("read %d messages of %d bytes with %d bytes allowed, one answer unwritten; want 3", n, msgSize, 4*msgSize)
			}
			// A frame of this side's own (a request: trySend) queued to a
			// peer that does not read is not owed: the room freed by a
			// release is taken by the next message.
			own := getBuf()
			*own = append((*own)[:0], msg...)
			if !e.c.trySend(own) {
				t.Fatal("trySend refused")
			}
			e.release(1)
			if n := e.got(); n != 3 {
				t.Fatalf("a request of ours queued unwritten and one call released: %d held; want 3", n)
			}
			// Another answer queued unwritten (send) counts: it takes the
			// room freed by the next release.
			e.answer()
			e.release(1)
			if n := e.got(); n != 2 {
				t.Fatalf("an answer queued unwritten and one call released: %d held; want 2 (the answer fills the room)", n)
			}
		})
	})
	t.Run("running calls, pongs", func(t *testing.T) {
		// Calls only running (every answer written) count too; while
		// the reader waits for them, the peer gets a pong a second, so
		// that a peer counting pongs as life does not take the link for
		// dead while its long calls run.
		cfg := ConnConfig{MaxUnwrittenCalls: 2, MaxUnwrittenBytes: -1, PingInterval: time.Hour, WriteTimeout: 2 * time.Hour}
		run(t, cfg, true, 0, 5, func(t *testing.T, e env) {
			if n := e.got(); n != 2 {
				t.Fatalf("read %d of 5 messages with 2 calls allowed running; want 2", n)
			}
			e.read()
			time.Sleep(time.Minute)
			synctest.Wait()
			if n := e.pongs(); n < 55 {
				t.Errorf("the peer got %d pongs in a minute's pause; want one a second", n)
			}
			e.release(2)
			if n := e.got(); n != 2 {
				t.Fatalf("after 2 answers: %d held; want 2 (2 more read)", n)
			}
			e.release(2)
			if n := e.got(); n != 1 {
				t.Fatalf("after 2 more answers: %d held; want the last 1", n)
			}
		})
	})
	t.Run("no backpressure", func(t *testing.T) {
		run(t, ConnConfig{MaxUnwrittenCalls: 4, MaxUnwrittenBytes: msgSize}, false, 1, 10, func(t *testing.T, e env) {
			if n := e.got(); n != 10 {
				t.Fatalf("read %d of 10 messages on a connection without backpressure; want all", n)
			}
		})
	})
	t.Run("paused past the idle timeout", func(t *testing.T) {
		// A paused reader reads nothing, not even pongs: the idle
		// deadline (2 s) must not close the connection under it, nor
		// the first read after it. (The writer's timeout, whose job it
		// is to close a peer that reads nothing, is set beyond the test.)
		cfg := ConnConfig{MaxUnwrittenCalls: 2, MaxUnwrittenBytes: -1, PingInterval: time.Hour, IdleTimeout: 2 * time.Second, WriteTimeout: 2 * time.Hour}
		run(t, cfg, true, 1, 3, func(t *testing.T, e env) {
			if n := e.got(); n != 1 {
				t.Fatalf("%d held; want 1 (then paused)", n)
			}
			time.Sleep(time.Minute)
			synctest.Wait()
			select {
			case <-e.c.done():
				t.Fatalf("a paused connection closed: %v", e.c.err)
			default:
			}
			e.read()
			if n := e.got(); n != 2 {
				t.Fatalf("%d held once the peer read; want 2", n)
			}
			e.release(2)
			if n := e.got(); n != 1 {
				t.Fatalf("%d held after 2 answers; want the last 1", n)
			}
			select {
			case <-e.c.done():
				t.Fatalf("closed once reading again after a minute's pause: %v", e.c.err)
			default:
			}
		})
	})
}
