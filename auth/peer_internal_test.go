package auth

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
)

// TestReplayCache: a peer token's id is refused a second time until its
// token expires; the cache is bounded: full of live ids it refuses new
// ones (OVERLOADED: forgetting one would let it be replayed), and makes
// room as they expire.
func TestReplayCache(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newReplayCache()
		exp := time.Now().Add(PeerTokenTTL)
		if err := r.use("a", exp); err != nil {
			t.Fatalf("first use: %v", err)
		}
		if err := r.use("a", exp); envelope.CodeOf(err) != envelope.CodeUnauthenticated {
			t.Fatalf("second use: %v; want UNAUTHENTICATED", err)
		}
		time.Sleep(PeerTokenTTL)
		if err := r.use("a", time.Now().Add(PeerTokenTTL)); err != nil {
			t.Fatalf("after the first token expired, an id seen then: %v", err)
		}
		for i := 1; i < peerReplayMax; i++ {
			if err := r.use(fmt.Sprint(i), time.Now().Add(PeerTokenTTL+time.Duration(i)*time.Microsecond)); err != nil {
				t.Fatalf("id %d of %d: %v", i, peerReplayMax, err)
			}
		}
		err := r.use("one too many", time.Now().Add(PeerTokenTTL))
		if envelope.CodeOf(err) != envelope.CodeOverloaded {
			t.Fatalf("past %d live ids: %v; want OVERLOADED", peerReplayMax, err)
		}
		if err := r.use("a", time.Now().Add(PeerTokenTTL)); envelope.CodeOf(err) != envelope.CodeUnauthenticated {
			t.Fatalf("a live id while full: %v; want UNAUTHENTICATED (still remembered)", err)
		}
		time.Sleep(PeerTokenTTL + time.Second)
		if err := r.use("one too many", time.Now().Add(PeerTokenTTL)); err != nil {
			t.Fatalf("once the ids expired: %v", err)
		}
		if n := len(r.seen); n != 1 {
			t.Errorf("%d ids kept; want 1 (the expired ones dropped)", n)
		}
	})
}
