package e2e_test

import (
	"context"
	"fmt"
	"maps"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	oteltrace "go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/faultproxy"
	"github.com/agentmesh/agentmesh/internal/scenario"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
	"github.com/agentmesh/agentmesh/telemetry"
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
// answered (UNAVAILABLE or a retried result); lost = 0, misdelivered = 0;
// in all phases the ttl header seen by the agent is <= the client's
// remaining time minus the time the hubs held the call, checked on
// sampled spans (checkTTLs: 20 % of the client's calls are traced, the
// hubs and agents follow the client's sampling and export to a real OTLP
// receiver; a server span records the ttl it received); leak check
// (leak_test.go) 2× the 2 s timeout after the load: nothing pending on the
// hubs, the 2 agents or the client, goroutines <= baseline + 20 on each
// and on the test process, hub heap after GC reported against +10 %.
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
	// Every process exports its spans to this receiver, every 200 ms.
	rcv := &receiver{}
	otlp := httptest.NewServer(rcv)
	defer otlp.Close()
	otelEnv := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + otlp.URL, "OTEL_BSP_SCHEDULE_DELAY=200"}
	common := []string{"--heartbeat", "500ms", "--registry", "etcd", "--etcd-endpoints", srv.Endpoint,
		"--etcd-prefix", "/s07/", "--config", cfg, "--admin-addr", "127.0.0.1:0"}
	a := hubAtEnv(t, otelEnv, freeAddr(t), append(common, "--id", "hub-A")...)
	b := hubAtEnv(t, otelEnv, freeAddr(t), append(common, "--id", "hub-B")...)
	c := hubAtEnv(t, otelEnv, addrC, append(common, "--id", "hub-C", "--advertise", proxy.Addr())...)
	agentProcs := map[string]*proc{}
	for _, id := range []string{"echo-C1", "echo-C2"} {
		agentProcs[id] = startWithEnv(t, otelEnv, "meshctl", "agent", "run", "echo", "--id", id, "--hub", c.ws, "--metrics-addr", "127.0.0.1:0")
	}
	tp, err := telemetry.NewProvider(t.Context(), telemetry.TracingConfig{ServiceName: "s07-client", Endpoint: otlp.URL, SampleRatio: 0.2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tp.Shutdown(context.Background()) }()
	var sampled sampledCalls
	cl, err := mesh.NewClient([]string{a.ws}, mesh.WithoutReliability(), mesh.WithWaitForReady(),
		mesh.WithClientTelemetry(telemetry.New(tp, nil)), mesh.WithMiddleware(sampled.middleware))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	waitFor(t, "hub A to route to C's agents", 15*time.Second, func() bool {
		ids, _ := agentsOf(t.Context(), cl)
		return len(ids) == 2 && cl.Call(t.Context(), "echo.echo", 1, nil) == nil
	})
	// The leak check's baselines: the 3 hubs and the 2 agent processes
	// (no warm-up beyond the calls above: every call of cl is traced and
	// checked by checkTTLs).
	leakProcs := []leakProc{leakHub(t, "hub-A", a.proc), leakHub(t, "hub-B", b.proc), leakHub(t, "hub-C", c.proc)}
	for id, ap := range agentProcs {
		leakProcs = append(leakProcs, leakAgent(t, id, ap))
	}
	leaks := leakBaseline(t, leakProcs...)

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
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if err := tp.Shutdown(sctx); err != nil { // the client's last spans
		t.Errorf("client tracer shutdown: %v", err)
	}
	cancel()
	ttls := checkTTLs(t, rcv, &sampled)
	s := led.Summarize("S07-short", sent)
	if !testing.Short() {
		s.Scenario = "S07"
	}
	s.Print(os.Stdout)

	leakFig := leaks.check(t, 4*time.Second, cl) // 2× the 2 s timeout
	scenario.Emit(map[string]any{"scenario": s.Scenario + "-leak", "leak": leakFig})

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
	t.Logf("S07 ttl: %d sampled calls ended OK, %d traced from the client to the agent (%d of them through a retry at hub A); longest hold at hub A %v, at hub C %v; smallest margin under the bound %v",
		ttls.ok, ttls.chains, ttls.retried, ttls.maxHeldA, ttls.maxHeldC, ttls.minMargin)

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
	for _, v := range ttls.violations {
		t.Error("ttl: " + v)
	}
	if ttls.chains < 50 || ttls.chains*10 < ttls.ok*9 {
		t.Errorf("ttl: only %d of the %d sampled calls that ended OK were traced from the client to the agent; want >= 90 %% and >= 50", ttls.chains, ttls.ok)
	}
}

// sampledCalls records, for each call the client's tracing samples, its
// remaining time when it left the client and its outcome.
type sampledCalls struct {
	mu    sync.Mutex
	calls map[string]sampledCall // by trace id
}

type sampledCall struct {
	remaining time.Duration // until the call's deadline, as the client sent it
	code      envelope.Code
}

func (sc *sampledCalls) middleware(next envelope.Invoker) envelope.Invoker {
	return func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
		span := oteltrace.SpanContextFromContext(ctx)
		dl, ok := ctx.Deadline()
		if !span.IsSampled() || !ok || req.Method != "echo.echo" {
			return next(ctx, req)
		}
		remaining := time.Until(dl) // the ttl header is written after this: it can only be smaller
		res, err := next(ctx, req)
		sc.mu.Lock()
		if sc.calls == nil {
			sc.calls = map[string]sampledCall{}
		}
		sc.calls[span.TraceID().String()] = sampledCall{remaining, envelope.CodeOf(err)}
		sc.mu.Unlock()
		return res, err
	}
}

