package e2e_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/scenario"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/reliability"
)

// blackholeProxy is a loopback TCP proxy that can swallow a link without
// closing it, as a firewall dropping every packet both ways does: while
// holed it forwards nothing, not even a close, and opens no new upstream
// connection; the bytes wait (as TCP retransmits them) and flow again once
// healed.
type blackholeProxy struct {
	ln     net.Listener
	target string
	done   chan struct{}
	wg     sync.WaitGroup

	mu    sync.Mutex
	open  chan struct{} // closed while traffic flows
	conns map[net.Conn]struct{}
}

func newBlackholeProxy(t *testing.T, target string) *blackholeProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &blackholeProxy{ln: ln, target: target, done: make(chan struct{}), open: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	close(p.open)
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *blackholeProxy) addr() string { return p.ln.Addr().String() }

// hole stops all traffic; heal lets it flow again.
func (p *blackholeProxy) hole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
		p.open = make(chan struct{})
	default:
	}
}

func (p *blackholeProxy) heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
	default:
		close(p.open)
	}
}

// pass waits while the proxy is holed; false once it closes.
func (p *blackholeProxy) pass() bool {
	p.mu.Lock()
	open := p.open
	p.mu.Unlock()
	select {
	case <-open:
		return true
	case <-p.done:
		return false
	}
}

func (p *blackholeProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		_ = c.Close()
		return false
	default:
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *blackholeProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(c) {
			return
		}
		p.wg.Go(func() { p.serve(c) })
	}
}

func (p *blackholeProxy) serve(down net.Conn) {
	defer down.Close()
	if !p.pass() {
		return
	}
	up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		return
	}
	defer up.Close()
	if !p.track(up) {
		return
	}
	var wg sync.WaitGroup
	wg.Go(func() { p.pump(down, up) })
	wg.Go(func() { p.pump(up, down) })
	wg.Wait()
}

// pump copies src to dst, holding what it read while holed; src's end
// (EOF or error) is passed on as a close of dst's write side, also only
// once healed.
func (p *blackholeProxy) pump(src, dst net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if !p.pass() {
			return
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				_ = src.Close()
				return
			}
		}
		if err != nil {
			if tc, ok := dst.(*net.TCPConn); ok && errors.Is(err, io.EOF) {
				_ = tc.CloseWrite()
			} else {
				_ = dst.Close()
			}
			return
		}
	}
}

func (p *blackholeProxy) close() {
	p.mu.Lock()
	select {
	case <-p.done:
		p.mu.Unlock()
		return
	default:
	}
	close(p.done)
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
}

// s21Params scale scenario S21.
type s21Params struct {
	name                string
	ping                time.Duration // link ping; dead after 2 missed
	heartbeat           time.Duration // agent heartbeats: TTL (3 of them) well past the link's death
	load                time.Duration
	holeAt, hole        time.Duration
	abuseAt             time.Duration
	deadBound, redialIn time.Duration
}

