package link

import (
	"context"
	"encoding/json"
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
// (for a Conn) and the client's. Both are closed when the test ends.
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

// TestBackpressureBounds: a Conn with backpressure stops reading when
// the answers it owes its peer and could not write reach a bound (calls
// or bytes), and reads on once the peer takes them; calls read past the
// bounds on calls running and answers owed are refused (tryAdmit false),
// not waited for, so that the reader goes on carrying the peer's other
// frames (an agent's answers, heartbeats, cancels). Nothing of this on a
// connection without backpressure. In a synctest bubble over net.Pipe:
// "stops reading" is every goroutine blocked with the peer's messages
// unread.
func TestBackpressureBounds(t *testing.T) {
	const msgSize = 1000
	msg := []byte(`"` + strings.Repeat("x", msgSize-2) + `"`)
	type held struct{ n int }
	type env struct {
		c       *Conn
		got     func() int // calls admitted and not released
		refused func() int // calls tryAdmit refused
		read    func()     // the peer starts reading
		release func(int)  // releases the first k admitted calls
	}
	run := func(t *testing.T, cfg Config, bp bool, owed, own, send int, check func(t *testing.T, e env)) {
		synctest.Test(t, func(t *testing.T) {
			sws, cws := pipeWS(t)
			c := NewConn(sws, cfg)
			if bp {
				c.WithBackpressure()
			}
			var mu sync.Mutex
			var admitted []held
			refused := 0
			c.Start(func(data []byte, _ *envelope.Error) {
				mu.Lock()
				defer mu.Unlock()
				if c.TryAdmit(1, len(data)) {
					admitted = append(admitted, held{len(data)})
				} else {
					refused++
				}
			}, nil)
			defer c.Close()
			e := env{c: c}
			// Answers (send: owed) and requests of this side's own
			// (trySend: not owed) the peer does not read: net.Pipe holds
			// no byte, so the writer stays in its first write, as on a
			// full socket.
			for range owed {
				b := GetBuf()
				*b = append((*b)[:0], msg...)
				if !c.Send(b) {
					t.Fatal("send refused")
				}
			}
			for range own {
				b := GetBuf()
				*b = append((*b)[:0], msg...)
				if !c.TrySend(b) {
					t.Fatal("trySend refused")
				}
			}
			synctest.Wait()
			go func() {
				for range send {
					if cws.WriteMessage(websocket.TextMessage, msg) != nil {
						return
					}
				}
			}()
			synctest.Wait()
			e.got = func() int { mu.Lock(); defer mu.Unlock(); return len(admitted) }
			e.refused = func() int { mu.Lock(); defer mu.Unlock(); return refused }
			e.release = func(k int) {
				mu.Lock()
				r := admitted[:k]
				admitted = admitted[k:]
				mu.Unlock()
				for _, h := range r {
					c.Release(1, h.n)
				}
				synctest.Wait()
			}
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

	// "Paused" below allows one message read: the reader checks the
	// bounds before each read, and may have been in its read already when
	// the test queued the answers it owes (a CI run read 1).
	t.Run("answers owed, calls", func(t *testing.T) {
		run(t, Config{MaxUnwrittenCalls: 4, MaxUnwrittenBytes: -1}, true, 4, 0, 10, func(t *testing.T, e env) {
			if n := e.got() + e.refused(); n > 1 {
				t.Fatalf("read %d messages with 4 answers owed unwritten and 4 allowed; want at most 1 (paused)", n)
			}
			e.read() // the peer reads: the answers are written, the reader goes on
			if n, r := e.got(), e.refused(); n != 4 || r != 6 {
				t.Fatalf("once the peer read: %d admitted, %d refused; want 4 admitted (the bound), 6 refused", n, r)
			}
		})
	})
	t.Run("answers owed, bytes", func(t *testing.T) {
		// An unwritten answer counts its buffer's capacity (>= msgSize).
		run(t, Config{MaxUnwrittenCalls: -1, MaxUnwrittenBytes: 4 * msgSize}, true, 4, 0, 10, func(t *testing.T, e env) {
			if n := e.got() + e.refused(); n > 1 {
				t.Fatalf("read %d messages with 4 answers of %d bytes owed and %d allowed; want at most 1 (paused)", n, msgSize, 4*msgSize)
			}
			e.read()
			if n, r := e.got(), e.refused(); n != 4 || r != 6 {
				t.Fatalf("once the peer read: %d admitted, %d refused; want 4, 6", n, r)
			}
		})
	})
	t.Run("own frames are not owed", func(t *testing.T) {
		// Requests of this side's own queued to a peer that does not read
		// neither pause the reader nor take the calls' room.
		run(t, Config{MaxUnwrittenCalls: -1, MaxUnwrittenBytes: 2 * msgSize}, true, 0, 5, 3, func(t *testing.T, e env) {
			if n, r := e.got(), e.refused(); n != 2 || r != 1 {
				t.Fatalf("with 5 requests of ours unwritten: %d admitted, %d refused; want 2 (the bytes bound), 1", n, r)
			}
		})
	})
	t.Run("running calls are refused, not waited for", func(t *testing.T) {
		run(t, Config{MaxUnwrittenCalls: 2, MaxUnwrittenBytes: -1}, true, 0, 0, 5, func(t *testing.T, e env) {
			if n, r := e.got(), e.refused(); n != 2 || r != 3 {
				t.Fatalf("5 calls with 2 allowed running: %d admitted, %d refused; want 2, 3 (every message read)", n, r)
			}
			e.release(2)
			if n := e.c.inCalls.Load(); n != 0 {
				t.Fatalf("%d calls counted after every release; want 0", n)
			}
		})
	})
	t.Run("no backpressure", func(t *testing.T) {
		run(t, Config{MaxUnwrittenCalls: 4, MaxUnwrittenBytes: msgSize}, false, 4, 0, 10, func(t *testing.T, e env) {
			if n := e.got(); n != 10 {
				t.Fatalf("admitted %d of 10 messages on a connection without backpressure; want all", n)
			}
		})
	})
	t.Run("paused past the idle timeout", func(t *testing.T) {
		// A paused reader reads nothing, not even pongs: the idle
		// deadline (2 s) must not close the connection under it, nor
		// the first read after it. (The writer's timeout, whose job it
		// is to close a peer that reads nothing, is set beyond the test.)
		cfg := Config{MaxUnwrittenCalls: 2, MaxUnwrittenBytes: -1, PingInterval: time.Hour, IdleTimeout: 2 * time.Second, WriteTimeout: 2 * time.Hour}
		run(t, cfg, true, 2, 0, 3, func(t *testing.T, e env) {
			if n := e.got() + e.refused(); n > 1 {
				t.Fatalf("%d read; want at most 1 (paused)", n)
			}
			time.Sleep(time.Minute)
			synctest.Wait()
			select {
			case <-e.c.Done():
				t.Fatalf("a paused connection closed: %v", e.c.err)
			default:
			}
			e.read()
			if n, r := e.got(), e.refused(); n != 2 || r != 1 {
				t.Fatalf("once the peer read: %d admitted, %d refused; want 2, 1", n, r)
			}
			select {
			case <-e.c.Done():
				t.Fatalf("closed once reading again after a minute's pause: %v", e.c.err)
			default:
			}
		})
	})
}

// TestBoundedLinkKeepsCarryingAnswers: the link of an agent the hub
// accepted, whose own calls through the hub fill the bound on calls
// running, still carries the agent's answers to the hub's calls (and so
// its heartbeats and cancels): the calls past the bound are refused
// OVERLOADED, not sent, and the reader goes on. (With a pause on running
// calls, the hub's call waited for its deadline, and an agent whose long
// calls held the bound missed its heartbeats and expired.)
func TestBoundedLinkKeepsCarryingAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sws, cws := pipeWS(t)
		hold := make(chan struct{})
		hub := New(sws, Config{MaxUnwrittenCalls: 2, MaxUnwrittenBytes: -1, PingInterval: time.Hour},
			Accepted(),
			WithHandler(func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
				<-hold // the agent's own long calls
				return &envelope.Response{ID: req.ID, Result: json.RawMessage(`"done"`)}, nil
			}))
		agent := New(cws, Config{PingInterval: time.Hour},
			WithHandler(func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
				return &envelope.Response{ID: req.ID, Result: json.RawMessage(`"pong"`)}, nil
			}))
		defer hub.Close()
		defer agent.Close()
		call := func(l *Link, method string) (*envelope.Response, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			return l.Call(ctx, &envelope.Request{ID: envelope.NewID(), Method: method, Version: envelope.Version})
		}
		var wg sync.WaitGroup
		for range 2 {
			wg.Go(func() {
				if _, err := call(agent, "slow.call"); err != nil {
					t.Errorf("an admitted long call: %v", err)
				}
			})
		}
		synctest.Wait()
		if _, err := call(agent, "slow.call"); envelope.CodeOf(err) != envelope.CodeOverloaded || !envelope.AsError(err).NotSent() {
			t.Errorf("a call past the bound: %v; want OVERLOADED, not sent", err)
		}
		start := time.Now()
		res, err := call(hub, "agent.ping")
		if err != nil || string(res.Result) != `"pong"` {
			t.Fatalf("the hub's call to the agent while its own calls fill the bound: %v, %v", res, err)
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("the agent's answer took %v of the bubble's time; want it at once", d)
		}
		close(hold)
		wg.Wait()
	})
}

