//go:build scenario

package hub_test

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/telemetry"
)

// fdWatch samples the process's open descriptors every 10 ms and keeps
// the highest count attributable to the hub: the total, minus the
// descriptors open before the hub started (the test binary's own), minus
// the attack sockets the test holds at that moment (held, counted after a
// dial returns and before its close: while a dial or close is under way
// the test under-counts itself, which only makes the hub's figure higher).
type fdWatch struct {
	base int
	held *atomic.Int64
	peak atomic.Int64
	stop func()
}

func watchFDs(t *testing.T, base int, held *atomic.Int64) *fdWatch {
	w := &fdWatch{base: base, held: held}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		tk := time.NewTicker(10 * time.Millisecond)
		defer tk.Stop()
		for ctx.Err() == nil {
			ents, err := os.ReadDir("/proc/self/fd")
			if err == nil {
				if n := int64(len(ents)-w.base) - held.Load(); n > w.peak.Load() {
					w.peak.Store(n)
				}
			}
			select {
			case <-ctx.Done():
			case <-tk.C:
			}
		}
	})
	w.stop = func() { cancel(); wg.Wait() }
	t.Cleanup(w.stop)
	return w
}

// TestS27SlowHeaders is S27's slowloris: connections that send one header
// byte per second are closed at ReadHeaderTimeout (5 s), while legitimate
// calls go on and the hub's descriptors stay under MaxConns + 64.
func TestS27SlowHeaders(t *testing.T) {
	n, maxConns := 2000, 2500
	if testing.Short() {
		n, maxConns = 200, 300
	}
	fd0 := openFDs(t)
	m := meshtest.Start(t, hub.Config{MaxConns: maxConns})
	m.RunAgent(t, agents.NewEcho())
	legit := m.Client(t)
	var held atomic.Int64
	fds := watchFDs(t, fd0, &held)

	hctx, hcancel := context.WithTimeout(t.Context(), 2*time.Second)
	healthy := legitLoad(hctx, legit, 100)
	<-hctx.Done()
	hcancel()
	hLat, hFails, _ := healthy()

	actx, acancel := context.WithCancel(t.Context())
	under := legitLoad(actx, legit, 100)
	var mu sync.Mutex
	var cut []time.Duration
	var neverCut, dialFail, answered int
	var wg sync.WaitGroup
	line := "POST /rpc HTTP/1.1\r\nHost: hub\r\nX-Slow: " + strings.Repeat("z", 64)
	for i := range n {
		wg.Go(func() {
			time.Sleep(time.Duration(i) * time.Second / time.Duration(n)) // spread over 1 s
			var d net.Dialer
			c, err := d.DialContext(t.Context(), "tcp", m.Addr)
			if err != nil {
				mu.Lock()
				dialFail++
				mu.Unlock()
				return
			}
			held.Add(1)
			defer func() { held.Add(-1); c.Close() }()
			start := time.Now()
			buf := make([]byte, 512)
			for k := 0; ; k++ {
				if time.Since(start) > 15*time.Second || k >= len(line) {
					mu.Lock()
					neverCut++
					mu.Unlock()
					return
				}
				if _, err := c.Write([]byte{line[k]}); err != nil {
					break
				}
				_ = c.SetReadDeadline(time.Now().Add(time.Second))
				nr, err := c.Read(buf)
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					continue // still open: the next byte
				}
				if nr > 0 {
					mu.Lock()
					answered++ // the hub answered something (e.g. 408) before closing
					mu.Unlock()
				}
				break
			}
			mu.Lock()
			cut = append(cut, time.Since(start))
			mu.Unlock()
		})
	}
	wg.Wait()
	acancel()
	aLat, aFails, aErrs := under()
	fds.stop()

	hp99, ap99 := testkit.Pctl(hLat, 99), testkit.Pctl(aLat, 99)
	testkit.PrintSummary(t, map[string]any{
		"scenario": "S27", "part": "slow headers", "connections": n, "max_conns": maxConns,
		"cut": len(cut), "never_cut": neverCut, "dial_failed": dialFail, "answered_before_close": answered,
		"cut_min_s": testkit.Pctl(cut, 0).Seconds(), "cut_p50_s": testkit.Pctl(cut, 50).Seconds(), "cut_max_s": testkit.Pctl(cut, 100).Seconds(),
		"legit_healthy_p99_ms": ms(hp99), "legit_ok": len(aLat), "legit_failed": aFails, "legit_p99_ms": ms(ap99),
		"hub_fd_peak": fds.peak.Load(), "fd_bound": maxConns + 64,
	})
	if neverCut != 0 || dialFail != 0 || len(cut) != n {
		t.Errorf("%d of %d slow connections cut, %d never cut, %d dials failed", len(cut), n, neverCut, dialFail)
	}
	// ReadHeaderTimeout is 5 s, counted from the accept; 500 ms of slack
	// for a loaded 2-core machine (the connection is cut by a timer, its
	// close then has to be scheduled and seen).
	if mx := testkit.Pctl(cut, 100); mx > 5500*time.Millisecond {
		t.Errorf("slowest half-header connection cut after %v; want ≤ 5 s (+0.5 s slack)", mx)
	}
	if hFails != 0 || aFails != 0 {
		t.Errorf("legitimate calls failed: %d healthy, %d during the slowloris (%v)", hFails, aFails, aErrs)
	}
	if ap99 > 2*hp99+5*time.Millisecond {
		t.Errorf("legitimate p99 %v during the slowloris vs %v healthy; want ≤ 2× (+5 ms slack)", ap99, hp99)
	}
	if p := fds.peak.Load(); p > int64(maxConns+64) {
		t.Errorf("hub descriptors peaked at %d; want ≤ MaxConns + 64 = %d", p, maxConns+64)
	}
}

