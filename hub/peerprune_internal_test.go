package hub

import (
	"context"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/internal/freeport"
	"github.com/agentmesh/agentmesh/registry"
	"github.com/agentmesh/agentmesh/registry/memory"
)

// TestPeerStateForgotten: a peer that is down and no longer behind any
// instance in the registry (a hub restarted under a new id, or gone) is
// forgotten once its re-dial loop ends, so that the peers' map does not
// keep every peer that ever was.
func TestPeerStateForgotten(t *testing.T) {
	reg := memory.New()
	defer reg.Close()
	h, err := New(Config{ID: "hub-A", PeerHeartbeat: 100 * time.Millisecond}, WithRegistry(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Shutdown(context.Background())
	// An address nothing listens on: every dial fails at once.
	dead := freeport.Addr(t)
	if _, err := reg.Register(t.Context(), registry.Registration{InstanceID: "far", Name: "far", Hub: "hub-gone", HubAddr: dead,
		Capabilities: []string{"far.work"}, HeartbeatInterval: time.Minute}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := h.peers.link(ctx, "hub-gone", dead); err == nil {
		t.Fatal("a link to an address nothing listens on")
	}
	count := func() int {
		h.peers.mu.Lock()
		defer h.peers.mu.Unlock()
		return len(h.peers.hubs)
	}
	if n := count(); n != 1 {
		t.Fatalf("%d peers known after a failed dial; want 1", n)
	}
	if err := reg.Deregister(t.Context(), "far"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for count() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d peers still known 5 s after the last instance behind them left; want 0", count())
		}
		time.Sleep(20 * time.Millisecond)
	}
}
