package e2e_test

import (
	"cmp"
	"context"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/faultproxy"
	"github.com/agentmesh/agentmesh/internal/scenario"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
)

// s05Config is the hubs' policy file of S05 and S07: echo.* (the method
// served on several hubs) and chaos.* (served on one) are idempotent, with
// short backoffs so that a call that finds its only instance unreachable
// gives up within the fail-fast bound.
const s05Config = `policies:
  "echo.*": { timeout: 5s, retries: 2, idempotent: true, backoff: { strategy: exponential, initial: 10ms, max: 40ms } }
  "chaos.*": { timeout: 5s, retries: 2, idempotent: true, backoff: { strategy: exponential, initial: 10ms, max: 40ms } }
`

// TestS05PartitionBetweenHubs is scenario S05, variant (a), tier A: three
// hubs on etcd; m (echo.echo) has instances on A and C, n (chaos.echo,
// 100 ms service time) only on C. Hub C advertises a fault proxy as its
// address, so every peer link A→C and B→C crosses it. Under 300 req/s from
// clients on A and B, the proxy blackholes C's peer links (both directions,
// sockets kept open: TCP notices nothing) and heals them later. C keeps
// its etcd connection.
//
// Pass (RELIABILITY.md S05): A and B detect the dead peer link within 3 s;
// calls in flight to C are answered UNAVAILABLE at detection; m keeps
// >= 99 % success; n fails fast with UNAVAILABLE (p99 <= 50 ms after
// detection); after heal the peer links are back and every hub's routing
// table equals etcd's content within 5 s; lost = 0, misdelivered = 0;
// leak check (leak_test.go) 2× the 5 s timeout after the load: nothing
// pending on the hubs, the 5 agents or the clients, goroutines <= baseline
// + 20 on each and on the test process, hub heap after GC <= +10 %.
//
// The short variant (-short) runs 5 s healthy, a 10 s partition (the
// scenario's is 20 s) and 7 s after heal; the full one 20 s, 20 s, 20 s.
func TestS05PartitionBetweenHubs(t *testing.T) {
	healthy, partition, after := 20*time.Second, 20*time.Second, 20*time.Second
	if testing.Short() {
		healthy, partition, after = 5*time.Second, 10*time.Second, 7*time.Second
	}
	srv := etcdtest.Start(t)
	cfg := writeFile(t, "mesh.yaml", s05Config)
	addrC := freeAddr(t)
	proxy, err := faultproxy.New(t.Context(), addrC)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	common := []string{"--heartbeat", "500ms", "--registry", "etcd", "--etcd-endpoints", srv.Endpoint,
		"--etcd-prefix", "/s05/", "--config", cfg, "--admin-addr", "127.0.0.1:0"}
	a := hubAt(t, freeAddr(t), append(common, "--id", "hub-A")...)
	b := hubAt(t, freeAddr(t), append(common, "--id", "hub-B")...)
	c := hubAt(t, addrC, append(common, "--id", "hub-C", "--advertise", proxy.Addr())...)
	agentProcs := map[string]*proc{}
	for id, h := range map[string]*hub{"m-A1": a, "m-A2": a, "m-C1": c, "m-C2": c} {
		agentProcs[id] = start(t, "meshctl", "agent", "run", "echo", "--id", id, "--hub", h.ws, "--metrics-addr", "127.0.0.1:0")
	}
	agentProcs["n-C1"] = start(t, "meshctl", "agent", "run", "chaos", "--id", "n-C1", "--latency", "100ms", "--hub", c.ws, "--metrics-addr", "127.0.0.1:0")

	clients := map[string]*mesh.Client{}
	for name, h := range map[string]*hub{"A": a, "B": b} {
		cl, err := mesh.NewClient([]string{h.ws}, mesh.WithoutReliability(), mesh.WithWaitForReady())
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		clients[name] = cl
	}
	waitFor(t, "hubs A and B to see the five agents", 15*time.Second, func() bool {
		ia, _ := hubInstances(t.Context(), a.ws)
		ib, _ := hubInstances(t.Context(), b.ws)
		return len(ia) == 5 && len(ib) == 5
	})
	for _, name := range []string{"A", "B"} { // open the peer links to C through the proxy
		for _, to := range []string{"m-C1", "n-C1"} {
			method := map[string]string{"m-C1": "echo.echo", "n-C1": "chaos.echo"}[to]
			if err := clients[name].Call(t.Context(), method, 1, nil, mesh.To(to)); err != nil {
				t.Fatalf("%s via hub %s: %v", to, name, err)
			}
		}
	}
	// Warm up, then take the leak check's baselines: the 3 hubs and the 5
	// agent processes.
	for i := range 60 {
		_ = clients[[]string{"A", "B"}[i%2]].Call(t.Context(), []string{"echo.echo", "chaos.echo"}[i%3/2], i, nil)
	}
	leakProcs := []leakProc{leakHub(t, "hub-A", a.proc), leakHub(t, "hub-B", b.proc), leakHub(t, "hub-C", c.proc)}
	for id, ap := range agentProcs {
		leakProcs = append(leakProcs, leakAgent(t, id, ap))
	}
	leaks := leakBaseline(t, leakProcs...)
	peerLinks := map[string]float64{"A": metric(a.base, `agentmesh_links{kind="peer"}`), "B": metric(b.base, `agentmesh_links{kind="peer"}`)}
	if peerLinks["A"] < 1 || peerLinks["B"] < 1 {
		t.Fatalf("agentmesh_links{kind=\"peer\"} before the fault: %v; want >= 1 on A and B", peerLinks)
	}

	led := scenario.NewLedger()
	var cs calls
	var blackholeAt, healAt time.Time
	tablesAt := time.Duration(-1) // after heal, when every hub's table matched etcd's
	faults := make(chan struct{})
	go func() {
		defer close(faults)
		time.Sleep(healthy)
		blackholeAt = time.Now()
		proxy.Blackhole()
		time.Sleep(partition)
		healAt = time.Now()
		proxy.Unblackhole()
		// Every hub's routing table against etcd's content, polled.
		for time.Since(healAt) < after {
			if tablesMatch(srv.Endpoint, "/s05/", a, b, c) {
				tablesAt = time.Since(healAt)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	sent := scenario.Drive(context.Background(), 300, healthy+partition+after, 2000, func(ctx context.Context, i int, intended time.Time) {
		name := []string{"A", "B"}[i%2]
		method := "echo.echo" // m, 2/3 of the load
		if i%3 == 2 {
			method = "chaos.echo" // n
		}
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		led.Call(ctx, cs.invoker(name, clients[name].Invoke, intended), method, true, i, intended)
	})
	<-faults
	s := led.Summarize("S05-short", sent)
	if !testing.Short() {
		s.Scenario = "S05"
	}
	s.Print(os.Stdout)

	leakFig := leaks.check(t, 10*time.Second, clients["A"], clients["B"]) // 2× the 5 s timeout
	scenario.Emit(map[string]any{"scenario": s.Scenario + "-leak", "leak": leakFig})
	acc, open, dropped := proxy.Stats()
	t.Logf("S05: proxy accepted %d connections (%d open at the end, %d chunks dropped)", acc, open, dropped)
	s05Verdict(t, s05Run{name: "S05", sent: sent, s: s, cs: &cs, a: a, b: b,
		blackholeAt: blackholeAt, healAt: healAt, tablesAt: tablesAt, peerLinks: peerLinks})
}

// s05Run is what a run of S05 (tier A or the netns lab) hands to
// s05Verdict: the load's record, the hubs with clients, the fault's times,
// when the routing tables matched etcd's after heal and the peer links
// counted before the fault.
type s05Run struct {
	name                string
	sent                int
	s                   scenario.Summary
	cs                  *calls
	a, b                *hub
	blackholeAt, healAt time.Time
	tablesAt            time.Duration
	peerLinks           map[string]float64
	// leaseMayExpire: C lost etcd too (variant b), so its agents may
	// leave A's and B's tables before the peer links are found dead;
	// the calls pending on them are then answered UNAVAILABLE already,
	// and in-flight calls answered so after the blackhole count as in
	// time.
	leaseMayExpire bool
}

// s05Verdict checks the pass criteria of S05 on a run.
func s05Verdict(t *testing.T, r s05Run) {
	t.Helper()
	sent, s, cs, a, b := r.sent, r.s, r.cs, r.a, r.b
	blackholeAt, healAt, tablesAt, peerLinks := r.blackholeAt, r.healAt, r.tablesAt, r.peerLinks
	// Detection: each hub logs "peer link lost" when the heartbeat gives
	// up on its link to C.
	detect := map[string]time.Duration{}
	for name, h := range map[string]*hub{"A": a, "B": b} {
		ts := logTimes(h.proc, "peer link lost", blackholeAt)
		if len(ts) == 0 {
			t.Errorf("hub %s never logged its peer link to C lost", name)
			continue
		}
		detect[name] = ts[0].Sub(blackholeAt)
		if detect[name] > 3*time.Second {
			t.Errorf("hub %s found its link to C dead %v after the blackhole; want <= 3 s", name, detect[name])
		}
	}
	detectAt := func(client string) time.Time { return blackholeAt.Add(detect[client]) }

	// Calls of n in flight when the link died: sent before detection and
	// not answered by the time a healthy call (100 ms) would have been.
	var inflight []call
	for _, name := range []string{"A", "B"} {
		d := detectAt(name)
		inflight = append(inflight, cs.where(func(c call) bool {
			return c.Client == name && c.Method == "chaos.echo" && c.Intended.Before(d) &&
				c.Intended.After(blackholeAt.Add(-100*time.Millisecond)) && c.End.After(blackholeAt.Add(150*time.Millisecond))
		})...)
	}
	var lateInflight int
	var offMin, offMax time.Duration // answered when, relative to detection, of those off
	for _, c := range inflight {
		d := detectAt(c.Client)
		from := d.Add(-100 * time.Millisecond)
		if r.leaseMayExpire {
			from = blackholeAt
		}
		if c.Code != envelope.CodeUnavailable || c.End.Before(from) || c.End.After(d.Add(300*time.Millisecond)) {
			if off := c.End.Sub(d); lateInflight == 0 {
				offMin, offMax = off, off
			} else {
				offMin, offMax = min(offMin, off), max(offMax, off)
			}
			lateInflight++
		}
	}
	// m over the whole run.
	ms := cs.where(func(c call) bool { return c.Method == "echo.echo" })
	mOK := len(cs.where(func(c call) bool { return c.Method == "echo.echo" && c.Code == envelope.CodeOK }))
	// n during the partition, once both hubs had detected it.
	lastDetect := blackholeAt.Add(max(detect["A"], detect["B"]))
	nPart := cs.where(func(c call) bool {
		return c.Method == "chaos.echo" && c.Intended.After(lastDetect.Add(100*time.Millisecond)) && c.Intended.Before(healAt)
	})
	if p99(nPart) > 50*time.Millisecond { // where the slow ones are
		slow := slices.Clone(nPart)
		slices.SortFunc(slow, func(x, y call) int { return cmp.Compare(y.End.Sub(y.Intended), x.End.Sub(x.Intended)) })
		for _, c := range slow[:min(len(slow), 12)] {
			t.Logf("%s: slow n: intended %v after the blackhole, sent %v late, took %v, %s via %s",
				r.name, c.Intended.Sub(blackholeAt).Round(time.Millisecond), c.Start.Sub(c.Intended).Round(time.Millisecond),
				c.End.Sub(c.Start).Round(time.Millisecond), c.Code, c.Client)
		}
	}
	nPartUnavailable := len(cs.where(func(c call) bool {
		return c.Method == "chaos.echo" && c.Intended.After(lastDetect.Add(100*time.Millisecond)) && c.Intended.Before(healAt) &&
			c.Code == envelope.CodeUnavailable
	}))
	// n after heal: first success through each hub.
	nBack := map[string]time.Duration{}
	for _, name := range []string{"A", "B"} {
		ok := cs.where(func(c call) bool {
			return c.Client == name && c.Method == "chaos.echo" && c.Code == envelope.CodeOK && c.Intended.After(healAt)
		})
		if len(ok) > 0 {
			first := slices.MinFunc(ok, func(x, y call) int { return x.Intended.Compare(y.Intended) })
			nBack[name] = first.Intended.Sub(healAt)
		}
	}

	// After heal (the load has ended by now): peer links back as before,
	// and every hub's routing table equals etcd's content.
	linksBack := map[string]float64{"A": metric(a.base, `agentmesh_links{kind="peer"}`), "B": metric(b.base, `agentmesh_links{kind="peer"}`)}
	t.Logf("%s: %d calls, %d ok, failed %v, lost %d, misdelivered %d, p99 %.1f ms", r.name, sent, s.Succeeded, s.Failed, s.Lost, s.Misdelivered, s.P99Ms)
	t.Logf("%s: peer link to C found dead %v after the blackhole (A: %v, B: %v)", r.name, detect, detect["A"], detect["B"])
	t.Logf("%s: %d calls of n in flight at the blackhole: by code %v, %d not answered UNAVAILABLE within [detection-100ms, detection+300ms]",
		r.name, len(inflight), byCode(inflight), lateInflight)
	if lateInflight > 0 {
		t.Logf("%s: those were answered from %v to %v after detection", r.name, offMin, offMax)
	}
	t.Logf("%s: m: %d/%d ok (%.2f%%), failed %v", r.name, mOK, len(ms), 100*float64(mOK)/float64(max(len(ms), 1)), byCode(ms))
	t.Logf("%s: n during the partition after detection: %d calls, by code %v, p99 %v", r.name, len(nPart), byCode(nPart), p99(nPart))
	t.Logf("%s: after heal: first n success through A %v, through B %v; peer links %v (before the fault %v); routing tables = etcd %v after heal",
		r.name, nBack["A"], nBack["B"], linksBack, peerLinks, tablesAt)

	if s.Lost != 0 || s.Misdelivered != 0 {
		t.Errorf("lost %d, misdelivered %d; want 0", s.Lost, s.Misdelivered)
	}
	if len(inflight) == 0 {
		t.Error("no call of n was in flight at the blackhole: the scenario did not test in-flight answers")
	}
	if lateInflight > 0 {
		t.Errorf("%d of %d calls in flight to C were not answered UNAVAILABLE at detection", lateInflight, len(inflight))
	}
	if rate := float64(mOK) / float64(max(len(ms), 1)); rate < 0.99 {
		t.Errorf("m success %.2f%%; want >= 99%%", 100*rate)
	}
	if len(nPart) == 0 || nPartUnavailable != len(nPart) {
		t.Errorf("n during the partition: %v; want every call UNAVAILABLE", byCode(nPart))
	}
	if p := p99(nPart); p > 50*time.Millisecond {
		t.Errorf("n during the partition: p99 %v; want <= 50 ms (fail fast)", p)
	}
	for _, name := range []string{"A", "B"} {
		if d, ok := nBack[name]; !ok || d > 5*time.Second {
			t.Errorf("n through hub %s succeeded again %v after heal (ok %v); want <= 5 s", name, d, ok)
		}
		if linksBack[name] < peerLinks[name] {
			t.Errorf("hub %s has %v peer links after heal; %v before the fault", name, linksBack[name], peerLinks[name])
		}
	}
	if tablesAt < 0 || tablesAt > 5*time.Second {
		t.Errorf("routing tables matched etcd's content %v after heal (-1: not within the run); want <= 5 s", tablesAt)
	}
}

// tablesMatch reports whether every hub's routing table lists exactly the
// instances stored in etcd under prefix.
func tablesMatch(endpoint, prefix string, hubs ...*hub) bool {
	want, err := etcdInstances(context.Background(), endpoint, prefix)
	if err != nil {
		return false
	}
	for _, h := range hubs {
		got, err := hubInstances(context.Background(), h.ws)
		if err != nil || !slices.Equal(got, want) {
			return false
		}
	}
	return true
}
