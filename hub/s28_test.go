//go:build scenario

package hub_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/s26"
	"github.com/agentmesh/agentmesh/internal/scenario"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/telemetry"
)

// s28Load calls echo.echo through c at rate calls/s (workers tickers)
// until ctx ends and counts the outcomes; lat gets the latency of each
// successful call when non-nil.
type s28Load struct {
	ok, limited, hinted, other atomic.Int64
	mu                         sync.Mutex
	lat                        []time.Duration
	msgs                       map[string]int
	errs                       []string // the first few of other
}

func (l *s28Load) run(ctx context.Context, wg *sync.WaitGroup, c *mesh.Client, rate float64, workers int, keepLat bool) {
	every := time.Duration(float64(workers) * float64(time.Second) / rate)
	for range workers {
		wg.Go(func() {
			tk := time.NewTicker(every)
			defer tk.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tk.C:
				}
				start := time.Now()
				err := c.Call(context.Background(), "echo.echo", nil, nil)
				d := time.Since(start)
				switch envelope.CodeOf(err) {
				case envelope.CodeOK:
					l.ok.Add(1)
					if keepLat {
						l.mu.Lock()
						l.lat = append(l.lat, d)
						l.mu.Unlock()
					}
				case envelope.CodeOverloaded:
					l.limited.Add(1)
					e := envelope.AsError(err)
					if e.RetryAfter() > 0 && e.NotSent() {
						l.hinted.Add(1)
					}
					l.mu.Lock()
					if l.msgs == nil {
						l.msgs = map[string]int{}
					}
					l.msgs[strings.SplitN(e.Message, ";", 2)[0]]++
					l.mu.Unlock()
				default:
					l.other.Add(1)
					l.mu.Lock()
					if len(l.errs) < 5 {
						l.errs = append(l.errs, err.Error())
					}
					l.mu.Unlock()
				}
			}
		})
	}
}

// ---- S28 (a): the flood process ----
//
// The flooding identity's clients run in this test binary re-executed
// under SCHED_IDLE (s26.RunAttackers explains why): they stand for
// clients on other machines, so that their own CPU — 1,000 calls/s
// and their refusals, through the client's encoder and decoder — is
// neither charged to the hub nor run on the Go scheduler and collector
// that the other identities' calls and the hub share. The hub's own work
// for the flood (admission, the limiter, the refusals) stays in this
// process, where the scenario measures it. The flood runs in 1 s windows
// between quiet ones, and the others' healthy figure is taken from the
// quiet windows: this 2-core machine is shared, its load from other
// processes drifts over seconds, and interleaved both figures see the
// same drift (as in S26).

// s28FloodEnv carries the s28FloodPlan (JSON) to the flood process.
const s28FloodEnv = "AGENTMESH_S28_FLOOD"

// s28FloodPlan is what the flood process is told: the hub, the flooding
// identity's tokens (one connection each), the rate and workers per
// connection, and the windows.
type s28FloodPlan struct {
	WS      string
	Tokens  []string
	Rate    float64
	Workers int
	s26.Schedule
}

// s28FloodReport is what the flood process saw.
type s28FloodReport struct {
	OK, Limited, Hinted, Other int64
	Msgs                       map[string]int
	Errs                       []string
}

func init() { helperMains = append(helperMains, s28FloodMain) }

// runS28Flood runs the flood process for p and returns its report.
func runS28Flood(ctx context.Context, p s28FloodPlan) (*s28FloodReport, error) {
	var rep s28FloodReport
	if err := s26.RunSelf(ctx, s28FloodEnv, p, p.End(), &rep, "-test.run=^$"); err != nil {
		return nil, err
	}
	return &rep, nil
}

// s28FloodMain, in the flood process, dials the hub once per token,
// floods in the loaded windows, reports and exits; in any other process
// it returns at once.
func s28FloodMain() {
	cfg := os.Getenv(s28FloodEnv)
	if cfg == "" {
		return
	}
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "s28 flood:", err)
		os.Exit(2)
	}
	var p s28FloodPlan
	if err := json.Unmarshal([]byte(cfg), &p); err != nil {
		fail(err)
	}
	var clients []*mesh.Client
	for _, tok := range p.Tokens {
		c, err := mesh.NewClient([]string{p.WS}, mesh.WithToken(tok), mesh.WithoutReliability())
		if err != nil {
			fail(err)
		}
		clients = append(clients, c)
	}
	var fl s28Load
	_ = p.RunWindows(context.Background(), func(ctx context.Context, _ int, _ bool) {
		var wg sync.WaitGroup
		for _, c := range clients {
			fl.run(ctx, &wg, c, p.Rate, p.Workers, false)
		}
		wg.Wait()
	})
	rep := s28FloodReport{OK: fl.ok.Load(), Limited: fl.limited.Load(), Hinted: fl.hinted.Load(), Other: fl.other.Load(), Msgs: fl.msgs, Errs: fl.errs}
	if err := json.NewEncoder(os.Stdout).Encode(&rep); err != nil {
		fail(err)
	}
	for _, c := range clients {
		c.Close()
	}
	os.Exit(0)
}

