package wsconn

import (
	"testing"
	"time"
)

// TestPingPolicy: a peer pinging 20 times a second breaks the policy
// (PeerPingMin 1 s, burst 5) within half a second; one pinging once a
// second, or in a burst of five after a quiet spell, never does; the check
// allocates nothing.
func TestPingPolicy(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)

	t.Run("20 per second is cut off", func(t *testing.T) {
		p := newPingPolicy(time.Second)
		var cut time.Duration = -1
		for i := range 100 {
			at := time.Duration(i) * 50 * time.Millisecond
			if !p.allow(t0.Add(at)) {
				cut = at
				break
			}
		}
		if cut < 0 || cut > 500*time.Millisecond {
			t.Fatalf("20 pings/s cut off after %v; want within 500ms", cut)
		}
		t.Logf("20 pings/s cut off after %v", cut)
	})
	t.Run("once a second forever", func(t *testing.T) {
		p := newPingPolicy(time.Second)
		for i := range 10000 {
			// Up to 200 ms early or late, as timers on a busy host are.
			jitter := time.Duration((i%5)-2) * 100 * time.Millisecond
			if !p.allow(t0.Add(time.Duration(i)*time.Second + jitter)) {
				t.Fatalf("ping %d at about 1/s refused", i)
			}
		}
	})
	t.Run("bursts after quiet spells", func(t *testing.T) {
		p := newPingPolicy(time.Second)
		now := t0
		for round := range 20 {
			for i := range pingBurst {
				if !p.allow(now.Add(time.Duration(i) * time.Millisecond)) {
					t.Fatalf("round %d: ping %d of a burst of %d refused", round, i, pingBurst)
				}
			}
			now = now.Add(pingBurst * time.Second) // quiet long enough to earn the burst back
		}
		p = newPingPolicy(time.Second)
		for i := range pingBurst + 1 {
			if !p.allow(t0) {
				return // refused, as it should be at most at burst+1
			}
			_ = i
		}
		t.Fatalf("%d pings at the same instant all allowed; want a refusal past the burst", pingBurst+1)
	})
	t.Run("no limit", func(t *testing.T) {
		p := newPingPolicy(-1)
		for range 1000 {
			if !p.allow(t0) {
				t.Fatal("refused with no limit set")
			}
		}
	})
	t.Run("no allocation", func(t *testing.T) {
		p := newPingPolicy(time.Millisecond)
		now := t0
		if n := testing.AllocsPerRun(1000, func() {
			now = now.Add(time.Millisecond)
			p.allow(now)
		}); n != 0 {
			t.Errorf("allow allocates %.1f times per ping; want 0", n)
		}
	})
	t.Run("defaults", func(t *testing.T) {
		if got := (Config{}).WithDefaults(); got.PeerPingMin != time.Second || got.IdleTimeout != 10*time.Second {
			t.Errorf("defaults: PeerPingMin %v, IdleTimeout %v; want 1s and 10s (2 missed pings of 5s)", got.PeerPingMin, got.IdleTimeout)
		}
		if got := (Config{PingInterval: 200 * time.Millisecond}).WithDefaults(); got.PeerPingMin != 200*time.Millisecond {
			t.Errorf("PingInterval 200ms: PeerPingMin %v; want 200ms, so that peers configured alike are not cut off", got.PeerPingMin)
		}
	})
}