// ttlReport is what checkTTLs found.
type ttlReport struct {
	ok, chains, retried int           // sampled calls that ended OK, of them traced client → agent, chains through a retry at A
	maxHeldA, maxHeldC  time.Duration // the longest a hub held a call before the attempt that reached the agent
	minMargin           time.Duration // the smallest (bound - ttl at the agent)
	violations          []string
}

// checkTTLs checks S07's ttl clause on every sampled call that reached an
// agent: the ttl header the agent saw is <= the client's remaining time
// minus what the hubs spent. Each agent server span is followed up its
// parents (C's attempt, C's server span, A's attempt, A's server span,
// the client's attempt); a hub held the call from its server span's start
// to the start of the attempt that reached the agent (queueing, retries
// and their backoff included). The ttl is relative, so time on the wire
// (the proxy's delay) is not subtracted: no hop can measure it.
//
// Hop by hop: A received at most the client's remaining time; C received
// at most A's ttl minus A's hold; the agent at most C's ttl minus C's
// hold. These bounds are exact (a hub's deadline starts when it reads the
// request, before its server span, and the ttl it sends is rounded down),
// so the only slack is clockTol: spans carry wall-clock times, which NTP
// may slew against the monotonic clock deadlines use. A hub that passed
// the ttl on without taking its hold off fails on any hold over 20 µs.
func checkTTLs(t *testing.T, rcv *receiver, sc *sampledCalls) ttlReport {
	t.Helper()
	sc.mu.Lock()
	calls := maps.Clone(sc.calls)
	sc.mu.Unlock()
	var r ttlReport
	for _, c := range calls {
		if c.code == envelope.CodeOK {
			r.ok++
		}
	}
	ttl := func(s span) time.Duration {
		n, err := strconv.ParseInt(s.attrs["agentmesh.ttl_ms"], 10, 64)
		if err != nil {
			return -1
		}
		return time.Duration(n) * time.Millisecond
	}
	// The hubs and agents export every 200 ms: wait until the traces of
	// the calls that ended OK have reached the agent, or 20 s.
	check := func() ttlReport {
		n := ttlReport{ok: r.ok, minMargin: time.Hour}
		for id, c := range calls {
			spans := rcv.trace(id)
			byID := map[string]span{}
			for _, s := range spans {
				byID[s.id] = s
			}
			traced := false
			for _, ag := range spans {
				if !strings.HasPrefix(ag.service, "agent-") || ag.kind != tracepb.Span_SPAN_KIND_SERVER {
					continue
				}
				cAtt, ok1 := byID[ag.parent]
				cSrv, ok2 := byID[cAtt.parent]
				aAtt, ok3 := byID[cSrv.parent]
				aSrv, ok4 := byID[aAtt.parent]
				cl, ok5 := byID[aSrv.parent]
				if !ok1 || !ok2 || !ok3 || !ok4 || !ok5 || cSrv.kind != tracepb.Span_SPAN_KIND_SERVER ||
					aSrv.kind != tracepb.Span_SPAN_KIND_SERVER || cl.service != "s07-client" {
					continue // not all exported yet
				}
				traced = true
				heldA, heldC := aAtt.start.Sub(aSrv.start), cAtt.start.Sub(cSrv.start)
				n.maxHeldA, n.maxHeldC = max(n.maxHeldA, heldA), max(n.maxHeldC, heldC)
				if aAtt.attrs["agentmesh.attempt"] != "" && aAtt.attrs["agentmesh.attempt"] != "0" {
					n.retried++
				}
				ttlA, ttlC, ttlAgent := ttl(aSrv), ttl(cSrv), ttl(ag)
				bound := c.remaining - heldA - heldC // the scenario's bound for the agent's ttl
				n.minMargin = min(n.minMargin, bound-ttlAgent)
				var bad []string
				if ttlA < 0 || ttlC < 0 || ttlAgent < 0 {
					bad = append(bad, "a server span has no ttl")
				}
				if ttlA > c.remaining {
					bad = append(bad, fmt.Sprintf("hub A received %v > the client's remaining %v", ttlA, c.remaining))
				}
				if ttlC > ttlA-heldA+clockTol(heldA) {
					bad = append(bad, fmt.Sprintf("hub C received %v > A's %v - A's hold %v", ttlC, ttlA, heldA))
				}
				if ttlAgent > ttlC-heldC+clockTol(heldC) {
					bad = append(bad, fmt.Sprintf("the agent received %v > C's %v - C's hold %v", ttlAgent, ttlC, heldC))
				}
				if ttlAgent > bound+clockTol(heldA)+clockTol(heldC) {
					bad = append(bad, fmt.Sprintf("the agent's %v > the client's remaining %v - the hubs' holds %v = %v",
						ttlAgent, c.remaining.Round(time.Microsecond), heldA+heldC, bound.Round(time.Microsecond)))
				}
				if len(bad) > 0 {
					n.violations = append(n.violations, "trace "+id+": "+strings.Join(bad, "; "))
				}
			}
			if traced && c.code == envelope.CodeOK {
				n.chains++
			}
		}
		return n
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		r = check()
		if r.chains >= r.ok || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(r.violations) > 10 {
		r.violations = append(r.violations[:10], fmt.Sprintf("and %d more", len(r.violations)-10))
	}
	return r
}

// clockTol is the slack allowed on a bound that subtracts a hold measured
// on spans (see checkTTLs): 20 µs and 1000 ppm of the hold.
func clockTol(held time.Duration) time.Duration { return 20*time.Microsecond + held/1000 }