// TestS28RateLimitsAndReplay is scenario S28 at its written sizes:
//
//	(a) per-identity bucket 100/s, burst 200, global 2000/s: one identity
//	    floods at 1000/s over two connections with two tokens of its own
//	    (the bucket is the identity's, not a token's), from another
//	    process, in 4 windows of 1 s between quiet ones, while 5 other
//	    identities call at 50/s each throughout. The flood's accepted rate
//	    past its burst is within ±10 % of 100/s, its excess OVERLOADED
//	    with a retry-after hint and not sent; the others have 0 errors and
//	    p99 under the flood <= 1.5 × their p99 in the quiet windows (+ 2 ms
//	    on this shared 2-core machine, see s26Floor);
//	(global) a global limit of 200/s, burst 50, holds over 3 identities
//	    at 150/s each, none over its own limit: 200/s ±10 % get through;
//	(b) a captured token replayed after its expiry, on a new connection
//	    and over HTTP: UNAUTHENTICATED;
//	(c) a non-idempotent call replayed with its idempotency key 1, 10 and
//	    500 s later (the window's clock advanced, window 10 min): the first
//	    result each time, the agent runs it once; past the window it runs
//	    again;
//	(d) the same key with another body: INVALID_PARAMS, not run.
func TestS28RateLimitsAndReplay(t *testing.T) {
	fig := map[string]any{"scenario": "S28"}
	defer func() {
		b, _ := json.Marshal(fig)
		scenario.Emit(b)
	}()
	echo := func(m *meshtest.Mesh) {
		var n atomic.Int64
		m.RunAgent(t, testkit.CountingAgent("echo", &n, testkit.Token(t, auth.Claims{Subject: "echo", Serve: []string{"echo.*"}}, time.Hour), "echo.*"))
	}

	t.Run("a per-identity", func(t *testing.T) {
		m := meshtest.Start(t, hub.Config{HeartbeatInterval: time.Second, GlobalRate: 2000,
			Security: &hub.Security{Key: testkit.TestKey, RatePerToken: 100, BurstPerToken: 200}},
			hub.WithTelemetry(telemetry.New(nil, telemetry.NewMetrics(nil))))
		// An echo (s26.LegitLoad checks that its calls come back).
		a := agents.New("echo", agents.WithToken(testkit.Token(t, auth.Claims{Subject: "echo", Serve: []string{"echo.*"}}, time.Hour)))
		a.Handle("echo.echo", func(_ context.Context, p json.RawMessage) (any, error) { return p, nil })
		m.RunAgent(t, a)
		var others []*mesh.Client
		for _, s := range []string{"o1", "o2", "o3", "o4", "o5"} {
			others = append(others, testkit.MustClient(t, m.WS, mesh.WithToken(testkit.Token(t, auth.Claims{Subject: s}, time.Hour)), mesh.WithoutReliability()))
		}
		// The flood comes from another process in 1 s windows between
		// quiet ones; the others call throughout, and their healthy
		// figure is taken from the quiet windows (see s28Flood).
		plan := s28FloodPlan{WS: m.WS, Rate: 500, Workers: 8,
			Tokens: []string{
				testkit.Token(t, auth.Claims{Subject: "flood"}, time.Hour),
				testkit.Token(t, auth.Claims{Subject: "flood"}, time.Hour),
			},
			Schedule: s26.Schedule{Start: time.Now().Add(time.Second), Window: time.Second, Loaded: 4}}
		lctx, lcancel := context.WithDeadline(t.Context(), plan.End())
		defer lcancel()
		var loads []func() ([]s26.Sample, int64, []string)
		for _, c := range others {
			loads = append(loads, s26.LegitLoad(lctx, c, 50))
		}
		fl, err := runS28Flood(t.Context(), plan)
		<-lctx.Done()
		var samples []s26.Sample
		var fails int64
		var errs []string
		for _, l := range loads {
			ss, f, e := l()
			samples, fails, errs = append(samples, ss...), fails+f, append(errs, e...)
		}
		if err != nil {
			t.Fatalf("flood process: %v", err)
		}
		healthy, under, _ := plan.Split(samples)
		// The bucket is full (200) when the first loaded window opens; it
		// refills at 100/s from then on, quiet windows included (1 s adds
		// 100, under the burst, so nothing is lost to the cap), and the
		// flood empties it in every loaded window.
		first, _, _ := plan.LoadedWindow(0)
		_, last, _ := plan.LoadedWindow(plan.Loaded - 1)
		span := last.Sub(first)
		rate := float64(fl.OK-200) / span.Seconds()
		hp99, up99 := testkit.Pctl(healthy, 99), testkit.Pctl(under, 99)
		fig["a"] = map[string]any{"floodSent": fl.OK + fl.Limited + fl.Other, "floodOK": fl.OK, "floodAcceptedPerSec": rate, "floodOverloaded": fl.Limited,
			"floodHinted": fl.Hinted, "floodOther": fl.Other, "refusals": fl.Msgs,
			"othersHealthy": len(healthy), "othersUnderFlood": len(under), "othersFailed": fails,
			"othersHealthyP99Ms": ms(hp99), "othersUnderFloodP99Ms": ms(up99), "p99Ratio": float64(up99) / float64(max(hp99, 1))}
		t.Logf("flood (one identity, two tokens, 2 × 500/s, %d × %v windows): %d sent, %d ok, %.0f/s past the burst, %d OVERLOADED (%d with retry-after, not sent) %v, %d other; "+
			"5 others: %d calls in quiet windows, %d under the flood, %d failed %v; p99 %v under the flood vs %v healthy",
			plan.Loaded, plan.Window, fl.OK+fl.Limited+fl.Other, fl.OK, rate, fl.Limited, fl.Hinted, fl.Msgs, fl.Other,
			len(healthy), len(under), fails, errs, up99, hp99)
		if rate < 90 || rate > 110 {
			t.Errorf("the flooding identity got %.0f calls/s through with two tokens; want 100/s ±10 %% (one bucket per identity)", rate)
		}
		if fl.Limited == 0 || fl.Hinted != fl.Limited || fl.Other != 0 || fl.Msgs["rate limit of this identity exceeded"] != int(fl.Limited) {
			t.Errorf("the flood's excess: %d OVERLOADED %v, %d of them with a retry-after hint and not sent, %d other %v; want all OVERLOADED by the identity's limit, hinted, not sent",
				fl.Limited, fl.Msgs, fl.Hinted, fl.Other, fl.Errs)
		}
		// The flood is open loop at 1000/s: far short of it, the test did
		// not apply the load (a starved ticker drops ticks).
		if sent := fl.OK + fl.Limited + fl.Other; sent < int64(plan.Loaded)*1000*3/4 {
			t.Errorf("the flood sent %d calls in %d windows of 1 s; want ≥ 750 per window (nominal 1000/s)", sent, plan.Loaded)
		}
		if fails != 0 {
			t.Errorf("the other identities lost %d calls: %v; want 0", fails, errs)
		}
		// 5 × 50/s: 250 calls per window; ticks a busy machine drops
		// leave fewer, but far fewer means no figure.
		if want := plan.Loaded * 250 * 3 / 4; len(healthy) < want || len(under) < want {
			t.Errorf("the others' calls counted: %d in quiet windows, %d under the flood; want ≥ %d each", len(healthy), len(under), want)
		}
		if up99 > hp99*3/2+s26Floor {
			t.Errorf("the others' p99 %v under the flood vs %v healthy; want <= 1.5 × + %v", up99, hp99, s26Floor)
		}
	})

	t.Run("global", func(t *testing.T) {
		m := meshtest.Start(t, hub.Config{HeartbeatInterval: time.Second, GlobalRate: 200, GlobalBurst: 50,
			Security: &hub.Security{Key: testkit.TestKey, RatePerToken: 1000, BurstPerToken: 1000}})
		echo(m)
		var l s28Load
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		start := time.Now()
		for _, s := range []string{"g1", "g2", "g3"} {
			l.run(ctx, &wg, testkit.MustClient(t, m.WS, mesh.WithToken(testkit.Token(t, auth.Claims{Subject: s}, time.Hour)), mesh.WithoutReliability()), 150, 4, false)
		}
		wg.Wait()
		rate := float64(l.ok.Load()-50) / time.Since(start).Seconds()
		fig["global"] = map[string]any{"ok": l.ok.Load(), "acceptedPerSec": rate, "overloaded": l.limited.Load(), "hinted": l.hinted.Load(), "other": l.other.Load(), "refusals": l.msgs}
		t.Logf("global limit 200/s over 3 identities at 150/s: %d ok, %.0f/s, %d OVERLOADED (%d hinted) %v, %d other",
			l.ok.Load(), rate, l.limited.Load(), l.hinted.Load(), l.msgs, l.other.Load())
		if rate < 180 || rate > 220 {
			t.Errorf("%.0f calls/s through a global limit of 200/s; want ±10 %%", rate)
		}
		if l.limited.Load() == 0 || l.hinted.Load() != l.limited.Load() || l.other.Load() != 0 || l.msgs["the hub's rate limit is exceeded"] != int(l.limited.Load()) {
			t.Errorf("refusals %v (%d hinted), %d other; want every excess call refused by the global limit, hinted, not sent", l.msgs, l.hinted.Load(), l.other.Load())
		}
	})

	t.Run("b expired token replayed", func(t *testing.T) {
		m := testkit.SecuredHub(t, hub.Security{})
		echo(m)
		tok := testkit.Token(t, auth.Claims{Subject: "short"}, time.Second)
		c := testkit.MustClient(t, m.WS, mesh.WithToken(tok), mesh.WithoutReliability())
		if err := c.Call(t.Context(), "echo.echo", 1, nil); err != nil {
			t.Fatalf("with the fresh token: %v", err)
		}
		// Past its expiry (whole seconds) and the verifier's clock leeway.
		time.Sleep(time.Second + auth.DefaultLeeway + time.Second)
		replay, err := mesh.NewClient([]string{m.WS}, mesh.WithToken(tok), mesh.WithoutReliability())
		if err != nil {
			t.Fatal(err)
		}
		defer replay.Close()
		errWS := replay.Call(t.Context(), "echo.echo", map[string]int{"i": 1}, nil)
		testkit.WantCode(t, "expired token on a new connection", errWS, envelope.CodeUnauthenticated)
		h, err := mesh.NewClient([]string{m.HTTP + "/rpc"}, mesh.WithToken(tok), mesh.WithoutReliability())
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		errHTTP := h.Call(t.Context(), "echo.echo", map[string]int{"i": 1}, nil)
		testkit.WantCode(t, "expired token over HTTP", errHTTP, envelope.CodeUnauthenticated)
		fig["b"] = map[string]any{"newConnection": envelope.CodeOf(errWS).String(), "http": envelope.CodeOf(errHTTP).String()}
	})

	t.Run("c d idempotency replays", func(t *testing.T) {
		var mu sync.Mutex
		now := time.Now()
		clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
		advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
		m := meshtest.Start(t, hub.Config{Security: &hub.Security{Key: testkit.TestKey}, IdempotencyWindow: 10 * time.Minute},
			hub.WithIdempotencyClock(clock))
		var runs atomic.Int64
		a := agents.New("ledger", agents.WithToken(testkit.Token(t, auth.Claims{Subject: "ledger", Serve: []string{"ledger.*"}}, time.Hour)))
		a.Handle("ledger.append", func(ctx context.Context, p json.RawMessage) (any, error) {
			return map[string]int64{"entry": runs.Add(1)}, nil
		})
		m.RunAgent(t, a)
		c := testkit.MustClient(t, m.WS, mesh.WithToken(testkit.Token(t, auth.Claims{Subject: "alice"}, time.Hour)), mesh.WithoutReliability())
		key := mesh.WithHeaders(func(h *envelope.Headers) { h.IdempotencyKey = "pay-7" })
		var first struct{ Entry int64 }
		if err := c.Call(t.Context(), "ledger.append", map[string]int{"amount": 5}, &first, key); err != nil {
			t.Fatal(err)
		}
		replays := map[string]int64{}
		at := time.Duration(0)
		for _, later := range []time.Duration{time.Second, 10 * time.Second, 500 * time.Second} {
			advance(later - at)
			at = later
			var got struct{ Entry int64 }
			if err := c.Call(t.Context(), "ledger.append", map[string]int{"amount": 5}, &got, key); err != nil || got != first {
				t.Errorf("replay %v later: %+v, %v; want the first result %+v", later, got, err, first)
			}
			replays[later.String()] = got.Entry
		}
		if runs.Load() != 1 {
			t.Errorf("the agent ran the call %d times over the replays; want 1", runs.Load())
		}
		err := c.Call(t.Context(), "ledger.append", map[string]int{"amount": 500}, nil, key)
		testkit.WantCode(t, "(d) same key, another body", err, envelope.CodeInvalidParams)
		if runs.Load() != 1 {
			t.Errorf("the agent ran %d times after the reuse with another body; want 1", runs.Load())
		}
		advance(101 * time.Second) // 601 s: past the 10 min window
		var after struct{ Entry int64 }
		if err := c.Call(t.Context(), "ledger.append", map[string]int{"amount": 5}, &after, key); err != nil || after.Entry != 2 {
			t.Errorf("past the window: %+v, %v; want a new execution (entry 2)", after, err)
		}
		fig["c"] = map[string]any{"first": first.Entry, "replays": replays, "executions": runs.Load(), "d": envelope.CodeOf(err).String()}
	})
}
