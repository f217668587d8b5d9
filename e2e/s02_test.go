package e2e_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/scenario"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/reliability"
)

// logTimes returns the times of the JSON log lines of a process whose msg
// is msg and whose agent field is agent.
func hubLogTimes(log, msg, agent string) []time.Time {
	var out []time.Time
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var line struct {
			Time  time.Time
			Msg   string
			Agent string
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == msg && line.Agent == agent {
			out = append(out, line.Time)
		}
	}
	return out
}

// firstAfter returns the first of ts at or after t (zero if none).
func firstAfter(ts []time.Time, t time.Time) time.Time {
	for _, x := range ts {
		if !x.Before(t) {
			return x
		}
	}
	return time.Time{}
}

// scrape returns the value of one series of a hub's /metrics (the sum over
// the series whose line starts with name, labels included), or -1 when the
// hub does not answer.
func scrapeMetric(base, name string) float64 {
	c := &http.Client{Timeout: 2 * time.Second}
	res, err := c.Get(base + "/metrics")
	if err != nil {
		return -1
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	sum := 0.0
	for line := range strings.SplitSeq(string(body), "\n") {
		if rest, ok := strings.CutPrefix(line, name); ok && (strings.HasPrefix(rest, " ") || strings.HasPrefix(rest, "{")) {
			f := strings.Fields(rest[strings.LastIndex(rest, "}")+1:])
			if len(f) > 0 {
				v, _ := strconv.ParseFloat(f[0], 64)
				sum += v
			}
		}
	}
	return sum
}

// call is one request of a scenario with what the ledger does not keep:
// when it really started, which instance answered.
type s02Call struct {
	scenario.Outcome
	Start  time.Time
	Origin string
}

// calls is a concurrent list of calls.
type s02Calls struct {
	mu   sync.Mutex
	list []s02Call
}

func (cs *s02Calls) add(c s02Call) {
	cs.mu.Lock()
	cs.list = append(cs.list, c)
	cs.mu.Unlock()
}

// do makes one call of method with params, records it in led and cs. want
// is the part of the result that proves it answers this request; pick
// extracts it from the result.
func (cs *s02Calls) do(ctx context.Context, led *scenario.Ledger, inv envelope.Invoker, method string, idempotent bool,
	params, want string, pick func(json.RawMessage) string, intended time.Time) {
	cs.doTo(ctx, led, inv, "", method, idempotent, params, want, pick, intended)
}

// doTo is do for a call pinned to instance dest (routed by the balancer
// when dest is empty): a test's probe of an instance it has faulted.
func (cs *s02Calls) doTo(ctx context.Context, led *scenario.Ledger, inv envelope.Invoker, dest, method string, idempotent bool,
	params, want string, pick func(json.RawMessage) string, intended time.Time) {
	req := &envelope.Request{ID: envelope.NewID(), Method: method, Destination: dest, Params: json.RawMessage(params)}
	start := time.Now()
	res, err := inv(ctx, req)
	o := scenario.Outcome{ID: req.ID, Method: method, Idempotent: idempotent, Intended: intended, End: time.Now(), Want: want}
	c := s02Call{Start: start}
	if err != nil {
		e := envelope.AsError(err)
		o.Code, o.NotSent = e.Code, e.NotSent()
	} else {
		o.Echo = pick(res.Result)
		c.Origin = res.Origin
	}
	c.Outcome = o
	led.Record(o)
	cs.add(c)
}

// s02Params scale scenario S02: the short variant shrinks the heartbeat,
// the freeze and the load so that TTL + 1 s and the other bounds scale.
type s02Params struct {
	name             string
	heartbeat        time.Duration // TTL = 3 heartbeats
	load             time.Duration
	freezeAt, freeze time.Duration // the long freeze: past the TTL
	blipAt, blip     time.Duration // the short freeze: past the timeout of chaos.*, within the TTL
	memTimeout       time.Duration // memory.* (idempotent)
	incrTimeout      time.Duration // chaos.* (non-idempotent)
}

// TestS02FrozenAgent is scenario S02, grey failure: one hub, four kv agent
// processes (memory.get, idempotent, timeout 2.5 s, retries 2) and four
// chaos agent processes (chaos.echo stands for kv.incr: non-idempotent,
// and chaos.executions counts executions per request id, so duplicates
// are measured, not guessed), 200 calls/s, 80 % memory.get. One instance
// of each is frozen with SIGSTOP past the TTL, then continued; later both
// are frozen again for less than the TTL but longer than the timeout of
// chaos.echo, so that their answers come after the callers gave up.
//
// Pass: lost = 0, misdelivered = 0, memory.get success >= 99 %, chaos.echo
// duplicates = 0 and phantoms = 0; the frozen instances leave the registry
// within TTL + 1 s of the freeze and get no request after that; a call
// waiting on one of them at that moment is answered then (UNAVAILABLE, or
// for memory.get a retry elsewhere), not at its timeout; chaos.echo calls
// that hit a frozen instance end with TIMEOUT at their deadline ± 50 ms;
// after SIGCONT the same processes are back in rotation within 2
// heartbeats; the late answers are dropped and counted in
// agentmesh_late_responses_total; no call is pending on the hub at the end;
// leak check (leak_test.go) 2× the 2.5 s timeout after the load: nothing
// pending on the hub, the 8 agents or the client, goroutines <= baseline
// + 20 on each of them and the test process, hub heap after GC <= +10 %.
func TestS02FrozenAgent(t *testing.T) {
	p := s02Params{name: "S02", heartbeat: 1500 * time.Millisecond, load: 60 * time.Second,
		freezeAt: 10 * time.Second, freeze: 20 * time.Second, blipAt: 45 * time.Second, blip: 2 * time.Second,
		memTimeout: 2500 * time.Millisecond, incrTimeout: 1500 * time.Millisecond}
	if testing.Short() {
		p = s02Params{name: "S02-short", heartbeat: 600 * time.Millisecond, load: 18 * time.Second,
			freezeAt: 3 * time.Second, freeze: 6 * time.Second, blipAt: 13 * time.Second, blip: 800 * time.Millisecond,
			memTimeout: 2500 * time.Millisecond, incrTimeout: 500 * time.Millisecond}
	}
	ttl := 3 * p.heartbeat
	policies := fmt.Sprintf(`policies:
  "memory.*": { timeout: %s, retries: 2, idempotent: true, backoff: { strategy: exponential, initial: 10ms, max: 100ms, jitter: true } }
  "chaos.*": { timeout: %s, retries: 2, idempotent: false, backoff: { strategy: exponential, initial: 10ms, max: 100ms, jitter: true } }
`, p.memTimeout, p.incrTimeout)
	cfgFile := filepath.Join(t.TempDir(), "mesh.yaml")
	if err := os.WriteFile(cfgFile, []byte(policies), 0o600); err != nil {
		t.Fatal(err)
	}
	h := startHub(t, "--config", cfgFile, "--heartbeat", p.heartbeat.String(), "--admin-addr", "127.0.0.1:0")
	var kvs, chaoses []*proc
	for i := range 4 {
		kvs = append(kvs, start(t, "meshctl", "agent", "run", "kv", "--id", fmt.Sprintf("kv-%d", i), "--hub", h.ws, "--metrics-addr", "127.0.0.1:0"))
		chaoses = append(chaoses, start(t, "meshctl", "agent", "run", "chaos", "--id", fmt.Sprintf("chaos-%d", i), "--hub", h.ws, "--metrics-addr", "127.0.0.1:0"))
	}
	frozen := []*proc{kvs[0], chaoses[0]}
	frozenIDs := []string{"kv-0", "chaos-0"}
	for _, f := range frozen {
		t.Cleanup(func() { _ = f.cmd.Process.Signal(syscall.SIGCONT) }) // before its stop: a stopped process ignores SIGTERM
	}

	rc := reliability.DefaultConfig()
	bo := reliability.BackoffConfig{Strategy: reliability.Exponential, Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond, Jitter: true}
	rc.Policies["memory.*"] = reliability.Policy{Timeout: p.memTimeout, Retries: 2, Idempotent: true, Backoff: bo}
	rc.Policies["chaos.*"] = reliability.Policy{Timeout: p.incrTimeout, Retries: 2, Idempotent: false, Backoff: bo}
	c, err := mesh.NewClient([]string{h.ws}, mesh.WithReliability(rc))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	agentsNow := func() []string {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		var list []control.AgentInfo
		if err := c.Call(ctx, "mesh.agents", nil, &list); err != nil {
			return nil
		}
		var ids []string
		for _, a := range list {
			ids = append(ids, a.AgentID)
		}
		return ids
	}
	waitFor(t, "eight agents", 15*time.Second, func() bool { return len(agentsNow()) == 8 })
	for i := range 4 { // something to read
		if err := c.Call(t.Context(), "memory.put", map[string]any{"key": fmt.Sprintf("k%d", i), "value": i}, nil); err != nil {
			t.Fatal(err)
		}
	}
	// Every kv agent has its own store: memory.get answers found or not,
	// but always with the key asked for, which proves it is this call's.
	pickKey := func(r json.RawMessage) string {
		var v struct{ Key string }
		_ = json.Unmarshal(r, &v)
		return v.Key
	}
	pickRaw := func(r json.RawMessage) string { return string(r) }
	// Warm up both methods, then take the leak check's baselines: the hub
	// and all 8 agent processes (the frozen ones are the same processes
	// after SIGCONT, so they keep theirs).
	for i := range 40 {
		_ = c.Call(t.Context(), "memory.get", map[string]any{"key": fmt.Sprintf("k%d", i%4)}, nil)
		_ = c.Call(t.Context(), "chaos.echo", i, nil)
	}
	leakProcs := []leakProc{leakHub(t, "hub", h.proc)}
	for i := range 4 {
		leakProcs = append(leakProcs, leakAgent(t, fmt.Sprintf("kv-%d", i), kvs[i]), leakAgent(t, fmt.Sprintf("chaos-%d", i), chaoses[i]))
	}
	leaks := leakBaseline(t, leakProcs...)

	// The faults, on their own goroutine, timed from the load's start.
	type faultTimes struct {
		stopped, continued, blipStopped, blipContinued time.Time
		presentInBlip                                  bool // both stayed registered through the short freeze
	}
	var ft faultTimes
	faultsDone := make(chan struct{})
	led := scenario.NewLedger()
	var cs s02Calls
	loadStart := time.Now()
	signal := func(sig syscall.Signal) time.Time {
		at := time.Now()
		for _, f := range frozen {
			if err := f.cmd.Process.Signal(sig); err != nil {
				t.Errorf("%v to %s: %v", sig, f.name, err)
			}
		}
		return at
	}
	// Probes: calls the test itself sends to the frozen instances once
	// the kernel shows them stopped, so that the properties below are
	// exercised in every run rather than when the balancer happens to
	// pick a frozen instance (it steers away from one with calls
	// outstanding, and hedges idempotent calls elsewhere). A memory.get
	// pinned to kv-0 waits on it until its removal; a chaos.echo pinned
	// to chaos-0 times out at its deadline, in both freezes (in the
	// short one its answer comes late, after SIGCONT).
	const echoProbes = 2 // recorded in the ledger, with the load's calls
	var probes sync.WaitGroup
	var memProbe s02Call
	probe := func(method, dest, params string) s02Call {
		req := &envelope.Request{ID: envelope.NewID(), Method: method, Destination: dest, Params: json.RawMessage(params)}
		start := time.Now()
		_, err := c.Invoke(context.Background(), req)
		x := s02Call{Outcome: scenario.Outcome{ID: req.ID, Method: method, End: time.Now(), Code: envelope.CodeOK}, Start: start}
		if err != nil {
			e := envelope.AsError(err)
			x.Code, x.NotSent = e.Code, e.NotSent()
		}
		return x
	}
	echoProbe := func(i int) {
		want := fmt.Sprintf(`{"probe":%d}`, i)
		cs.doTo(context.Background(), led, c.Invoke, "chaos-0", "chaos.echo", false, want, want, pickRaw, time.Now())
	}
	go func() {
		defer close(faultsDone)
		defer probes.Wait()
		time.Sleep(time.Until(loadStart.Add(p.freezeAt)))
		ft.stopped = signal(syscall.SIGSTOP)
		for _, f := range frozen {
			waitStopped(t, f)
		}
		probes.Add(2)
		go func() { defer probes.Done(); memProbe = probe("memory.get", "kv-0", `{"key":"k0"}`) }()
		go func() { defer probes.Done(); echoProbe(1) }()
		time.Sleep(time.Until(ft.stopped.Add(p.freeze)))
		ft.continued = signal(syscall.SIGCONT)
		time.Sleep(time.Until(loadStart.Add(p.blipAt)))
		ft.blipStopped = signal(syscall.SIGSTOP)
		for _, f := range frozen {
			waitStopped(t, f)
		}
		probes.Add(1)
		go func() { defer probes.Done(); echoProbe(2) }()
		ft.presentInBlip = true
		for time.Since(ft.blipStopped) < p.blip {
			ids := agentsNow()
			for _, id := range frozenIDs {
				if !slices.Contains(ids, id) {
					ft.presentInBlip = false
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		ft.blipContinued = signal(syscall.SIGCONT)
	}()

	sent := scenario.Drive(context.Background(), 200, p.load, 1000, func(ctx context.Context, i int, intended time.Time) {
		if rand.IntN(5) == 0 {
			want := fmt.Sprintf(`{"i":%d}`, i)
			cs.do(ctx, led, c.Invoke, "chaos.echo", false, want, want, pickRaw, intended)
			return
		}
		key := fmt.Sprintf("k%d", i%8)
		cs.do(ctx, led, c.Invoke, "memory.get", true, fmt.Sprintf(`{"key":%q}`, key), key, pickKey, intended)
	})
	<-faultsDone
	loadEnd := time.Now()

	// Executions, per chaos agent, joined into the ledger.
	frozenExecs := map[string]int{}
	for i := range 4 {
		id := fmt.Sprintf("chaos-%d", i)
		var ex struct{ Executions map[string]int }
		var err error
		for try := 0; try < 20; try++ { // the frozen one may still be rejoining
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			var res *envelope.Response
			res, err = c.Invoke(ctx, &envelope.Request{ID: envelope.NewID(), Method: "chaos.executions", Destination: id, Params: json.RawMessage(`{}`)})
			cancel()
			if err == nil {
				err = json.Unmarshal(res.Result, &ex)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("chaos.executions of %s: %v", id, err)
		}
		for rid, n := range ex.Executions {
			led.Executed(rid, n)
			if id == "chaos-0" {
				frozenExecs[rid] = n
			}
		}
	}
	s := led.Summarize(p.name, sent+echoProbes)

	// When the hub removed the frozen instances (heartbeat expiry), and
	// when they registered again, from the hub's log.
	hubLog := h.stderr.String()
	removed := map[string]time.Time{}
	rejoined := map[string]time.Time{}
	for _, id := range frozenIDs {
		removed[id] = firstAfter(hubLogTimes(hubLog, "instance left the registry; closing its link", id), ft.stopped)
		rejoined[id] = firstAfter(hubLogTimes(hubLog, "agent registered", id), ft.continued)
	}
	late := scrapeMetric(h.base, "agentmesh_late_responses_total")
	pending := scrapeMetric(h.base, "agentmesh_pending_requests")
	leakFig := leaks.check(t, 2*p.memTimeout, c) // 2× the largest timeout after the load

	// Sort the calls out.
	lastRemoval := removed["kv-0"]
	if r := removed["chaos-0"]; r.After(lastRemoval) {
		lastRemoval = r
	}
	firstRejoin := rejoined["kv-0"]
	if r := rejoined["chaos-0"]; r.Before(firstRejoin) {
		firstRejoin = r
	}
	var (
		timeouts, timeoutsOff, atRemoval, atRemovalOff, blipTimeouts int
		memOK, mem, routedWhileOut                                   int
		worstTimeoutDev, worstRemovalGap                             time.Duration
		servedAfterRejoin                                            = map[string]int{}
	)
	for _, x := range cs.list {
		if x.Method == "memory.get" {
			mem++
			if x.Code == envelope.CodeOK {
				memOK++
			}
		}
		if x.Code == envelope.CodeTimeout && x.Method == "chaos.echo" {
			timeouts++
			dev := x.End.Sub(x.Start) - p.incrTimeout
			worstTimeoutDev = max(worstTimeoutDev, dev, -dev)
			if dev > 50*time.Millisecond || dev < -50*time.Millisecond {
				timeoutsOff++
			}
			if !x.Start.Before(ft.blipStopped) && x.Start.Before(ft.blipContinued) {
				blipTimeouts++
			}
		}
		// Answered at removal: a chaos.echo that failed UNAVAILABLE after
		// being sent, or a memory.get that waited (on a frozen instance,
		// before its retry elsewhere succeeded), while the instances were
		// frozen. (The retry happened on the hub, so the client's response
		// metrics do not show it; a healthy call takes a few ms.)
		inFreeze := !x.Start.Before(ft.stopped) && x.Start.Before(lastRemoval)
		if inFreeze && ((x.Method == "chaos.echo" && x.Code == envelope.CodeUnavailable && !x.NotSent) ||
			(x.Method == "memory.get" && x.Code == envelope.CodeOK && x.End.Sub(x.Start) > 300*time.Millisecond)) {
			atRemoval++
			rm := removed["kv-0"]
			if x.Method == "chaos.echo" {
				rm = removed["chaos-0"]
			}
			gap := x.End.Sub(rm)
			worstRemovalGap = max(worstRemovalGap, gap, -gap)
			if gap < -20*time.Millisecond || gap > 200*time.Millisecond {
				atRemovalOff++
				t.Logf("%s started %v after SIGSTOP ended %v after the removal of its instance: %s", x.Method,
					x.Start.Sub(ft.stopped).Round(time.Millisecond), gap.Round(time.Millisecond), x.Code)
			}
		}
		// Routed to a frozen instance after its removal and before it
		// came back: it would have answered it (memory.get) or executed
		// it (chaos.echo).
		out := x.Start.After(lastRemoval.Add(50*time.Millisecond)) && x.End.Before(firstRejoin)
		if out && (slices.Contains(frozenIDs, x.Origin) || frozenExecs[x.ID] > 0) {
			routedWhileOut++
		}
		if !firstRejoin.IsZero() && x.Start.After(firstRejoin) && slices.Contains(frozenIDs, x.Origin) {
			servedAfterRejoin[x.Origin]++
		}
	}

	// The memory.get pinned to kv-0 once it was stopped: when kv-0's
	// removal comes before its deadline (the short variant), answered
	// then, as any call waiting on it; pinned, it cannot be retried
	// elsewhere, so it ends UNAVAILABLE (or AGENT_NOT_FOUND, when the
	// hub's retry finds the instance it names gone). Otherwise TIMEOUT
	// at its deadline.
	if rm := removed["kv-0"]; !rm.IsZero() && memProbe.Start.Add(p.memTimeout).Before(rm) {
		// Its deadline came before the removal (the long variant: TTL
		// 4.5 s, timeout 2.5 s): a request sent to a frozen instance
		// ends with TIMEOUT at its deadline.
		if off := memProbe.End.Sub(memProbe.Start.Add(p.memTimeout)); memProbe.Code != envelope.CodeTimeout || off < -50*time.Millisecond || off > 50*time.Millisecond {
			t.Errorf("the memory.get pinned to kv-0 while it was stopped, its deadline before the removal, ended %s %v off its deadline; want TIMEOUT at it ±50 ms", memProbe.Code, off)
		}
	} else if !rm.IsZero() {
		atRemoval++
		gap := memProbe.End.Sub(rm)
		worstRemovalGap = max(worstRemovalGap, gap, -gap)
		if gap < -20*time.Millisecond || gap > 200*time.Millisecond {
			atRemovalOff++
			t.Logf("the memory.get pinned to kv-0 ended %v after its removal: %s", gap.Round(time.Millisecond), memProbe.Code)
		}
		if memProbe.Code != envelope.CodeUnavailable && memProbe.Code != envelope.CodeAgentNotFound {
			t.Errorf("the memory.get pinned to kv-0 while it was stopped ended %s; want UNAVAILABLE (or AGENT_NOT_FOUND) at its removal", memProbe.Code)
		}
	}

	summary := struct {
		scenario.Summary
		RemovalMs          map[string]int64 `json:"removalAfterFreezeMs"`
		RejoinMs           map[string]int64 `json:"rejoinAfterContinueMs"`
		AnsweredAtRemoval  int              `json:"answeredAtRemoval"`
		WorstRemovalGapMs  float64          `json:"worstRemovalGapMs"`
		FrozenTimeouts     int              `json:"frozenTimeouts"`
		WorstTimeoutDevMs  float64          `json:"worstTimeoutDeviationMs"`
		RoutedWhileRemoved int              `json:"routedWhileRemoved"`
		LateResponses      float64          `json:"lateResponses"`
		HubPending         float64          `json:"hubPendingAtEnd"`
		Leak               leakFigures      `json:"leak"`
	}{Leak: leakFig, Summary: s, RemovalMs: map[string]int64{}, RejoinMs: map[string]int64{},
		AnsweredAtRemoval: atRemoval, WorstRemovalGapMs: ms(worstRemovalGap), FrozenTimeouts: timeouts,
		WorstTimeoutDevMs: ms(worstTimeoutDev), RoutedWhileRemoved: routedWhileOut, LateResponses: late, HubPending: pending}
	for _, id := range frozenIDs {
		if !removed[id].IsZero() {
			summary.RemovalMs[id] = removed[id].Sub(ft.stopped).Milliseconds()
		}
		if !rejoined[id].IsZero() {
			summary.RejoinMs[id] = rejoined[id].Sub(ft.continued).Milliseconds()
		}
	}
	b, _ := json.Marshal(summary)
	scenario.Emit(b)
	t.Logf("%s: %d calls in %v, %d ok, failed %v; removal after SIGSTOP %v ms (bound %v), back %v ms after SIGCONT (bound %v); "+
		"%d answered at removal (worst %.0f ms off), %d chaos.echo TIMEOUTs (worst %.1f ms off the deadline, %d in the short freeze), "+
		"%v late responses counted, p99 %.1f ms", p.name, sent, loadEnd.Sub(loadStart).Round(time.Millisecond), s.Succeeded, s.Failed,
		summary.RemovalMs, ttl+time.Second, summary.RejoinMs, 2*p.heartbeat, atRemoval, ms(worstRemovalGap), timeouts, ms(worstTimeoutDev),
		blipTimeouts, late, s.P99Ms)

	if s.Lost != 0 || s.Misdelivered != 0 || s.Duplicates != 0 || s.Phantom != 0 {
		t.Errorf("lost %d, misdelivered %d, duplicates %d, phantom %d; want 0", s.Lost, s.Misdelivered, s.Duplicates, s.Phantom)
	}
	if rate := float64(memOK) / float64(mem); rate < 0.99 {
		t.Errorf("memory.get success %.2f%% (%d/%d); want >= 99%%", 100*rate, memOK, mem)
	}
	for code, n := range s.Failed {
		if code != "TIMEOUT" && code != "UNAVAILABLE" {
			t.Errorf("%d calls failed with %s; want only TIMEOUT or UNAVAILABLE", n, code)
		}
	}
	for _, id := range frozenIDs {
		switch {
		case removed[id].IsZero():
			t.Errorf("%s was never removed from routing during the freeze", id)
		case removed[id].Sub(ft.stopped) > ttl+time.Second:
			t.Errorf("%s removed %v after SIGSTOP; want within TTL + 1 s = %v", id, removed[id].Sub(ft.stopped), ttl+time.Second)
		}
		switch {
		case rejoined[id].IsZero():
			t.Errorf("%s never registered again after SIGCONT", id)
		case rejoined[id].Sub(ft.continued) > 2*p.heartbeat:
			t.Errorf("%s back %v after SIGCONT; want within 2 heartbeats = %v", id, rejoined[id].Sub(ft.continued), 2*p.heartbeat)
		}
		if servedAfterRejoin[id] == 0 {
			t.Errorf("%s answered no call after it came back", id)
		}
	}
	for _, f := range frozen {
		if f.exitedYet() {
			t.Errorf("%s exited (%v); want the same process back in rotation", f.name, f.err)
		}
	}
	if atRemoval == 0 {
		t.Error("no call was waiting on a frozen instance at its removal; the property was not exercised")
	}
	if atRemovalOff > 0 {
		t.Errorf("%d calls waiting on a frozen instance were not answered at its removal (worst %v off)", atRemovalOff, worstRemovalGap)
	}
	if timeouts == 0 {
		t.Error("no chaos.echo call timed out on a frozen instance; the property was not exercised")
	}
	if timeoutsOff > 0 {
		t.Errorf("%d of %d TIMEOUTs ended more than 50 ms off their deadline (worst %v)", timeoutsOff, timeouts, worstTimeoutDev)
	}
	if routedWhileOut > 0 {
		t.Errorf("%d calls were routed to a frozen instance after its removal", routedWhileOut)
	}
	if !ft.presentInBlip {
		t.Errorf("the instances expired during the short freeze of %v (TTL %v)", p.blip, ttl)
	}
	// The chaos.echo pinned to chaos-0 in the short freeze times out;
	// chaos-0, continued, answers it late.
	if blipTimeouts == 0 {
		t.Error("no chaos.echo call timed out during the short freeze; late answers were not exercised")
	}
	if (blipTimeouts > 0 && late < 1) || late > float64(timeouts) {
		t.Errorf("agentmesh_late_responses_total = %v; want between 1 and the %d calls that timed out", late, timeouts)
	}
	if pending != 0 {
		t.Errorf("agentmesh_pending_requests on the hub = %v after the load; want 0", pending)
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// waitStopped waits until the kernel shows p stopped (state T in
// /proc/PID/stat): a signal is delivered asynchronously, and a probe
// sent before the stop could still be answered.
func waitStopped(t *testing.T, p *proc) {
	t.Helper()
	waitFor(t, p.name+" stopped", 2*time.Second, func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
		if err != nil {
			return false
		}
		// pid (comm) state ...: comm may hold spaces and parentheses.
		i := strings.LastIndexByte(string(b), ')')
		return i > 0 && i+2 < len(b) && b[i+2] == 'T'
	})
}
