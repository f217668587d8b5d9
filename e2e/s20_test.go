package e2e_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/freeport"
	"github.com/agentmesh/agentmesh/internal/scenario"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
	"github.com/agentmesh/agentmesh/reliability"
)

// freeAddrs returns n loopback addresses nothing listens on, from below the
// ephemeral range (see freeport), so that a hub can be restarted on the same
// address and no dialler's source port takes one in between.
func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	return freeport.Addrs(t, n)
}

// scrape reads one Prometheus text series from url: the sample whose
// name and labels start with series (e.g. `agentmesh_pending_requests{side="hub"}`
// or `go_goroutines`). ok is false when it is absent or unreachable.
func scrape(url, series string) (v float64, ok bool) {
	res, err := (&http.Client{Timeout: 2 * time.Second}).Get(url)
	if err != nil {
		return 0, false
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(io.LimitReader(res.Body, 8<<20))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, series) {
			continue
		}
		rest := line[len(series):]
		if rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue // a longer name
		}
		if i := strings.LastIndexByte(rest, '}'); i >= 0 {
			rest = rest[i+1:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(f[0], 64); err == nil {
			return v, true
		}
	}
	return 0, false
}

// agentHubs asks the hub at base (http://addr) which hub each agent is
// attached to.
func agentHubs(ctx context.Context, base string) (map[string]string, error) {
	c, err := mesh.NewClient([]string{base}, mesh.WithoutReliability(), mesh.WithTimeout(time.Second))
	if err != nil {
		return nil, err
	}
	defer c.Close()
	var list []control.AgentInfo
	if err := c.Call(ctx, "mesh.agents", nil, &list); err != nil {
		return nil, err
	}
	out := make(map[string]string, len(list))
	for _, a := range list {
		out[a.AgentID] = a.Hub
	}
	return out, nil
}

