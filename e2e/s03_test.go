package e2e_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/scenario"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
	"github.com/agentmesh/agentmesh/reliability"
)

// s03Params are the sizes and times of one S03 variant.
type s03Params struct {
	name              string
	perHub            int // agent instances per hub: half echo, half chaos
	clientsPerHub     int
	rate              float64
	load              time.Duration
	killAt, restartAt time.Duration // since the load started
	checkJitter       bool          // enough links for the 100 ms window check to mean something
}

// agentLogEvents reads the JSON log lines of agent processes whose msg is msg
// and returns, per agent id, their times and hubs.
func agentLogEvents(msg string, logs ...string) map[string][]logEvent {
	out := map[string][]logEvent{}
	for _, l := range logs {
		sc := bufio.NewScanner(strings.NewReader(l))
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var line struct {
				Time  time.Time `json:"time"`
				Msg   string    `json:"msg"`
				Agent string    `json:"agent"`
				Hub   string    `json:"hub"`
			}
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == msg {
				out[line.Agent] = append(out[line.Agent], logEvent{line.Time, line.Hub})
			}
		}
	}
	return out
}

type logEvent struct {
	at  time.Time
	hub string
}

// pct returns the q-quantile (0..1) of ds, nearest rank; 0 for none.
func pct(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s))*q+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}

