package link

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/wspipe"
)

func TestBoundedLinkKeepsCarryingAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sws, cws := wspipe.Pair(t)
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
		sws, cws := wspipe.Pair(t)
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

// TestCallWaitsForQueueRoom: calls made together beyond the send queue's
// size wait for room within their deadline instead of failing OVERLOADED
// (a thousand goroutines calling at once through a 256-frame queue: here
// 200 through 2). It fails without the wait.
func TestCallWaitsForQueueRoom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sws, cws := wspipe.Pair(t)
		srv := New(sws, Config{PingInterval: time.Hour}, Accepted(),
			WithHandler(func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
				return &envelope.Response{ID: req.ID, Result: json.RawMessage(`1`)}, nil
			}))
		cli := New(cws, Config{PingInterval: time.Hour, QueueSize: 2})
		defer srv.Close()
		defer cli.Close()
		var wg sync.WaitGroup
		var failed sync.Map
		for i := range 200 {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if _, err := cli.Call(ctx, &envelope.Request{ID: envelope.NewID(), Method: "m", Version: envelope.Version}); err != nil {
					failed.Store(i, err)
				}
			})
		}
		wg.Wait()
		failed.Range(func(k, v any) bool { t.Errorf("call %v: %v", k, v); return true })
	})
}