// TestS20DrainAndRollingRestart is scenario S20: three hubs on etcd, 18
// agent instances (9 echo, idempotent; 9 chaos with 20–50 ms latency, not
// idempotent) in six processes, three clients given every hub URL, under
// an open-loop load. Phase 1: SIGTERM to hub B. B must refuse new calls
// at once, send goaway so that its agents re-register elsewhere and the
// clients move, and let the calls it admitted finish: idempotent and
// non-idempotent errors = 0, lost = 0, duplicates = 0. Phase 2: restart
// A, B and C one at a time: success >= 99.9 %, agents re-homed within 5 s
// of each SIGTERM, lost = 0. Leak check (leak_test.go) 2× the 5 s timeout
// after phase 2: nothing pending on the hubs, the 6 agent processes or the
// clients, goroutines <= baseline + 20 on the agents and the test process
// (the hubs, all restarted, are checked for pending only).
func TestS20DrainAndRollingRestart(t *testing.T) {
	rate, drainLoad, drainAt, apart := 500.0, 40*time.Second, 20*time.Second, 15*time.Second
	if testing.Short() {
		rate, drainLoad, drainAt, apart = 200, 7*time.Second, 2*time.Second, 5*time.Second
	}
	if !testing.Short() {
		procLimit = 4 * time.Minute // 40 s + a rolling restart of 47 s, plus setup
		t.Cleanup(func() { procLimit = 2 * time.Minute })
	}
	srv := etcdtest.Start(t)
	cfgFile := filepath.Join(t.TempDir(), "mesh.yaml")
	if err := os.WriteFile(cfgFile, []byte(`policies:
  "echo.*": { timeout: 5s, retries: 3, idempotent: true, backoff: { strategy: exponential, initial: 20ms, max: 300ms, jitter: true } }
  "chaos.*": { timeout: 5s, retries: 3, idempotent: false, backoff: { strategy: exponential, initial: 20ms, max: 300ms, jitter: true } }
`), 0o600); err != nil {
		t.Fatal(err)
	}
	names := []string{"A", "B", "C"}
	addrs := map[string]string{}
	for i, a := range freeAddrs(t, 3) {
		addrs[names[i]] = a
	}
	ws := func(n string) string { return "ws://" + addrs[n] + "/ws" }
	var hubsMu sync.Mutex
	hubs := map[string]*proc{}
	runHub := func(n string) {
		p := start(t, "meshd", "--listen", addrs[n], "--id", "hub-"+n, "--heartbeat", "500ms", "--drain-timeout", "10s",
			"--registry", "etcd", "--etcd-endpoints", srv.Endpoint, "--etcd-prefix", "/s20/", "--config", cfgFile)
		waitFor(t, "hub "+n+" ready", 10*time.Second, func() bool {
			return httpStatus(&http.Client{Timeout: time.Second}, "http://"+addrs[n]+"/readyz") == http.StatusOK
		})
		hubsMu.Lock()
		hubs[n] = p
		hubsMu.Unlock()
	}
	for _, n := range names {
		runHub(n)
	}
	order := map[string][]string{"A": {"A", "B", "C"}, "B": {"B", "C", "A"}, "C": {"C", "A", "B"}}
	urls := func(n string) []string {
		o := order[n]
		return []string{ws(o[0]), ws(o[1]), ws(o[2])}
	}
	var chaosIDs []string
	agentProcs := map[string]*proc{}
	for _, n := range names {
		hl := strings.Join(urls(n), ",")
		agentProcs["echo-"+n] = start(t, "meshctl", "agent", "run", "echo", "--instances", "3", "--id", "echo-"+n, "--hub", hl,
			"--metrics-addr", "127.0.0.1:0")
		agentProcs["chaos-"+n] = start(t, "meshctl", "agent", "run", "chaos", "--instances", "3", "--id", "chaos-"+n, "--hub", hl,
			"--latency", "20ms", "--jitter", "30ms", "--metrics-addr", "127.0.0.1:0")
		for k := range 3 {
			chaosIDs = append(chaosIDs, fmt.Sprintf("chaos-%s-%d", n, k))
		}
	}
	rc := reliability.DefaultConfig()
	bo := reliability.BackoffConfig{Strategy: reliability.Exponential, Initial: 20 * time.Millisecond, Max: 300 * time.Millisecond, Jitter: true}
	rc.Policies["echo.*"] = reliability.Policy{Timeout: 5 * time.Second, Retries: 3, Idempotent: true, Backoff: bo}
	rc.Policies["chaos.*"] = reliability.Policy{Timeout: 5 * time.Second, Retries: 3, Idempotent: false, Backoff: bo}
	var clients []*mesh.Client
	for _, n := range names {
		c, err := mesh.NewClient(urls(n), mesh.WithReliability(rc), mesh.WithWaitForReady())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	waitFor(t, "18 agents registered", 20*time.Second, func() bool {
		m, err := agentHubs(t.Context(), "http://"+addrs["A"])
		return err == nil && len(m) == 18
	})

	// Warm up (echo.echo only: chaos.executions feeds the ledgers), then
	// take the leak check's baselines: the 6 agent processes. Every hub is
	// restarted during the load (B in phase 1, all three in phase 2): only
	// their pending is checked at the end.
	for range 20 {
		for _, c := range clients {
			_ = c.Call(t.Context(), "echo.echo", 1, nil)
		}
	}
	var leakProcs []leakProc
	for id, ap := range agentProcs {
		leakProcs = append(leakProcs, leakAgent(t, id, ap))
	}
	leaks := leakBaseline(t, leakProcs...)

	// rehomed polls another hub until all 18 agents are registered and
	// none on hub n; it returns how long after since that took (0: not
	// within limit).
	rehomed := func(n string, since time.Time, limit time.Duration) time.Duration {
		other := "A"
		if n == "A" {
			other = "B"
		}
		for time.Since(since) < limit {
			m, err := agentHubs(context.Background(), "http://"+addrs[other])
			if err == nil && len(m) == 18 {
				on := 0
				for _, h := range m {
					if h == "hub-"+n {
						on++
					}
				}
				if on == 0 {
					return time.Since(since)
				}
			}
			time.Sleep(25 * time.Millisecond)
		}
		return 0
	}
	// drain sends SIGTERM to hub n and reports, while the load runs, how
	// soon its agents were elsewhere, whether it refused a new call at
	// once, and when it exited.
	type drainReport struct {
		rehome, exit, refused time.Duration
		refusedCode           envelope.Code
		refusedMsg            string
	}
	drain := func(n string) drainReport {
		hubsMu.Lock()
		p := hubs[n]
		hubsMu.Unlock()
		var r drainReport
		sent := time.Now()
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Error(err)
			return r
		}
		var wg sync.WaitGroup
		wg.Go(func() { r.rehome = rehomed(n, sent, 10*time.Second) })
		wg.Go(func() {
			// A new call straight to the draining hub over HTTP: refused.
			hc, _ := mesh.NewClient([]string{"http://" + addrs[n]}, mesh.WithoutReliability(), mesh.WithTimeout(2*time.Second))
			defer hc.Close()
			for time.Since(sent) < 2*time.Second {
				err := hc.Call(context.Background(), "echo.echo", []int{1}, nil)
				if err != nil {
					r.refused, r.refusedCode, r.refusedMsg = time.Since(sent), envelope.CodeOf(err), envelope.AsError(err).Message
					return
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
		wg.Go(func() {
			select {
			case <-p.done:
				r.exit = p.exited.Sub(sent)
			case <-time.After(15 * time.Second):
			}
		})
		wg.Wait()
		return r
	}

	// why keeps a few failure messages per code for the report.
	var whyMu sync.Mutex
	why := map[string]int{}
	call := func(ctx context.Context, led *scenario.Ledger, i int, intended time.Time) {
		c := clients[i%len(clients)]
		inv := func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
			res, err := c.Invoke(ctx, req)
			if err != nil {
				whyMu.Lock()
				why[fmt.Sprintf("client %d: %v", i%len(clients), err)]++
				whyMu.Unlock()
			}
			return res, err
		}
		if i%2 == 0 {
			led.Call(ctx, inv, "echo.echo", true, i, intended)
		} else {
			led.Call(ctx, inv, "chaos.echo", false, i, intended)
		}
	}
	executions := func(led *scenario.Ledger) {
		for _, id := range chaosIDs {
			var got struct {
				Executions map[string]int `json:"executions"`
			}
			if err := clients[0].Call(t.Context(), "chaos.executions", nil, &got, mesh.To(id)); err != nil {
				t.Errorf("chaos.executions on %s: %v", id, err)
				continue
			}
			for rid, n := range got.Executions {
				led.Executed(rid, n)
			}
		}
	}
	failures := func(led *scenario.Ledger) (idem, nonIdem int) {
		for _, o := range led.Outcomes() {
			if o.Code != envelope.CodeOK {
				if o.Idempotent {
					idem++
				} else {
					nonIdem++
				}
			}
		}
		return
	}

	// Phase 1: a single drain of B under load.
	led1 := scenario.NewLedger()
	var dr drainReport
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		time.Sleep(drainAt)
		dr = drain("B")
	}()
	sent1 := scenario.Drive(context.Background(), rate, drainLoad, 2000, func(ctx context.Context, i int, intended time.Time) {
		call(ctx, led1, i, intended)
	})
	<-drained
	runHub("B")
	executions(led1)
	s1 := led1.Summarize("S20-drain", sent1)
	s1.Print(os.Stdout)
	idem1, non1 := failures(led1)
	t.Logf("S20 drain of B: %d calls, %d ok, failed %v (idempotent %d, non-idempotent %d), duplicates %d, p99 %.1f ms; "+
		"B refused a new call %v after SIGTERM (%s), its agents were on other hubs after %v, B exited after %v",
		sent1, s1.Succeeded, s1.Failed, idem1, non1, s1.Duplicates, s1.P99Ms,
		dr.refused.Round(time.Millisecond), dr.refusedCode, dr.rehome.Round(time.Millisecond), dr.exit.Round(time.Millisecond))
	if s1.Lost != 0 || s1.Misdelivered != 0 || s1.Duplicates != 0 {
		t.Errorf("drain: lost %d, misdelivered %d, duplicates %d; want 0", s1.Lost, s1.Misdelivered, s1.Duplicates)
	}
	if idem1 != 0 || non1 != 0 {
		t.Errorf("drain: %d idempotent and %d non-idempotent errors; want 0 and 0", idem1, non1)
	}
	if dr.refused == 0 || dr.refused > 500*time.Millisecond || dr.refusedCode != envelope.CodeUnavailable || !strings.Contains(dr.refusedMsg, "draining") {
		t.Errorf("draining B refused a new call after %v with %s %q; want UNAVAILABLE \"hub is draining\" at once (<= 500 ms)", dr.refused, dr.refusedCode, dr.refusedMsg)
	}
	if dr.rehome == 0 || dr.rehome > 5*time.Second {
		t.Errorf("B's agents re-homed after %v; want within 5 s", dr.rehome)
	}
	if dr.exit == 0 {
		t.Error("B did not exit within 15 s of SIGTERM")
	}
	hubsMu.Lock()
	if p := hubs["B"]; p.exitedYet() {
		t.Errorf("restarted hub B exited: %v", p.err)
	}
	hubsMu.Unlock()

	// Phase 2: a rolling restart of A, B, C, `apart` apart.
	led2 := scenario.NewLedger()
	rehomes := map[string]time.Duration{}
	rolled := make(chan struct{})
	go func() {
		defer close(rolled)
		for i, n := range names {
			time.Sleep(time.Second)
			if i > 0 {
				time.Sleep(apart - time.Second)
			}
			r := drain(n)
			rehomes[n] = r.rehome
			runHub(n)
		}
	}()
	sent2 := scenario.Drive(context.Background(), rate, time.Duration(len(names))*apart+2*time.Second, 2000, func(ctx context.Context, i int, intended time.Time) {
		call(ctx, led2, i, intended)
	})
	<-rolled
	executions(led2)
	s2 := led2.Summarize("S20-rolling", sent2)
	s2.Print(os.Stdout)
	idem2, non2 := failures(led2)
	t.Logf("S20 rolling restart: %d calls, %d ok (%.3f%%), failed %v (idempotent %d, non-idempotent %d), duplicates %d, p99 %.1f ms, max %.1f ms; agents re-homed after A %v, B %v, C %v",
		sent2, s2.Succeeded, 100*float64(s2.Succeeded)/float64(sent2), s2.Failed, idem2, non2, s2.Duplicates, s2.P99Ms, s2.MaxMs,
		rehomes["A"].Round(time.Millisecond), rehomes["B"].Round(time.Millisecond), rehomes["C"].Round(time.Millisecond))
	if s2.Lost != 0 || s2.Misdelivered != 0 || s2.Duplicates != 0 {
		t.Errorf("rolling restart: lost %d, misdelivered %d, duplicates %d; want 0", s2.Lost, s2.Misdelivered, s2.Duplicates)
	}
	whyMu.Lock()
	for m, n := range why {
		t.Logf("failure x%d: %s", n, m)
	}
	whyMu.Unlock()
	if r := float64(s2.Succeeded) / float64(sent2); r < 0.999 {
		t.Errorf("rolling restart success %.3f%%; want >= 99.9%%", 100*r)
	}
	for _, n := range names {
		if d := rehomes[n]; d == 0 || d > 5*time.Second {
			t.Errorf("restart of %s: agents re-homed after %v; want within 5 s", n, d)
		}
	}
	hubsMu.Lock()
	for _, n := range names {
		leaks.pendingOnly(leakHub(t, "hub-"+n, hubs[n]), "restarted during the load")
	}
	hubsMu.Unlock()
	leakFig := leaks.check(t, 10*time.Second, clients...) // 2× the 5 s timeout, after phase 2's load
	scenario.Emit(map[string]any{"scenario": "S20-leak", "leak": leakFig})
}
