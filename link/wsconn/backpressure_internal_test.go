package wsconn

import (
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/wspipe"
)

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
			sws, cws := wspipe.Pair(t)
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