// TestS27ConnectionFlood is S27's connection cap and flood: with MaxConns
// 300 filled by open WebSockets, connection attempts at ~2000/s are each
// refused at once (503 or close, p99 ≤ 10 ms), the refusals are counted,
// the hub's descriptors stay under MaxConns + 64, and legitimate calls over
// an already open client keep 100 % success and p99 ≤ 2× healthy.
func TestS27ConnectionFlood(t *testing.T) {
	const maxConns = 300
	flood := 10 * time.Second
	if testing.Short() {
		flood = 3 * time.Second
	}
	fd0 := openFDs(t)
	met := telemetry.NewMetrics(nil)
	m := meshtest.Start(t, hub.Config{MaxConns: maxConns}, hub.WithTelemetry(telemetry.New(nil, met)))
	m.RunAgent(t, agents.NewEcho())
	legit := m.Client(t)
	if err := legit.Call(t.Context(), "echo.echo", "warm", nil); err != nil {
		t.Fatal(err)
	}
	var held atomic.Int64
	fds := watchFDs(t, fd0, &held)

	// Fill the cap with idle plain WebSockets (hijacked: no header timeout).
	var fill []*websocket.Conn
	defer func() {
		for _, ws := range fill {
			ws.Close()
		}
	}()
	for {
		ws, res, err := websocket.DefaultDialer.DialContext(t.Context(), m.WS, nil)
		if err != nil {
			if res == nil || res.StatusCode != http.StatusServiceUnavailable {
				// The cap also shows as a close before any answer.
				t.Logf("fill stopped at %d: %v", len(fill), err)
			}
			break
		}
		held.Add(1)
		fill = append(fill, ws)
		// Read, so that gorilla answers the hub's pings: a held socket
		// that never reads is dead to the hub after two missed pings
		// (10 s), which would free the cap in the long variant.
		go func() {
			for {
				if _, _, err := ws.ReadMessage(); err != nil {
					return
				}
			}
		}()
		if len(fill) > maxConns {
			t.Fatalf("%d WebSockets open; the cap of %d does not hold", len(fill), maxConns)
		}
	}
	if len(fill) < maxConns-10 {
		t.Fatalf("only %d WebSockets before refusal; MaxConns is %d", len(fill), maxConns)
	}
	refused0 := refusedTotal(t, met, "max_conns")

	hctx, hcancel := context.WithTimeout(t.Context(), 2*time.Second)
	healthy := legitLoad(hctx, legit, 100)
	<-hctx.Done()
	hcancel()
	hLat, hFails, _ := healthy()

	actx, acancel := context.WithTimeout(t.Context(), flood)
	defer acancel()
	under := legitLoad(actx, legit, 100)
	var mu sync.Mutex
	var lat []time.Duration
	outcomes := map[string]int{}
	var wg sync.WaitGroup
	const dialers = 20 // 20 × one attempt per 10 ms = 2000/s
	for range dialers {
		wg.Go(func() {
			tk := time.NewTicker(10 * time.Millisecond)
			defer tk.Stop()
			for actx.Err() == nil {
				start := time.Now()
				var d net.Dialer
				c, err := d.DialContext(t.Context(), "tcp", m.Addr)
				outcome := "dial error"
				if err == nil {
					held.Add(1)
					_, _ = c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: hub\r\n\r\n"))
					_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
					res, rerr := http.ReadResponse(bufio.NewReader(c), nil)
					switch {
					case rerr == nil && res.StatusCode == http.StatusServiceUnavailable:
						outcome = "503"
					case rerr == nil:
						outcome = res.Status // served: the cap did not hold
					case errors.Is(rerr, os.ErrDeadlineExceeded):
						outcome = "no answer in 2 s"
					default:
						outcome = "closed"
					}
					held.Add(-1)
					c.Close()
				}
				d2 := time.Since(start)
				mu.Lock()
				outcomes[outcome]++
				if outcome == "503" || outcome == "closed" {
					lat = append(lat, d2)
				}
				mu.Unlock()
				select {
				case <-actx.Done():
				case <-tk.C:
				}
			}
		})
	}
	wg.Wait()
	aLat, aFails, aErrs := under()
	fds.stop()
	refused := refusedTotal(t, met, "max_conns") - refused0
	attempts := 0
	for _, v := range outcomes {
		attempts += v
	}
	hp99, ap99, rp99 := testkit.Pctl(hLat, 99), testkit.Pctl(aLat, 99), testkit.Pctl(lat, 99)
	testkit.PrintSummary(t, map[string]any{
		"scenario": "S27", "part": "connection flood", "max_conns": maxConns, "held_open": len(fill),
		"flood_s": flood.Seconds(), "attempts": attempts, "attempt_rate": float64(attempts) / flood.Seconds(),
		"outcomes": outcomes, "refused_metric": refused,
		"refusal_p50_ms": ms(testkit.Pctl(lat, 50)), "refusal_p99_ms": ms(rp99), "refusal_max_ms": ms(testkit.Pctl(lat, 100)),
		"legit_healthy_p99_ms": ms(hp99), "legit_ok": len(aLat), "legit_failed": aFails, "legit_p99_ms": ms(ap99),
		"hub_fd_peak": fds.peak.Load(), "fd_bound": maxConns + 64,
	})
	if outcomes["503"]+outcomes["closed"] != attempts {
		t.Errorf("attempts past the cap: %v; want each refused with 503 or a close", outcomes)
	}
	if attempts < int(flood.Seconds()*2000)/2 {
		t.Errorf("only %d attempts in %v; the test did not apply ~2000/s", attempts, flood)
	}
	if int(refused) != attempts {
		t.Errorf("agentmesh_security_refused_total{reason=max_conns} rose by %.0f; %d attempts were refused", refused, attempts)
	}
	// 10 ms is the scenario's figure, measured from the dial to the 503.
	if rp99 > 10*time.Millisecond {
		t.Errorf("refusals past the cap took p99 %v; want ≤ 10 ms", rp99)
	}
	if hFails != 0 || aFails != 0 || len(aLat) < int(flood.Seconds()*100)*3/4 {
		t.Errorf("legitimate calls: %d failed healthy, %d ok and %d failed under the flood (%v)", hFails, len(aLat), aFails, aErrs)
	}
	if ap99 > 2*hp99+5*time.Millisecond {
		t.Errorf("legitimate p99 %v under the flood vs %v healthy; want ≤ 2× (+5 ms slack for this shared 2-core machine)", ap99, hp99)
	}
	if p := fds.peak.Load(); p > maxConns+64 {
		t.Errorf("hub descriptors peaked at %d; want ≤ MaxConns + 64 = %d", p, maxConns+64)
	}
}