// TestS21HalfOpenAndPingAbuse is scenario S21, tier A: one hub, four echo
// agent processes with link pings every --link-ping, one of them linked
// through a userspace proxy; 100 calls/s (80 % echo.echo, idempotent; 20 %
// echo.sleep {ms:0} as a non-idempotent call).
//
// (a) The proxy blackholes that agent's link (nothing passes, nothing is
// closed). Pass: the hub declares the link dead within 12 s for 5 s pings
// (2.4 pings, scaled) and answers the calls pending on it then; the agent
// detects it as well and redials with backoff, and is registered again
// within 5 s of the heal; no call is lost.
// (b) A raw WebSocket client pings 20 times a second. Pass: the hub closes
// it (1008) within 5 s and counts it in agentmesh_link_ping_abuse_total;
// the agents' links and the client's calls are unaffected meanwhile.
// Leak check (leak_test.go) 2× the 5 s timeout after the load: nothing
// pending on the hub, the 4 agents or the client, goroutines <= baseline +
// 20 on each and on the test process, hub heap after GC reported against
// +10 %.
func TestS21HalfOpenAndPingAbuse(t *testing.T) {
	p := s21Params{name: "S21", ping: 5 * time.Second, heartbeat: 10 * time.Second, load: 60 * time.Second,
		holeAt: 10 * time.Second, hole: 20 * time.Second, abuseAt: 40 * time.Second, deadBound: 12 * time.Second, redialIn: 5 * time.Second}
	if testing.Short() {
		p = s21Params{name: "S21-short", ping: time.Second, heartbeat: 2 * time.Second, load: 20 * time.Second,
			holeAt: 4 * time.Second, hole: 5 * time.Second, abuseAt: 12 * time.Second, deadBound: 2400 * time.Millisecond, redialIn: 5 * time.Second}
	}
	cfgFile := filepath.Join(t.TempDir(), "mesh.yaml")
	if err := os.WriteFile(cfgFile, []byte(`policies:
  "echo.echo": { timeout: 5s, retries: 2, idempotent: true, backoff: { strategy: exponential, initial: 10ms, max: 100ms, jitter: true } }
  "echo.sleep": { timeout: 5s, retries: 2, idempotent: false, backoff: { strategy: exponential, initial: 10ms, max: 100ms, jitter: true } }
`), 0o600); err != nil {
		t.Fatal(err)
	}
	h := startHub(t, "--config", cfgFile, "--heartbeat", p.heartbeat.String(), "--link-ping", p.ping.String(), "--admin-addr", "127.0.0.1:0")
	proxy := newBlackholeProxy(t, h.addr)
	var agents []*proc
	for i := range 4 {
		hub := h.ws
		if i == 0 {
			hub = "ws://" + proxy.addr() + "/ws"
		}
		agents = append(agents, start(t, "meshctl", "agent", "run", "echo", "--id", fmt.Sprintf("echo-%d", i), "--hub", hub, "--link-ping", p.ping.String(),
			"--metrics-addr", "127.0.0.1:0"))
	}
	rc := reliability.DefaultConfig()
	bo := reliability.BackoffConfig{Strategy: reliability.Exponential, Initial: 10 * time.Millisecond, Max: 100 * time.Millisecond, Jitter: true}
	rc.Policies["echo.echo"] = reliability.Policy{Timeout: 5 * time.Second, Retries: 2, Idempotent: true, Backoff: bo}
	rc.Policies["echo.sleep"] = reliability.Policy{Timeout: 5 * time.Second, Retries: 2, Idempotent: false, Backoff: bo}
	c, err := mesh.NewClient([]string{h.ws}, mesh.WithReliability(rc))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitFor(t, "four agents", 15*time.Second, func() bool {
		var list []control.AgentInfo
		return c.Call(t.Context(), "mesh.agents", nil, &list) == nil && len(list) == 4
	})
	// Warm up, then take the leak check's baselines: the hub and the 4
	// agent processes (echo-0 keeps its process through the blackhole: it
	// only redials).
	for i := range 40 {
		_ = c.Call(t.Context(), "echo.echo", i, nil)
	}
	leakProcs := []leakProc{leakHub(t, "hub", h.proc)}
	for i, ap := range agents {
		leakProcs = append(leakProcs, leakAgent(t, fmt.Sprintf("echo-%d", i), ap))
	}
	leaks := leakBaseline(t, leakProcs...)

	type faultTimes struct {
		holed, healed, abuseStart, abuseClosed time.Time
		abuseErr                               error
	}
	var ft faultTimes
	faultsDone := make(chan struct{})
	loadStart := time.Now()
	led := scenario.NewLedger()
	var cs s02Calls
	pickRaw := func(r json.RawMessage) string { return string(r) }
	var probe sync.WaitGroup // the probe below, waited for with the faults
	go func() {
		defer close(faultsDone)
		defer probe.Wait()
		time.Sleep(time.Until(loadStart.Add(p.holeAt)))
		ft.holed = time.Now()
		proxy.hole()
		// A call the test pins to echo-0 once its link is cut: it waits on
		// the dead link, in every run, whatever the balancer does.
		probe.Add(1)
		go func() {
			defer probe.Done()
			cs.doTo(context.Background(), led, c.Invoke, "echo-0", "echo.sleep", false, `{"ms":0}`, `{"slept":0}`, pickRaw, time.Now())
		}()
		time.Sleep(time.Until(ft.holed.Add(p.hole)))
		ft.healed = time.Now()
		proxy.heal()
		time.Sleep(time.Until(loadStart.Add(p.abuseAt)))
		ft.abuseStart, ft.abuseClosed, ft.abuseErr = pingAbuse(h.ws, 20, 5*time.Second)
	}()

	sent := scenario.Drive(context.Background(), 100, p.load, 1000, func(ctx context.Context, i int, intended time.Time) {
		if rand.IntN(5) == 0 {
			cs.do(ctx, led, c.Invoke, "echo.sleep", false, `{"ms":0}`, `{"slept":0}`, pickRaw, intended)
			return
		}
		want := fmt.Sprintf(`{"i":%d}`, i)
		cs.do(ctx, led, c.Invoke, "echo.echo", true, want, want, pickRaw, intended)
	})
	<-faultsDone
	s := led.Summarize(p.name, sent+1)           // the probe too
	leakFig := leaks.check(t, 10*time.Second, c) // 2× the 5 s timeout

	hubLog := h.stderr.String()
	dead := firstAfter(hubLogTimes(hubLog, "agent link lost; deregistered", "echo-0"), ft.holed)
	expired := firstAfter(hubLogTimes(hubLog, "instance left the registry; closing its link", "echo-0"), ft.holed)
	back := firstAfter(hubLogTimes(hubLog, "agent registered", "echo-0"), ft.healed)
	agentLost := firstAfter(agentLogTimes(agents[0].stderr.String(), "hub link lost; reconnecting"), ft.holed)
	abuse := scrapeMetric(h.base, "agentmesh_link_ping_abuse_total")
	var registeredInAbuse int
	for i := range 4 {
		for _, at := range hubLogTimes(hubLog, "agent registered", fmt.Sprintf("echo-%d", i)) {
			if !at.Before(ft.abuseStart) {
				registeredInAbuse++
			}
		}
	}

	var answeredAtDeath, answeredOff, echoOK, echoN, failedInAbuse int
	var worstGap time.Duration
	for _, x := range cs.list {
		if x.Method == "echo.echo" {
			echoN++
			if x.Code == envelope.CodeOK {
				echoOK++
			}
		}
		// Waiting on the blackholed link when it was declared dead: a
		// non-idempotent call that failed UNAVAILABLE after being sent,
		// or an echo.echo that waited there before its retry elsewhere.
		// A call started up to a second before the blackhole counts too:
		// one still in the proxy when it closed is stuck as surely, and
		// once one call is stuck there the hub's least-pending pick sends
		// no other to echo-0 (a CI run saw only such a call, and none
		// started inside the hole). Calls that were not stuck end in ~1 ms
		// and match neither condition.
		inHole := !x.Start.Before(ft.holed.Add(-time.Second)) && !dead.IsZero() && x.Start.Before(dead)
		if inHole && ((x.Method == "echo.sleep" && x.Code == envelope.CodeUnavailable && !x.NotSent) ||
			(x.Method == "echo.echo" && x.Code == envelope.CodeOK && x.End.Sub(x.Start) > 300*time.Millisecond)) {
			answeredAtDeath++
			gap := x.End.Sub(dead)
			worstGap = max(worstGap, gap, -gap)
			if gap < -20*time.Millisecond || gap > 200*time.Millisecond {
				answeredOff++
				t.Logf("%s started %v after the blackhole ended %v after the link was declared dead: %s", x.Method,
					x.Start.Sub(ft.holed).Round(time.Millisecond), gap.Round(time.Millisecond), x.Code)
			}
		}
		if !ft.abuseStart.IsZero() && !x.Start.Before(ft.abuseStart) && x.Start.Before(ft.abuseClosed) && x.Code != envelope.CodeOK {
			failedInAbuse++
		}
	}
	since := func(a, b time.Time) int64 {
		if a.IsZero() || b.IsZero() {
			return -1
		}
		return a.Sub(b).Milliseconds()
	}
	summary := struct {
		scenario.Summary
		HubDeadMs       int64       `json:"hubDeclaredDeadAfterHoleMs"`
		AgentDeadMs     int64       `json:"agentDetectedAfterHoleMs"`
		ReconnectMs     int64       `json:"reconnectedAfterHealMs"`
		AnsweredAtDeath int         `json:"answeredAtDeath"`
		WorstGapMs      float64     `json:"worstDeathGapMs"`
		AbuseClosedMs   int64       `json:"abuseClosedAfterMs"`
		AbuseCounted    float64     `json:"pingAbuseCounted"`
		FailedInAbuse   int         `json:"failedDuringAbuse"`
		ReconnInAbuse   int         `json:"agentRegistrationsDuringAbuse"`
		Leak            leakFigures `json:"leak"`
	}{s, since(dead, ft.holed), since(agentLost, ft.holed), since(back, ft.healed), answeredAtDeath, ms(worstGap),
		since(ft.abuseClosed, ft.abuseStart), abuse, failedInAbuse, registeredInAbuse, leakFig}
	b, _ := json.Marshal(summary)
	scenario.Emit(b)
	t.Logf("%s: %d calls, %d ok, failed %v; hub declared the link dead %d ms after the blackhole (bound %v), agent %d ms; "+
		"%d calls answered then (worst %.0f ms off); agent back %d ms after the heal (bound %v); abusive pinger closed after %d ms (%v), counted %v; "+
		"p99 %.1f ms", p.name, sent, s.Succeeded, s.Failed, summary.HubDeadMs, p.deadBound, summary.AgentDeadMs, answeredAtDeath, ms(worstGap),
		summary.ReconnectMs, p.redialIn, summary.AbuseClosedMs, ft.abuseErr, abuse, s.P99Ms)

	if s.Lost != 0 || s.Misdelivered != 0 {
		t.Errorf("lost %d, misdelivered %d; want 0", s.Lost, s.Misdelivered)
	}
	if rate := float64(echoOK) / float64(echoN); rate < 0.999 {
		t.Errorf("echo.echo success %.2f%% (%d/%d); want >= 99.9%%", 100*rate, echoOK, echoN)
	}
	// (a)
	switch {
	case dead.IsZero():
		t.Errorf("the hub never declared the blackholed link dead (expired by heartbeat at %v)", expired)
	case !expired.IsZero() && expired.Before(dead):
		t.Errorf("echo-0 expired by heartbeat before its link was declared dead: the link's liveness was not what caught it")
	case dead.Sub(ft.holed) > p.deadBound:
		t.Errorf("the hub declared the link dead %v after the blackhole; want within %v", dead.Sub(ft.holed), p.deadBound)
	}
	switch {
	case agentLost.IsZero():
		t.Error("the agent never noticed its blackholed link")
	case agentLost.After(ft.healed):
		t.Errorf("the agent noticed its link was gone only %v after the heal", agentLost.Sub(ft.healed))
	case agentLost.Sub(ft.holed) > p.deadBound:
		t.Errorf("the agent noticed its blackholed link %v after the blackhole; want within %v", agentLost.Sub(ft.holed), p.deadBound)
	}
	switch {
	case back.IsZero():
		t.Error("echo-0 did not register again after the heal")
	case back.Sub(ft.healed) > p.redialIn:
		t.Errorf("echo-0 registered again %v after the heal; want within %v", back.Sub(ft.healed), p.redialIn)
	}
	if agents[0].exitedYet() {
		t.Errorf("echo-0 exited (%v); want it to redial", agents[0].err)
	}
	if answeredAtDeath == 0 {
		t.Error("no call was waiting on the blackholed link when it died; the property was not exercised")
	}
	if answeredOff > 0 {
		t.Errorf("%d calls waiting on the blackholed link were not answered when it was declared dead (worst %v off)", answeredOff, worstGap)
	}
	// (b)
	switch {
	case ft.abuseClosed.IsZero():
		t.Errorf("the hub did not close a client pinging 20/s within 5s (%v)", ft.abuseErr)
	case !websocket.IsCloseError(ft.abuseErr, websocket.ClosePolicyViolation):
		t.Errorf("the abusive pinger was closed with %v; want 1008 (policy violation)", ft.abuseErr)
	}
	if abuse != 1 {
		t.Errorf("agentmesh_link_ping_abuse_total = %v; want 1", abuse)
	}
	if failedInAbuse != 0 || registeredInAbuse != 0 {
		t.Errorf("during the abuse %d calls failed and agents registered %d times; want normal links unaffected", failedInAbuse, registeredInAbuse)
	}
}

