package wsconn

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/wspipe"
)

// TestOneExchangePerInterval: two ends that both ping every second keep
// their link alive with one ping a second between them, not two, and it
// is the dialling end's (an agent's): the accepting end (the hub) waits
// 1.25 intervals from the peer's last ping, so its timer never fires;
// an end whose peer never pings pings every interval itself; an end whose
// peer goes silent closes the link within IdleTimeout.
func TestOneExchangePerInterval(t *testing.T) {
	cfg := Config{PingInterval: time.Second}
	nothing := func([]byte, *envelope.Error) {}
	t.Run("both ends ping", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			sws, cws := wspipe.Pair(t)
			a, b := NewConn(sws, cfg), NewConn(cws, cfg)
			a.Start(nothing, nil)
			// The dialling end starts after the accepting one, as
			// over a socket, but late (within the 0.25 interval the
			// accepting end gives it). Not later: over net.Pipe,
			// which has no buffer, two pongs written at once by
			// the two readers would block each other.
			time.Sleep(200 * time.Millisecond)
			b.Start(nothing, nil)
			time.Sleep(60 * time.Second)
			synctest.Wait()
			if a.Err() != nil || b.Err() != nil {
				t.Fatalf("link closed: %v, %v", a.Err(), b.Err())
			}
			sent := a.pingsSent.Load() + b.pingsSent.Load()
			t.Logf("60 s: %d pings (a %d, b %d)", sent, a.pingsSent.Load(), b.pingsSent.Load())
			if sent < 55 || sent > 65 {
				t.Errorf("60 s at 1 s intervals: %d pings in all; want about 60 (one exchange a second)", sent)
			}
			if n := a.pingsSent.Load(); n > 1 {
				t.Errorf("the accepting end sent %d pings; want at most 1 (its peer pings)", n)
			}
			a.Close()
			b.Close()
		})
	})
	t.Run("peer never pings", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			sws, cws := wspipe.Pair(t)
			a := NewConn(sws, cfg)
			a.Start(nothing, nil)
			go func() { // answers pings (gorilla's default handler)
				for {
					if _, _, err := cws.ReadMessage(); err != nil {
						return
					}
				}
			}()
			done := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() { // and sends a frame every 200 ms, never a ping (a chatty browser)
				for {
					select {
					case <-done:
						return
					case <-time.After(200 * time.Millisecond):
					}
					if cws.WriteMessage(websocket.TextMessage, []byte(`"x"`)) != nil {
						return
					}
				}
			})
			time.Sleep(30 * time.Second)
			synctest.Wait()
			if a.Err() != nil {
				t.Fatalf("link closed: %v", a.Err())
			}
			if n := a.pingsSent.Load(); n < 28 || n > 31 {
				t.Errorf("30 s at 1 s intervals, the peer sending frames but never pinging: %d pings; want 30", n)
			}
			if NewConn(sws, Config{PingInterval: time.Second, IdleTimeout: 1500 * time.Millisecond}).mayskip() {
				t.Error("with IdleTimeout 1.5 intervals pings may be skipped; want every ping sent (a skip allows 1.5 intervals of silence)")
			}
			close(done)
			a.Close()
			cws.Close()
			wg.Wait()
		})
	})
	t.Run("peer goes silent", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			sws, cws := wspipe.Pair(t)
			a := NewConn(sws, cfg)
			start := time.Now()
			a.Start(nothing, nil) // cws never reads: no pong, nothing
			<-a.Done()
			if took := time.Since(start); took > a.cfg.IdleTimeout {
				t.Errorf("silent peer found dead after %v; want within IdleTimeout %v", took, a.cfg.IdleTimeout)
			}
			cws.Close()
		})
	})
}

// TestPingsOnGrid: links started at scattered times ping on the steps of
// one grid of the clock (onPingGrid), so that their pings arrive together
// at the far end, which answers them in one wake-up instead of one each;
// an interval stays within a step of what is configured.
func TestPingsOnGrid(t *testing.T) {
	const links = 8
	cfg := Config{PingInterval: time.Second}
	step := min(maxPingGrid, cfg.PingInterval/64)
	nothing := func([]byte, *envelope.Error) {}
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var at []time.Time // when the far ends heard a ping
		perLink := make([][]time.Time, links)
		var conns []*Conn
		var wg sync.WaitGroup
		for i := range links {
			// Started 1-8 ms past a step of the grid: within one step,
			// as links dialled in a burst are.
			time.Sleep(time.Millisecond)
			sws, cws := wspipe.Pair(t)
			c := NewConn(cws, cfg) // the dialling end pings
			sws.SetPingHandler(func(data string) error {
				now := time.Now()
				mu.Lock()
				at = append(at, now)
				perLink[i] = append(perLink[i], now)
				mu.Unlock()
				return sws.WriteControl(websocket.PongMessage, []byte(data), now.Add(time.Second))
			})
			wg.Go(func() {
				for {
					if _, _, err := sws.ReadMessage(); err != nil {
						return
					}
				}
			})
			c.Start(nothing, nil)
			conns = append(conns, c)
		}
		time.Sleep(20 * time.Second)
		synctest.Wait()
		for _, c := range conns {
			if c.Err() != nil {
				t.Fatalf("link closed: %v", c.Err())
			}
			c.Close()
		}
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		instants := map[int64]bool{}
		for _, a := range at {
			if a.UnixNano()%int64(step) != 0 {
				t.Fatalf("a ping at %v, off the %v grid", a, step)
			}
			instants[a.UnixNano()] = true
		}
		if len(at) < links*18 {
			t.Fatalf("%d pings from %d links in 20 s at 1 s intervals; want about %d", len(at), links, links*20)
		}
		// Every link's pings leave at the same instants as the others'.
		if len(instants) > len(at)/links+1 {
			t.Errorf("%d pings at %d distinct instants; want the %d links' pings together (about %d instants)", len(at), len(instants), links, len(at)/links)
		}
		for i, p := range perLink {
			for j := 1; j < len(p); j++ {
				if d := p[j].Sub(p[j-1]); d < cfg.PingInterval || d > cfg.PingInterval+step {
					t.Fatalf("link %d: %v between pings; want %v to %v", i, d, cfg.PingInterval, cfg.PingInterval+step)
				}
			}
		}
		t.Logf("%d pings from %d links at %d instants", len(at), links, len(instants))
	})
}