// TestS27UnauthenticatedUpgrades: authentication happens at the upgrade
// (no auth frame), so 500 upgrades without a credential are each refused
// at once with 401, no link is opened and each refusal is counted.
func TestS27UnauthenticatedUpgrades(t *testing.T) {
	met := telemetry.NewMetrics(nil)
	// No budget for failed authentications: this test counts each
	// refusal as UNAUTHENTICATED; TestBadTokenFlood tests the budget.
	m := meshtest.Start(t, hub.Config{Security: &hub.Security{Key: testkit.TestKey, FailedAuthRate: -1}}, hub.WithTelemetry(telemetry.New(nil, met)))
	var lat []time.Duration
	codes := map[int]int{}
	for range 500 {
		start := time.Now()
		ws, res, err := websocket.DefaultDialer.DialContext(t.Context(), m.WS, nil)
		lat = append(lat, time.Since(start))
		if err == nil {
			ws.Close()
			codes[http.StatusSwitchingProtocols]++
			continue
		}
		if res == nil {
			t.Fatalf("upgrade: %v", err)
		}
		codes[res.StatusCode]++
	}
	refused := refusedTotal(t, met, "unauthenticated")
	p99 := testkit.Pctl(lat, 99)
	testkit.PrintSummary(t, map[string]any{"scenario": "S27", "part": "unauthenticated upgrades", "upgrades": 500,
		"codes": codes, "refused_metric": refused, "p50_ms": ms(testkit.Pctl(lat, 50)), "p99_ms": ms(p99), "max_ms": ms(testkit.Pctl(lat, 100))})
	if codes[http.StatusUnauthorized] != 500 || refused != 500 {
		t.Errorf("upgrades without a credential: %v, %v counted; want 500 × 401, 500 counted", codes, refused)
	}
	// At once: well inside the 5 s auth deadline the scenario allows.
	if p99 > 100*time.Millisecond {
		t.Errorf("401 took p99 %v; want an immediate refusal", p99)
	}
}