// agentLogTimes returns the times of an agent's JSON log lines with msg.
func agentLogTimes(log, msg string) []time.Time {
	var out []time.Time
	for line := range strings.SplitSeq(log, "\n") {
		var l struct {
			Time time.Time
			Msg  string
		}
		if json.Unmarshal([]byte(line), &l) == nil && l.Msg == msg {
			out = append(out, l.Time)
		}
	}
	return out
}

// pingAbuse opens a plain JSON-RPC WebSocket to the hub and pings rate
// times a second until the hub closes it or limit passes. It returns when
// it started, when the hub closed it (zero if it did not) and why.
func pingAbuse(ws string, rate int, limit time.Duration) (started, closed time.Time, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), limit+5*time.Second)
	defer cancel()
	conn, _, err := websocket.DefaultDialer.DialContext(ctx, ws, nil)
	if err != nil {
		return time.Now(), time.Time{}, err
	}
	defer conn.Close()
	ended := make(chan error, 1)
	go func() {
		for {
			if _, _, err := conn.ReadMessage(); err != nil {
				ended <- err
				return
			}
		}
	}()
	started = time.Now()
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for {
		select {
		case err = <-ended:
			return started, time.Now(), err
		case <-tick.C:
			if time.Since(started) > limit {
				_ = conn.Close()
				<-ended
				return started, time.Time{}, fmt.Errorf("still open after %v", limit)
			}
			_ = conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(time.Second))
		}
	}
}
