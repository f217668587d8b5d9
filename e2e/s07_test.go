package e2e_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/faultproxy"
	"github.com/agentmesh/agentmesh/internal/scenario"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
)

// TestS07SlowAndLossyPeerLink is scenario S07, variants (a) and (c), tier A
// (variant (b), packet loss on C's interface, needs nft: tier B). Three
// hubs on etcd; only cross-hub traffic: clients on A, echo agents on C,
// which advertises a fault proxy so that the A→C peer link crosses it.
// Load 300 req/s, timeout 2 s, retries 2 (idempotent, at the hub).
//
//	(a) the proxy delays both directions by 75 ms ± 50 ms;
//	(c) it then drops 50 % of the chunks in both directions for 1 s, which
//	    breaks the WebSocket framing.
//
// Pass (RELIABILITY.md S07): no call answered later than its deadline +
// 100 ms; (a) success >= 99.5 % and p99 <= 400 ms; (c) the corrupted link
// is closed and a new one dialled within 3 s, the calls in flight on it
// answered (UNAVAILABLE or a retried result); lost = 0, misdelivered = 0.
// Not checked here: the ttl header seen by the agent (sampled spans).
//
// Short variant (-short): 4 s healthy, (a) for 10 s (the scenario's is
// 20 s), 4 s, (c) for 1 s, 6 s after; full: 10 s, 20 s, 5 s, 1 s, 14 s.
func TestS07SlowAndLossyPeerLink(t *testing.T) {
	healthy, delay, gap, drop, after := 10*time.Second, 20*time.Second, 5*time.Second, time.Second, 14*time.Second
	if testing.Short() {
		healthy, delay, gap, after = 4*time.Second, 10*time.Second, 4*time.Second, 6*time.Second
	}
	srv := etcdtest.Start(t)
	// The bulkhead is raised from DESIGN's 100 concurrent calls per method:
	// at 300 req/s over a 250 ms round trip hub A holds 75 calls to C on
	// average, and the default queued them in bursts (measured, full
	// variant: (a) p99 488 ms with 100, 245 ms with 400). S07 is about the
	// link's delay, not the bulkhead's sizing.
	cfg := writeFile(t, "mesh.yaml", `policies:
  "echo.*": { timeout: 2s, retries: 2, idempotent: true, backoff: { strategy: exponential, initial: 10ms, max: 40ms } }
bulkhead: { maxConcurrent: 400, queueSize: 1000, queueTimeout: 30s }
`)
	addrC := freeAddr(t)
	proxy, err := faultproxy.New(t.Context(), addrC)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	common := []string{"--heartbeat", "500ms", "--registry", "etcd", "--etcd-endpoints", srv.Endpoint,
		"--etcd-prefix", "/s07/", "--config", cfg}
	a := hubAt(t, freeAddr(t), append(common, "--id", "hub-A")...)
	hubAt(t, freeAddr(t), append(common, "--id", "hub-B")...)
	c := hubAt(t, addrC, append(common, "--id", "hub-C", "--advertise", proxy.Addr())...)
	for _, id := range []string{"echo-C1", "echo-C2"} {
		start(t, "meshctl", "agent", "run", "echo", "--id", id, "--hub", c.ws)
	}
	cl, err := mesh.NewClient([]string{a.ws}, mesh.WithoutReliability(), mesh.WithWaitForReady())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	waitFor(t, "hub A to route to C's agents", 15*time.Second, func() bool {
		ids, _ := agentsOf(t.Context(), cl)
		return len(ids) == 2 && cl.Call(t.Context(), "echo.echo", 1, nil) == nil
	})

	var delayAt, delayEnd, dropAt, dropEnd time.Time
	faults := make(chan struct{})
	go func() {
		defer close(faults)
		time.Sleep(healthy)
		delayAt = time.Now()
		proxy.Delay(faultproxy.Both, 75*time.Millisecond, 50*time.Millisecond)
		time.Sleep(delay)
		delayEnd = time.Now()
		proxy.Heal()
		time.Sleep(gap)
		dropAt = time.Now()
		proxy.DropChunks(faultproxy.Both, 0.5, drop)
		time.Sleep(drop)
		dropEnd = time.Now()
	}()
	led := scenario.NewLedger()
	var cs calls
	sent := scenario.Drive(context.Background(), 300, healthy+delay+gap+drop+after, 2000, func(ctx context.Context, i int, intended time.Time) {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		led.Call(ctx, cs.invoker("A", cl.Invoke, intended), "echo.echo", true, i, intended)
	})
	<-faults
	s := led.Summarize("S07-short", sent)
	if !testing.Short() {
		s.Scenario = "S07"
	}
	s.Print(os.Stdout)

	late := cs.where(func(c call) bool { return c.End.Sub(c.Start) > 2100*time.Millisecond })
	healthyCalls := cs.where(func(c call) bool { return c.Intended.Before(delayAt) })
	// (a): calls sent while the delay was on, from 200 ms in (the first
	// chunks' delay only starts then).
	slow := cs.where(func(c call) bool {
		return c.Intended.After(delayAt.Add(200*time.Millisecond)) && c.Intended.Before(delayEnd)
	})
	slowOK := 0
	for _, c := range slow {
		if c.Code == envelope.CodeOK {
			slowOK++
		}
	}
	// (c): the link's loss and the next dial, from A's log.
	lost := logTimes(a.proc, "peer link lost", dropAt)
	back := logTimes(a.proc, "peer link back", dropAt)
	// A link re-dialled while the drop is still on may be corrupted
	// again: "back" is the first re-dial after the last loss.
	var closedAfter, backAfter time.Duration = -1, -1
	if len(lost) > 0 {
		closedAfter = lost[0].Sub(dropAt)
		for _, b := range back {
			if b.After(lost[len(lost)-1]) {
				backAfter = b.Sub(dropAt)
				break
			}
		}
	}
	around := cs.where(func(c call) bool {
		return c.Intended.After(dropAt.Add(-100*time.Millisecond)) && c.Intended.Before(dropEnd.Add(3*time.Second))
	})
	acc, open, dropped := proxy.Stats()

	t.Logf("S07: %d calls, %d ok, failed %v, lost %d, misdelivered %d, p99 %.1f ms", sent, s.Succeeded, s.Failed, s.Lost, s.Misdelivered, s.P99Ms)
	t.Logf("S07: healthy: %d calls, p99 %v", len(healthyCalls), p99(healthyCalls))
	t.Logf("S07 (a) 75±50 ms each way: %d calls, %d ok (%.2f%%), by code %v, p99 %v",
		len(slow), slowOK, 100*float64(slowOK)/float64(max(len(slow), 1)), byCode(slow), p99(slow))
	t.Logf("S07 (c) 50%% chunk drop for %v: %d chunks dropped; peer link lost %v after the drop began (%d losses logged), back for good %v after it began; calls from 100 ms before to 3 s after: %d, by code %v",
		drop, dropped, closedAfter, len(lost), backAfter, len(around), byCode(around))
	t.Logf("S07: proxy accepted %d connections (%d open at the end); %d calls answered later than deadline + 100 ms", acc, open, len(late))

	if s.Lost != 0 || s.Misdelivered != 0 {
		t.Errorf("lost %d, misdelivered %d; want 0", s.Lost, s.Misdelivered)
	}
	if len(late) > 0 {
		t.Errorf("%d calls answered later than their deadline + 100 ms (first took %v)", len(late), late[0].End.Sub(late[0].Start))
	}
	if rate := float64(slowOK) / float64(max(len(slow), 1)); len(slow) == 0 || rate < 0.995 {
		t.Errorf("(a) success %.2f%% over %d calls; want >= 99.5%%", 100*rate, len(slow))
	}
	if p := p99(slow); p > 400*time.Millisecond {
		t.Errorf("(a) p99 %v; want <= 400 ms", p)
	}
	if dropped == 0 {
		t.Error("(c) the proxy dropped no chunk: the fault did not happen")
	}
	if closedAfter < 0 || closedAfter > 3*time.Second {
		t.Errorf("(c) the corrupted peer link was closed %v after the drop began (-1: never); want <= 3 s", closedAfter)
	}
	if backAfter < 0 || backAfter > 3*time.Second {
		t.Errorf("(c) a new peer link was up %v after the drop began (-1: never); want <= 3 s", backAfter)
	}
	for _, c := range around {
		if c.Code != envelope.CodeOK && c.Code != envelope.CodeUnavailable {
			t.Errorf("(c) calls around the corruption by code %v; want only OK and UNAVAILABLE", byCode(around))
			break
		}
	}
}
