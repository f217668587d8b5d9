package peering

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentmesh/agentmesh/internal/freeport"
	"github.com/agentmesh/agentmesh/link"
)

// TestPeerStateForgotten: a peer that is down and no longer behind any
// instance in the registry (a hub restarted under a new id, or gone) is
// forgotten once its re-dial loop ends, so that the pool's map does not
// keep every peer that ever was. The dials are real (refused at once);
// the backoffs run on synctest's clock.
func TestPeerStateForgotten(t *testing.T) {
	dead := freeport.Addr(t) // nothing listens there: every dial fails at once
	synctest.Test(t, func(t *testing.T) { peerStateForgotten(t, dead) })
}

func peerStateForgotten(t *testing.T, dead string) {
	var wanted atomic.Bool
	wanted.Store(true)
	ctx, stop := context.WithCancel(context.Background())
	lc := link.Config{PingInterval: 100 * time.Millisecond}
	p := New(ctx, Config{Link: lc.WithDefaults(), Log: slog.New(slog.DiscardHandler),
		Track: func(*link.Link) bool { return true }, Untrack: func(*link.Link) {},
		Wanted: func(hub, addr string) bool { return wanted.Load() }})
	defer func() { stop(); p.Shutdown() }()
	dctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := p.Link(dctx, "hub-gone", dead); err == nil {
		t.Fatal("a link to an address nothing listens on")
	}
	count := func() int {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.hubs)
	}
	if n := count(); n != 1 {
		t.Fatalf("%d peers known after a failed dial; want 1", n)
	}
	if !p.IsDown("hub-gone", dead) {
		t.Fatal("the peer is not down after a failed dial")
	}
	wanted.Store(false) // the last instance behind it left the registry
	// The re-dial loop looks again after its backoff (at most 1 s).
	time.Sleep(2 * time.Second)
	synctest.Wait()
	if n := count(); n != 0 {
		t.Fatalf("%d peers still known 2 s after the last instance behind them left; want 0", n)
	}
}