// TestS03HubKillFailover is scenario S03: three hubs on etcd, agents and
// in-process clients spread evenly over them, each given all three hub
// URLs (its own hub first); an open-loop load of idempotent echo.echo
// (80 %) and non-idempotent chaos.echo (20 %, every execution appended to
// a ledger file) runs while hub B is killed with SIGKILL and later started
// again on the same address.
//
// Full variant (S03 as written): 18 agents (6 per hub), 30 clients (10 per
// hub), 500 req/s for 60 s, kill at 20 s, restart at 40 s. Short variant
// (-short): 6 agents, 6 clients, 500 req/s for 12 s, kill at 4 s, restart
// at 8 s (during the load).
//
// Pass, each measured and printed:
//   - lost = 0, misdelivered = 0 (the ledger);
//   - every failed call failed with UNAVAILABLE (the requests in flight
//     through B are answered UNAVAILABLE or by a retry, never left to their
//     timeout);
//   - B's links are on A or C within 5 s (p99 over B's clients, seen by
//     mesh.ping's hub, and B's agents, seen in mesh.agents' hub field);
//   - A and C stop routing to B-attached agents within TTL + 1 s: neither
//     lists an agent attached to hub-B any more (hub TTL 2 s here);
//   - idempotent success >= 99.5 %; non-idempotent duplicates = 0 and
//     phantom executions = 0;
//   - balance after B returns, within 30 s: B's routing table holds every
//     agent, attached where A's says, and a call made through B alone
//     succeeds. Nothing moves links back to B (the scenario does not ask it
//     at once); how many links B holds at the end is printed, not checked;
//   - full variant: reconnect attempts are jittered: of the dial attempts
//     B's links made in the 10 s after the kill (agents' "dialing hub" log
//     lines, clients' debug log), no 100 ms window (aligned on the kill)
//     holds more than 30 %. A link lost while other hubs are listed
//     waits mesh.LostDelay (uniform 0-2 s) and dials the next hub, so the
//     16 links of the full variant spread their attempts (before that
//     change, when clients redialled at once, 81 % and 88 % of them fell
//     in the first window);
//   - leak check (leak_test.go) 2× the 3 s timeout after the load: nothing
//     pending on the hubs, the agents or the clients; goroutines <=
//     baseline + 20 on hubs A and C, the agents and the test process, heap
//     after GC <= +10 % on A and C (B, restarted, is checked for pending only).
func TestS03HubKillFailover(t *testing.T) {
	p := s03Params{name: "S03", perHub: 6, clientsPerHub: 10, rate: 500, load: 60 * time.Second,
		killAt: 20 * time.Second, restartAt: 40 * time.Second, checkJitter: true}
	if testing.Short() {
		p = s03Params{name: "S03-short", perHub: 2, clientsPerHub: 2, rate: 500, load: 12 * time.Second,
			killAt: 4 * time.Second, restartAt: 8 * time.Second}
	} else {
		procLimit = 4 * time.Minute
		t.Cleanup(func() { procLimit = 2 * time.Minute })
	}
	srv := etcdtest.Start(t)
	cfgFile := filepath.Join(t.TempDir(), "mesh.yaml")
	if err := os.WriteFile(cfgFile, []byte(`policies:
  "echo.*": { timeout: 3s, retries: 3, idempotent: true, backoff: { strategy: exponential, initial: 20ms, max: 300ms, jitter: true } }
  "chaos.*": { timeout: 3s, retries: 3, idempotent: false, backoff: { strategy: exponential, initial: 20ms, max: 300ms, jitter: true } }
`), 0o600); err != nil {
		t.Fatal(err)
	}
	names := []string{"A", "B", "C"}
	addrs := map[string]string{}
	for i, a := range freeAddrs(t, 3) {
		addrs[names[i]] = a
	}
	ws := func(n string) string { return "ws://" + addrs[n] + "/ws" }
	base := func(n string) string { return "http://" + addrs[n] }
	hubTTL := 2 * time.Second // meshd's default with --heartbeat 500ms: max(3 × 500ms, 2s)
	// launchHub starts meshd n and waits for /readyz; it does not fail the
	// test itself, so that it can run on the fault goroutine.
	launchHub := func(n string) (*proc, error) {
		h := start(t, "meshd", "--listen", addrs[n], "--id", "hub-"+n, "--heartbeat", "500ms",
			"--registry", "etcd", "--etcd-endpoints", srv.Endpoint, "--etcd-prefix", "/s03/", "--config", cfgFile,
			"--admin-addr", "127.0.0.1:0")
		hc := &http.Client{Timeout: time.Second}
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if h.exitedYet() {
				return h, fmt.Errorf("meshd %s exited: %v\n%s", n, h.err, h.stderr.String())
			}
			if httpStatus(hc, base(n)+"/readyz") == http.StatusOK {
				return h, nil
			}
		}
		return h, fmt.Errorf("meshd %s not ready within 10 s", n)
	}
	hubs := map[string]*proc{}
	for _, n := range names {
		h, err := launchHub(n)
		if err != nil {
			t.Fatal(err)
		}
		hubs[n] = h
	}
	order := map[string][]string{"A": {"A", "B", "C"}, "B": {"B", "C", "A"}, "C": {"C", "A", "B"}}
	urls := func(n string) []string {
		o := order[n]
		return []string{ws(o[0]), ws(o[1]), ws(o[2])}
	}

	// Agents: per hub, one echo process and one chaos process with
	// perHub/2 instances each, debug logs (their dial attempts).
	ledgerDir := t.TempDir()
	var agentProcs []*proc
	half := p.perHub / 2
	for _, n := range names {
		hl := strings.Join(urls(n), ",")
		agentProcs = append(agentProcs,
			start(t, "meshctl", "agent", "run", "echo", "--instances", fmt.Sprint(half), "--id", "echo-"+n,
				"--hub", hl, "--log-level", "debug", "--metrics-addr", "127.0.0.1:0"),
			start(t, "meshctl", "agent", "run", "chaos", "--instances", fmt.Sprint(half), "--id", "chaos-"+n,
				"--hub", hl, "--log-level", "debug", "--latency", "10ms", "--jitter", "20ms",
				"--ledger", filepath.Join(ledgerDir, "chaos-"+n+".log"), "--metrics-addr", "127.0.0.1:0"))
	}
	nAgents := 3 * p.perHub

	rc := reliability.DefaultConfig()
	bo := reliability.BackoffConfig{Strategy: reliability.Exponential, Initial: 20 * time.Millisecond, Max: 300 * time.Millisecond, Jitter: true}
	rc.Policies["echo.*"] = reliability.Policy{Timeout: 3 * time.Second, Retries: 3, Idempotent: true, Backoff: bo}
	rc.Policies["chaos.*"] = reliability.Policy{Timeout: 3 * time.Second, Retries: 3, Idempotent: false, Backoff: bo}
	rec := &attempts{at: map[string][]time.Time{}}
	var clients []*mesh.Client
	var clientNames []string
	for _, n := range names {
		for k := range p.clientsPerHub {
			name := fmt.Sprintf("client-%s%d", n, k)
			c, err := mesh.NewClient(urls(n), mesh.WithReliability(rc), mesh.WithWaitForReady(),
				mesh.WithClientLogger(slog.New(dialLog{link: name, rec: rec})))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			clients = append(clients, c)
			clientNames = append(clientNames, name)
		}
	}
	// ctl is the test's own view of the mesh, over HTTP to one hub.
	ctl := map[string]*mesh.Client{}
	for _, n := range names {
		c, err := mesh.NewClient([]string{base(n)}, mesh.WithoutReliability(), mesh.WithTimeout(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctl[n] = c
	}
	agentsOn := func(ctx context.Context, n string) (map[string]string, error) {
		var list []control.AgentInfo
		if err := ctl[n].Call(ctx, "mesh.agents", nil, &list); err != nil {
			return nil, err
		}
		m := make(map[string]string, len(list))
		for _, a := range list {
			m[a.AgentID] = a.Hub
		}
		return m, nil
	}
	pingHub := func(ctx context.Context, c *mesh.Client) (string, error) {
		var pong struct{ Hub string }
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		err := c.Call(ctx, "mesh.ping", nil, &pong)
		return pong.Hub, err
	}
	waitFor(t, fmt.Sprintf("%d agents registered, every hub seeing them", nAgents), 30*time.Second, func() bool {
		for _, n := range names {
			if m, err := agentsOn(t.Context(), n); err != nil || len(m) != nAgents {
				return false
			}
		}
		return true
	})
	waitFor(t, "every client on its own hub", 10*time.Second, func() bool {
		for i, c := range clients {
			if h, err := pingHub(t.Context(), c); err != nil || h != "hub-"+names[i/p.clientsPerHub] {
				return false
			}
		}
		return true
	})

	// Warm up every client (echo.echo only: chaos.echo executions would
	// count in the ledger files), then take the leak check's baselines:
	// the 3 hubs and the 6 agent processes.
	for range 10 {
		for _, c := range clients {
			_ = c.Call(t.Context(), "echo.echo", 1, nil)
		}
	}
	var leakProcs []leakProc
	for _, n := range names {
		leakProcs = append(leakProcs, leakHub(t, "hub-"+n, hubs[n]))
	}
	for i, ap := range agentProcs {
		leakProcs = append(leakProcs, leakAgent(t, fmt.Sprintf("%s-%s", []string{"echo", "chaos"}[i%2], names[i/2]), ap))
	}
	leaks := leakBaseline(t, leakProcs...)

	// The fault and what it sees. The fault goroutine writes fr; the test
	// reads it after <-faultDone.
	type faultReport struct {
		err                     error
		killedAt, restartedAt   time.Time
		bAgents, bClients       []string                 // attached to B just before the kill
		clientMoved, agentMoved map[string]time.Duration // kill → on A or C
		agentMovedHub           map[string]string
		routingStopped          time.Duration // kill → neither A nor C lists an agent on hub-B
		balanced                time.Duration // B ready → B's table = A's, all agents, a call through B ok
		balanceNote             string
		endOnB                  [2]int // agents and clients attached to B at the end
	}
	fr := faultReport{clientMoved: map[string]time.Duration{}, agentMoved: map[string]time.Duration{}, agentMovedHub: map[string]string{}}
	faultDone := make(chan struct{})
	loadStart := time.Now()
	go func() {
		defer close(faultDone)
		ctx := context.Background()
		time.Sleep(time.Until(loadStart.Add(p.killAt)))
		m, err := agentsOn(ctx, "A")
		if err != nil {
			fr.err = fmt.Errorf("mesh.agents before the kill: %w", err)
			return
		}
		for id, h := range m {
			if h == "hub-B" {
				fr.bAgents = append(fr.bAgents, id)
			}
		}
		var bClients []int
		for i, c := range clients {
			if h, err := pingHub(ctx, c); err == nil && h == "hub-B" {
				bClients = append(bClients, i)
				fr.bClients = append(fr.bClients, clientNames[i])
			}
		}
		fr.killedAt = time.Now()
		_ = hubs["B"].cmd.Process.Kill()
		<-hubs["B"].done

		var wg sync.WaitGroup
		var mu sync.Mutex
		for _, i := range bClients {
			wg.Go(func() {
				for time.Since(fr.killedAt) < 15*time.Second {
					if h, err := pingHub(ctx, clients[i]); err == nil && h != "hub-B" {
						mu.Lock()
						fr.clientMoved[clientNames[i]] = time.Since(fr.killedAt)
						mu.Unlock()
						return
					}
					time.Sleep(20 * time.Millisecond)
				}
			})
		}
		wg.Go(func() {
			for time.Since(fr.killedAt) < 15*time.Second {
				onB := 0
				for _, n := range []string{"A", "C"} {
					m, err := agentsOn(ctx, n)
					if err != nil {
						onB = -1
						break
					}
					for id, h := range m {
						if h == "hub-B" {
							onB++
							continue
						}
						if n == "A" && slices.Contains(fr.bAgents, id) {
							mu.Lock()
							if _, ok := fr.agentMoved[id]; !ok {
								fr.agentMoved[id], fr.agentMovedHub[id] = time.Since(fr.killedAt), h
							}
							mu.Unlock()
						}
					}
				}
				if onB == 0 && fr.routingStopped == 0 {
					fr.routingStopped = time.Since(fr.killedAt)
				}
				mu.Lock()
				all := len(fr.agentMoved) == len(fr.bAgents)
				mu.Unlock()
				if all && fr.routingStopped != 0 {
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
		wg.Wait()

		time.Sleep(time.Until(loadStart.Add(p.restartAt)))
		hubs["B"], err = launchHub("B")
		if err != nil {
			fr.err = err
			return
		}
		fr.restartedAt = time.Now()
		for time.Since(fr.restartedAt) < 30*time.Second {
			mb, errB := agentsOn(ctx, "B")
			ma, errA := agentsOn(ctx, "A")
			if errA == nil && errB == nil && len(mb) == nAgents && maps.Equal(ma, mb) &&
				ctl["B"].Call(ctx, "echo.echo", []int{1}, nil) == nil {
				fr.balanced = time.Since(fr.restartedAt)
				break
			}
			fr.balanceNote = fmt.Sprintf("B lists %d agents (err %v), A %d (err %v)", len(mb), errB, len(ma), errA)
			time.Sleep(50 * time.Millisecond)
		}
	}()

	led := scenario.NewLedger()
	sent := scenario.Drive(context.Background(), p.rate, p.load, 2000, func(ctx context.Context, i int, intended time.Time) {
		c := clients[i%len(clients)]
		if i%5 == 4 { // 20 % non-idempotent
			led.Call(ctx, c.Invoke, "chaos.echo", false, i, intended)
			return
		}
		led.Call(ctx, c.Invoke, "echo.echo", true, i, intended)
	})
	<-faultDone
	if fr.err != nil {
		t.Fatal(fr.err)
	}
	if m, err := agentsOn(t.Context(), "A"); err == nil {
		for _, h := range m {
			if h == "hub-B" {
				fr.endOnB[0]++
			}
		}
	}
	for _, c := range clients {
		if h, err := pingHub(t.Context(), c); err == nil && h == "hub-B" {
			fr.endOnB[1]++
		}
	}

	// Every execution of chaos.echo, from the agents' ledger files.
	execs := 0
	for _, n := range names {
		data, err := os.ReadFile(filepath.Join(ledgerDir, "chaos-"+n+".log"))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		for _, id := range strings.Fields(string(data)) {
			led.Executed(id, 1)
			execs++
		}
	}
	s := led.Summarize(p.name, sent)
	s.Print(os.Stdout)
	// Leak check, 2× the 3 s timeout after the load. Hub B was killed and
	// started again during the load: only its pending is checked (a
	// baseline retaken then would be under load, not after a warm-up).
	leaks.pendingOnly(leakHub(t, "hub-B", hubs["B"]), "killed and restarted during the load")
	leakFig := leaks.check(t, 6*time.Second, append(slices.Clone(clients), slices.Collect(maps.Values(ctl))...)...)
	var idem, idemOK, non, nonOK int
	failedBy := map[envelope.Code]int{}
	failedNear := 0 // failures whose intended start was within -3..+5 s of the kill
	// Calls in flight when B died (sent before, answered after the kill):
	// how many, and how long after the kill the last one was answered.
	inFlight, inFlightFailed, inFlightLast := 0, 0, time.Duration(0)
	for _, o := range led.Outcomes() {
		if o.Idempotent {
			idem++
		} else {
			non++
		}
		if o.Intended.Before(fr.killedAt) && o.End.After(fr.killedAt) {
			inFlight++
			inFlightLast = max(inFlightLast, o.End.Sub(fr.killedAt))
			if o.Code != envelope.CodeOK {
				inFlightFailed++
			}
		}
		if o.Code == envelope.CodeOK {
			if o.Idempotent {
				idemOK++
			} else {
				nonOK++
			}
			continue
		}
		failedBy[o.Code]++
		if d := o.Intended.Sub(fr.killedAt); d > -3*time.Second && d < 5*time.Second {
			failedNear++
		}
	}

	// Reconnect times of B's links.
	var moved []time.Duration
	var notMoved []string
	for _, id := range fr.bClients {
		if d, ok := fr.clientMoved[id]; ok {
			moved = append(moved, d)
		} else {
			notMoved = append(notMoved, id)
		}
	}
	for _, id := range fr.bAgents {
		if d, ok := fr.agentMoved[id]; ok {
			moved = append(moved, d)
		} else {
			notMoved = append(notMoved, id)
		}
	}
	var logs []string
	for _, ap := range agentProcs {
		logs = append(logs, ap.stderr.String())
	}
	// The agents' own "registered" lines: when each of B's agents was
	// registered on another hub after the kill.
	var agentReg []time.Duration
	regLines := agentLogEvents("registered", logs...)
	for _, id := range fr.bAgents {
		for _, ev := range regLines[id] {
			if ev.at.After(fr.killedAt) && !strings.Contains(ev.hub, addrs["B"]) {
				agentReg = append(agentReg, ev.at.Sub(fr.killedAt))
				break
			}
		}
	}
	// Dial attempts of B's links in the 10 s after the kill, in 100 ms
	// windows aligned on the kill.
	for id, evs := range agentLogEvents("dialing hub", logs...) {
		for _, ev := range evs {
			rec.add(id, ev.at)
		}
	}
	isB := map[string]bool{}
	for _, id := range append(slices.Clone(fr.bAgents), fr.bClients...) {
		isB[id] = true
	}
	windows := map[int]int{}
	nAttempts, clientAttempts := 0, 0
	rec.mu.Lock()
	for link, ts := range rec.at {
		if !isB[link] {
			continue
		}
		for _, x := range ts {
			if d := x.Sub(fr.killedAt); d >= 0 && d < 10*time.Second {
				windows[int(d/(100*time.Millisecond))]++
				nAttempts++
				if slices.Contains(fr.bClients, link) {
					clientAttempts++
				}
			}
		}
	}
	rec.mu.Unlock()
	peak, peakAt := 0, 0
	for w, n := range windows {
		if n > peak {
			peak, peakAt = n, w
		}
	}
	peakShare := 0.0
	if nAttempts > 0 {
		peakShare = float64(peak) / float64(nAttempts)
	}

	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	codes := map[string]int{}
	for c, n := range failedBy {
		codes[c.String()] = n
	}
	fig := map[string]any{
		"scenario": p.name + "-figures", "calls": sent, "idempotent": idem, "idempotentOK": idemOK,
		"nonIdempotent": non, "nonIdempotentOK": nonOK, "failedByCode": codes, "failedNearKill": failedNear,
		"inFlightAtKill": inFlight, "inFlightAtKillFailed": inFlightFailed, "inFlightLastAnsweredMs": ms(inFlightLast),
		"executions": execs, "bAgents": len(fr.bAgents), "bClients": len(fr.bClients),
		"reconnectP50Ms": ms(pct(moved, 0.5)), "reconnectP99Ms": ms(pct(moved, 0.99)), "reconnectMaxMs": ms(pct(moved, 1)),
		"agentRegisteredP99Ms": ms(pct(agentReg, 0.99)), "routingStoppedMs": ms(fr.routingStopped),
		"balancedMs": ms(fr.balanced), "endOnB": fr.endOnB, "attempts": nAttempts, "clientAttempts": clientAttempts, "peakWindowAttempts": peak,
		"peakWindowMs": peakAt * 100, "peakShare": peakShare, "leak": leakFig,
	}
	b, _ := json.Marshal(fig)
	scenario.Emit(b)
	t.Logf("%s: %d calls, %d ok, failed %v (%d of them intended within -3..+5 s of the kill); %d calls in flight at the kill, %d of them failed, the last answered %v after it; p99 %.1f ms, max %.1f ms; "+
		"idempotent %d/%d ok; non-idempotent %d/%d ok, %d executions recorded, duplicates %d, phantom %d; "+
		"B's %d clients and %d agents on A or C after p50 %v / p99 %v / max %v (agents' own registered lines: p99 %v); "+
		"A and C list no agent on hub-B %v after the kill (TTL %v); B balanced %v after its restart; at the end B holds %d agents and %d clients; "+
		"%d dial attempts by B's links in 10 s (%d by clients), peak %d (%.0f%%) in the window at %d ms",
		p.name, sent, s.Succeeded, s.Failed, failedNear, inFlight, inFlightFailed, inFlightLast.Round(time.Millisecond), s.P99Ms, s.MaxMs, idemOK, idem, nonOK, non, execs, s.Duplicates, s.Phantom,
		len(fr.bClients), len(fr.bAgents), pct(moved, 0.5).Round(time.Millisecond), pct(moved, 0.99).Round(time.Millisecond),
		pct(moved, 1).Round(time.Millisecond), pct(agentReg, 0.99).Round(time.Millisecond),
		fr.routingStopped.Round(time.Millisecond), hubTTL, fr.balanced.Round(time.Millisecond), fr.endOnB[0], fr.endOnB[1],
		nAttempts, clientAttempts, peak, 100*peakShare, peakAt*100)

	if s.Lost != 0 || s.Misdelivered != 0 {
		t.Errorf("lost %d, misdelivered %d; want 0", s.Lost, s.Misdelivered)
	}
	for c, n := range failedBy {
		if c != envelope.CodeUnavailable {
			t.Errorf("%d calls failed with %s; want failures only UNAVAILABLE (answered, not left to their timeout)", n, c)
		}
	}
	if rate := float64(idemOK) / float64(idem); rate < 0.995 {
		t.Errorf("idempotent success %.2f%%; want >= 99.5%%", 100*rate)
	}
	if s.Duplicates != 0 || s.Phantom != 0 {
		t.Errorf("non-idempotent duplicates %d, phantom executions %d; want 0", s.Duplicates, s.Phantom)
	}
	if execs < nonOK {
		t.Errorf("%d non-idempotent calls succeeded but the agents recorded %d executions", nonOK, execs)
	}
	if len(fr.bAgents) == 0 || len(fr.bClients) == 0 {
		t.Errorf("before the kill B held %d agents and %d clients; want some of each", len(fr.bAgents), len(fr.bClients))
	}
	if len(notMoved) > 0 {
		t.Errorf("%v never seen on A or C within 15 s of the kill", notMoved)
	}
	if p99 := pct(moved, 0.99); p99 > 5*time.Second {
		t.Errorf("B's links reconnected to A or C after p99 %v; want within 5 s", p99)
	}
	if fr.routingStopped == 0 || fr.routingStopped > hubTTL+time.Second {
		t.Errorf("A and C listed agents attached to hub-B until %v after the kill (0: past 15 s); want within TTL + 1 s = %v",
			fr.routingStopped, hubTTL+time.Second)
	}
	if fr.balanced == 0 {
		t.Errorf("B not back in balance within 30 s of its restart: %s", fr.balanceNote)
	}
	if p.checkJitter && peakShare > 0.30 {
		t.Errorf("reconnect attempts not jittered: %d of %d (%.0f%%) in the 100 ms window at %d ms after the kill; want <= 30 %%",
			peak, nAttempts, 100*peakShare, peakAt*100)
	}
	if ok := clients[len(clients)/2].Call(t.Context(), "echo.echo", 1, nil); ok != nil {
		t.Errorf("call after B returned: %v", ok)
	}
}