// TestPeerLinkHasNoCallBound: an accepted link marked WithoutCallBound
// (a peer hub's: it carries every caller of that hub, each bounded there)
// admits calls past MaxUnwrittenCalls instead of refusing them
// OVERLOADED, so that one caller of the peer cannot refuse the others'.
func TestPeerLinkHasNoCallBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sws, cws := pipeWS(t)
		hold := make(chan struct{})
		hub := New(sws, Config{MaxUnwrittenCalls: 2, MaxUnwrittenBytes: -1, PingInterval: time.Hour},
			Accepted(), WithoutCallBound(),
			WithHandler(func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
				<-hold
				return &envelope.Response{ID: req.ID, Result: json.RawMessage(`"done"`)}, nil
			}))
		peer := New(cws, Config{PingInterval: time.Hour})
		defer hub.Close()
		defer peer.Close()
		var wg sync.WaitGroup
		for range 4 { // twice the bound
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if _, err := peer.Call(ctx, &envelope.Request{ID: envelope.NewID(), Method: "forwarded.call", Version: envelope.Version}); err != nil {
					t.Errorf("a forwarded call past the bound: %v; want it served", err)
				}
			})
		}
		synctest.Wait()
		if n := hub.Serving(); n != 4 {
			t.Errorf("%d calls running; want all 4", n)
		}
		close(hold)
		wg.Wait()
	})
}
