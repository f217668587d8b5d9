//go:build faultlab

package e2e_test

// Tier-B variants of the scenarios (RELIABILITY.md §1.2): hubs, etcd and
// agent groups each in their own network namespace of an internal/netlab
// lab, faults injected by nftables in a namespace instead of a proxy in
// the path. Run as root with
//
//	go test -tags faultlab -count=1 -short -p 1 -run '^TestLab' ./e2e
//
// They skip with a message when the lab cannot be built (not root, no ip
// or nft, no namespaces).

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/netlab"
	"github.com/agentmesh/agentmesh/internal/scenario"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
)

// startIn runs bin (a path) with args in node's namespace, as start does
// on the host: output kept, SIGTERM then SIGKILL when the test ends.
func startIn(t *testing.T, node *netlab.Node, extraEnv []string, bin string, args ...string) *proc {
	t.Helper()
	name := filepath.Base(bin)
	p := &proc{name: name, stdout: &syncBuf{}, stderr: &syncBuf{}, done: make(chan struct{})}
	ctx, cancel := context.WithTimeout(t.Context(), procLimit)
	p.cmd = node.Command(ctx, bin, args...)
	p.cmd.Env = env(extraEnv...)
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	p.cmd.Cancel = func() error { return p.cmd.Process.Signal(syscall.SIGTERM) }
	p.cmd.WaitDelay = 5 * time.Second
	if err := p.cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start %s in %s: %v", name, node.NS, err)
	}
	go func() {
		defer cancel()
		err := p.cmd.Wait()
		p.err, p.exited = err, time.Now()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		p.stop(5 * time.Second)
		if t.Failed() {
			t.Logf("%s in %s %s stderr:\n%s", name, node.Name, strings.Join(args, " "), p.stderr.String())
		}
	})
	return p
}

// labHub runs meshd in node, listening on the node's address port 7000
// (--allow-remote, with the lab's key: metric presents adminToken), and
// waits until /readyz answers 200 from the host.
func labHub(t *testing.T, node *netlab.Node, au labAuth, args ...string) *hub {
	t.Helper()
	addr := net.JoinHostPort(node.IP, "7000")
	p := startIn(t, node, nil, filepath.Join(binDir, "meshd"), append([]string{"--listen", addr, "--allow-remote",
		"--auth-key", au.keyFile}, args...)...)
	h := &hub{proc: p, addr: addr, ws: "ws://" + addr + "/ws", base: "http://" + addr}
	client := &http.Client{Timeout: time.Second}
	waitFor(t, "meshd in "+node.Name+" ready", 15*time.Second, func() bool {
		if p.exitedYet() {
			t.Fatalf("meshd in %s exited early (%v):\n%s", node.Name, p.err, p.stderr.String())
		}
		return httpStatus(client, h.base+"/readyz") == http.StatusOK
	})
	return h
}

// labAgent runs `meshctl agent run kind --id id --hub h` in node, with
// the lab's token ($MESH_TOKEN).
func labAgent(t *testing.T, node *netlab.Node, h *hub, au labAuth, kind, id string, extra ...string) *proc {
	t.Helper()
	return startIn(t, node, []string{"MESH_TOKEN=" + au.token}, filepath.Join(binDir, "meshctl"),
		append([]string{"agent", "run", kind, "--id", id, "--hub", h.ws}, extra...)...)
}

// labEtcd runs a single etcd member in node and returns its client URL.
func labEtcd(t *testing.T, node *netlab.Node) string {
	t.Helper()
	bin := etcdtest.Binary(t) // fails in CI, skips elsewhere, without etcd
	client, peer := "http://"+node.IP+":2379", "http://"+node.IP+":2380"
	startIn(t, node, nil, bin, "--name", "lab", "--data-dir", t.TempDir(),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "lab="+peer, "--log-level", "error", "--logger", "zap")
	c := &http.Client{Timeout: time.Second}
	waitFor(t, "etcd in "+node.Name+" healthy", 15*time.Second, func() bool { return httpStatus(c, client+"/health") == http.StatusOK })
	return client
}

// labFault applies a fault, failing the test if nft refuses it.
func labFault(t *testing.T, what string, err error) {
	if err != nil {
		t.Errorf("%s: %v", what, err)
	}
}

// TestLabS07bPacketLoss is scenario S07 (b), tier B: three hubs (each its
// own namespace) on etcd (another), C's two echo agents in a namespace of
// their own; only cross-hub traffic: the test process calls hub A, which
// forwards to C over the peer link. nft drops 5 % of the packets at random
// (numgen) on C's interface, both directions, for 20 s. Load 300 req/s,
// timeout 2 s, retries 2 (idempotent, at the hub).
//
// Pass (RELIABILITY.md S07): during the loss success >= 99 % and p99 < 1 s;
// no call answered later than its deadline + 100 ms; lost 0, misdelivered 0.
//
// Short variant: 5 s healthy, 20 s of loss, 5 s after; full: 10 s, 20 s,
// 10 s (the loss lasts the scenario's 20 s in both).
func TestLabS07bPacketLoss(t *testing.T) {
	healthy, loss, after := 10*time.Second, 20*time.Second, 10*time.Second
	if testing.Short() {
		healthy, after = 5*time.Second, 5*time.Second
	}
	lab := netlab.New(t)
	lab.AddHost()
	au := newLabAuth(t)
	nodeE, nodeA, nodeB, nodeC, agC := lab.AddNode("etcd"), lab.AddNode("hubA"), lab.AddNode("hubB"), lab.AddNode("hubC"), lab.AddNode("agC")
	ep := labEtcd(t, nodeE)
	cfg := writeFile(t, "mesh.yaml", `policies:
  "echo.*": { timeout: 2s, retries: 2, idempotent: true, backoff: { strategy: exponential, initial: 10ms, max: 40ms } }
bulkhead: { maxConcurrent: 400, queueSize: 1000, queueTimeout: 30s }
`)
	common := []string{"--heartbeat", "500ms", "--registry", "etcd", "--etcd-endpoints", ep, "--etcd-prefix", "/lab-s07/", "--config", cfg}
	a := labHub(t, nodeA, au, append(common, "--id", "hub-A")...)
	labHub(t, nodeB, au, append(common, "--id", "hub-B")...)
	c := labHub(t, nodeC, au, append(common, "--id", "hub-C")...)
	for _, id := range []string{"echo-C1", "echo-C2"} {
		labAgent(t, agC, c, au, "echo", id)
	}
	cl, err := mesh.NewClient([]string{a.ws}, mesh.WithoutReliability(), mesh.WithWaitForReady(), mesh.WithToken(au.token))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	waitFor(t, "hub A to route to C's agents", 15*time.Second, func() bool {
		ids, _ := agentsOf(t.Context(), cl)
		return len(ids) == 2 && cl.Call(t.Context(), "echo.echo", 1, nil) == nil
	})

	var lossAt, lossEnd time.Time
	var dropped int64
	faults := make(chan struct{})
	go func() {
		defer close(faults)
		time.Sleep(healthy)
		labFault(t, "5% loss on C", nodeC.Loss(5))
		lossAt = time.Now()
		time.Sleep(loss)
		dropped, _ = nodeC.Dropped()
		lossEnd = time.Now()
		labFault(t, "heal C", nodeC.Heal())
	}()
	led := scenario.NewLedger()
	var cs calls
	sent := scenario.Drive(context.Background(), 300, healthy+loss+after, 2000, func(ctx context.Context, i int, intended time.Time) {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		led.Call(ctx, cs.invoker("A", cl.Invoke, intended), "echo.echo", true, i, intended)
	})
	<-faults
	s := led.Summarize("S07b-lab-short", sent)
	if !testing.Short() {
		s.Scenario = "S07b-lab"
	}
	inLoss := cs.where(func(c call) bool { return !c.Intended.Before(lossAt) && c.Intended.Before(lossEnd) })
	okInLoss := len(cs.where(func(c call) bool {
		return !c.Intended.Before(lossAt) && c.Intended.Before(lossEnd) && c.Code == envelope.CodeOK
	}))
	healthyCalls := cs.where(func(c call) bool { return c.Intended.Before(lossAt) })
	late := cs.where(func(c call) bool { return c.End.Sub(c.Start) > 2100*time.Millisecond })
	rate := float64(okInLoss) / float64(max(len(inLoss), 1))
	line, _ := json.Marshal(struct {
		scenario.Summary
		LossCalls    int     `json:"lossCalls"`
		LossSuccess  float64 `json:"lossSuccessPct"`
		LossP99Ms    float64 `json:"lossP99Ms"`
		HealthyP99Ms float64 `json:"healthyP99Ms"`
		Dropped      int64   `json:"packetsDropped"`
		Late         int     `json:"answeredAfterDeadline"`
	}{s, len(inLoss), 100 * rate, ms(p99(inLoss)), ms(p99(healthyCalls)), dropped, len(late)})
	scenario.Emit(line)
	t.Logf("S07b lab: %d calls, %d ok, failed %v; healthy p99 %v; during 5%% loss (%d packets dropped on C): %d calls, %.2f%% ok, by code %v, p99 %v; %d answered after deadline + 100 ms",
		sent, s.Succeeded, s.Failed, p99(healthyCalls), dropped, len(inLoss), 100*rate, byCode(inLoss), p99(inLoss), len(late))

	if s.Lost != 0 || s.Misdelivered != 0 {
		t.Errorf("lost %d, misdelivered %d; want 0", s.Lost, s.Misdelivered)
	}
	if dropped == 0 {
		t.Error("nft dropped no packet on C: the fault did not happen")
	}
	if len(inLoss) == 0 || rate < 0.99 {
		t.Errorf("success during the loss %.2f%% of %d calls; want >= 99%%", 100*rate, len(inLoss))
	}
	if p := p99(inLoss); p >= time.Second {
		t.Errorf("p99 during the loss %v; want < 1 s", p)
	}
	if len(late) > 0 {
		t.Errorf("%d calls answered later than their deadline + 100 ms (first took %v)", len(late), late[0].End.Sub(late[0].Start))
	}
}

// TestLabS21aHalfOpenLink is scenario S21 (a), tier B: one hub in its
// namespace, four echo agents, echo-0 alone in a namespace and the other
// three in another; 100 calls/s from the test process (80 % echo.echo,
// idempotent; 20 % echo.sleep {ms:0}, not). nft in echo-0's namespace
// drops everything to and from the hub, both directions, closing nothing.
//
// Pass (RELIABILITY.md S21 a): the hub declares the link dead within 12 s
// for 5 s pings (2 missed; the short variant scales to 1 s pings and
// 2.4 s, as the tier-A test does) and answers the calls pending on it
// then; the agent detects it too and, after the heal, is registered again
// within 5 s; lost 0, echo.echo >= 99.9 %.
//
// Short variant: 20 s of load, blackhole from 4 s for 6 s; full: pings
// 5 s, 60 s of load, blackhole from 10 s for 20 s.
func TestLabS21aHalfOpenLink(t *testing.T) {
	p := s21Params{name: "S21a-lab", ping: 5 * time.Second, heartbeat: 10 * time.Second, load: 60 * time.Second,
		holeAt: 10 * time.Second, hole: 20 * time.Second, deadBound: 12 * time.Second, redialIn: 5 * time.Second}
	if testing.Short() {
		p = s21Params{name: "S21a-lab-short", ping: time.Second, heartbeat: 2 * time.Second, load: 20 * time.Second,
			holeAt: 4 * time.Second, hole: 6 * time.Second, deadBound: 2400 * time.Millisecond, redialIn: 5 * time.Second}
	}
	lab := netlab.New(t)
	lab.AddHost()
	au := newLabAuth(t)
	nodeH, ag0, ags := lab.AddNode("hub"), lab.AddNode("ag0"), lab.AddNode("ags")
	cfg := writeFile(t, "mesh.yaml", `policies:
  "echo.echo": { timeout: 5s, retries: 2, idempotent: true, backoff: { strategy: exponential, initial: 10ms, max: 100ms, jitter: true } }
  "echo.sleep": { timeout: 5s, retries: 2, idempotent: false, backoff: { strategy: exponential, initial: 10ms, max: 100ms, jitter: true } }
`)
	h := labHub(t, nodeH, au, "--config", cfg, "--heartbeat", p.heartbeat.String(), "--link-ping", p.ping.String())
	var agents []*proc
	for i := range 4 {
		node := ags
		if i == 0 {
			node = ag0
		}
		agents = append(agents, labAgent(t, node, h, au, "echo", fmt.Sprintf("echo-%d", i), "--link-ping", p.ping.String()))
	}
	c, err := mesh.NewClient([]string{h.ws}, mesh.WithoutReliability(), mesh.WithToken(au.token))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitFor(t, "four agents", 15*time.Second, func() bool {
		var list []control.AgentInfo
		return c.Call(t.Context(), "mesh.agents", nil, &list) == nil && len(list) == 4
	})

	var holed, healed time.Time
	var dropped int64
	faults := make(chan struct{})
	loadStart := time.Now()
	led := scenario.NewLedger()
	var cs s02Calls
	pickRaw := func(r json.RawMessage) string { return string(r) }
	var probe sync.WaitGroup // the probe below, waited for with the faults
	go func() {
		defer close(faults)
		defer probe.Wait()
		time.Sleep(time.Until(loadStart.Add(p.holeAt)))
		labFault(t, "drop between echo-0 and the hub", ag0.Drop(nodeH))
		holed = time.Now() // the rules are in force by now
		// A call the test pins to echo-0 once its link is cut: it waits on
		// the dead link, in every run, whatever the balancer does.
		probe.Add(1)
		go func() {
			defer probe.Done()
			cs.doTo(context.Background(), led, c.Invoke, "echo-0", "echo.sleep", false, `{"ms":0}`, `{"slept":0}`, pickRaw, time.Now())
		}()
		time.Sleep(time.Until(holed.Add(p.hole)))
		dropped, _ = ag0.Dropped()
		healed = time.Now()
		labFault(t, "heal", ag0.Heal())
	}()
	sent := scenario.Drive(context.Background(), 100, p.load, 1000, func(ctx context.Context, i int, intended time.Time) {
		if rand.IntN(5) == 0 {
			cs.do(ctx, led, c.Invoke, "echo.sleep", false, `{"ms":0}`, `{"slept":0}`, pickRaw, intended)
			return
		}
		want := fmt.Sprintf(`{"i":%d}`, i)
		cs.do(ctx, led, c.Invoke, "echo.echo", true, want, want, pickRaw, intended)
	})
	<-faults
	s := led.Summarize(p.name, sent+1) // the probe too

	hubLog := h.stderr.String()
	dead := firstAfter(hubLogTimes(hubLog, "agent link lost; deregistered", "echo-0"), holed)
	expired := firstAfter(hubLogTimes(hubLog, "instance left the registry; closing its link", "echo-0"), holed)
	back := firstAfter(hubLogTimes(hubLog, "agent registered", "echo-0"), healed)
	agentLost := firstAfter(agentLogTimes(agents[0].stderr.String(), "hub link lost; reconnecting"), holed)
	var answeredAtDeath, answeredOff, echoOK, echoN int
	var worstGap time.Duration
	for _, x := range cs.list {
		if x.Method == "echo.echo" {
			echoN++
			if x.Code == envelope.CodeOK {
				echoOK++
			}
		}
		inHole := !x.Start.Before(holed) && !dead.IsZero() && x.Start.Before(dead)
		if inHole && ((x.Method == "echo.sleep" && x.Code == envelope.CodeUnavailable && !x.NotSent) ||
			(x.Method == "echo.echo" && x.Code == envelope.CodeOK && x.End.Sub(x.Start) > 300*time.Millisecond)) {
			answeredAtDeath++
			gap := x.End.Sub(dead)
			worstGap = max(worstGap, gap, -gap)
			if gap < -20*time.Millisecond || gap > 200*time.Millisecond {
				answeredOff++
			}
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
		HubDeadMs       int64   `json:"hubDeclaredDeadAfterHoleMs"`
		AgentDeadMs     int64   `json:"agentDetectedAfterHoleMs"`
		ReconnectMs     int64   `json:"reconnectedAfterHealMs"`
		AnsweredAtDeath int     `json:"answeredAtDeath"`
		WorstGapMs      float64 `json:"worstDeathGapMs"`
		Dropped         int64   `json:"packetsDropped"`
	}{s, since(dead, holed), since(agentLost, holed), since(back, healed), answeredAtDeath, ms(worstGap), dropped}
	b, _ := json.Marshal(summary)
	scenario.Emit(b)
	t.Logf("%s: %d calls, %d ok, failed %v; hub declared the link dead %d ms after the drop (bound %v), agent %d ms; %d calls answered then (worst %.0f ms off); agent back %d ms after the heal (bound %v); p99 %.1f ms",
		p.name, sent, s.Succeeded, s.Failed, summary.HubDeadMs, p.deadBound, summary.AgentDeadMs, answeredAtDeath, ms(worstGap),
		summary.ReconnectMs, p.redialIn, s.P99Ms)

	if s.Lost != 0 || s.Misdelivered != 0 {
		t.Errorf("lost %d, misdelivered %d; want 0", s.Lost, s.Misdelivered)
	}
	if rate := float64(echoOK) / float64(max(echoN, 1)); rate < 0.999 {
		t.Errorf("echo.echo success %.2f%% (%d/%d); want >= 99.9%%", 100*rate, echoOK, echoN)
	}
	switch {
	case dead.IsZero():
		t.Errorf("the hub never declared the dropped link dead (expired by heartbeat at %v)", expired)
	case !expired.IsZero() && expired.Before(dead):
		t.Errorf("echo-0 expired by heartbeat before its link was declared dead: the link's liveness was not what caught it")
	case dead.Sub(holed) > p.deadBound:
		t.Errorf("the hub declared the link dead %v after the drop; want within %v", dead.Sub(holed), p.deadBound)
	}
	switch {
	case agentLost.IsZero():
		t.Error("the agent never noticed its dropped link")
	case agentLost.After(healed):
		t.Errorf("the agent noticed its link was gone only %v after the heal", agentLost.Sub(healed))
	case agentLost.Sub(holed) > p.deadBound:
		t.Errorf("the agent noticed its dropped link %v after the drop; want within %v", agentLost.Sub(holed), p.deadBound)
	}
	switch {
	case back.IsZero():
		t.Error("echo-0 did not register again after the heal")
	case back.Sub(healed) > p.redialIn:
		t.Errorf("echo-0 registered again %v after the heal; want within %v", back.Sub(healed), p.redialIn)
	}
	if agents[0].exitedYet() {
		t.Errorf("echo-0 exited (%v); want it to redial", agents[0].err)
	}
	if dropped == 0 {
		t.Error("nft dropped no packet: the fault did not happen")
	}
	if answeredAtDeath == 0 {
		t.Error("no call was waiting on the dropped link when it died; the property was not exercised")
	}
	if answeredOff > 0 {
		t.Errorf("%d calls waiting on the dropped link were not answered when it was declared dead (worst %v off)", answeredOff, worstGap)
	}
}

// TestLabS05Partition is scenario S05, tier B, both variants: three hubs
// and etcd each in a namespace; m (echo.echo) served by two agents in A's
// agent namespace and two in C's, n (chaos.echo, 100 ms) by one in C's;
// clients (the test process) on A and B, 300 req/s. nft in C's namespace
// drops everything to and from A and B, both directions, without closing
// a socket; in variant (b) also to and from etcd, so that C's session
// lease expires and A and B drop C's agents from their tables.
//
// Pass: those of S05 (see s05Verdict): detection <= 3 s, in-flight calls
// to C answered UNAVAILABLE at detection, m >= 99 %, n UNAVAILABLE with
// p99 <= 50 ms after detection, peer links and routing tables = etcd's
// within 5 s of the heal, lost 0. In variant (b) C's session lease may
// expire before the peer links are found dead (hub TTL 2 s, peer links
// 2.5 s): A and B then drop C's agents and answer the calls pending on
// them UNAVAILABLE at that moment, which is as good; s05Verdict accepts
// those answers from the blackhole on.
//
// Short variant: 5 s healthy, 10 s partition (the scenario's is 20 s),
// 7 s after; full: 20 s, 20 s, 20 s.
func TestLabS05Partition(t *testing.T) {
	for _, v := range []struct {
		name     string
		loseEtcd bool
	}{{"a-C-keeps-etcd", false}, {"b-C-loses-etcd", true}} {
		t.Run(v.name, func(t *testing.T) { labS05(t, v.name[:1], v.loseEtcd) })
	}
}

func labS05(t *testing.T, variant string, loseEtcd bool) {
	healthy, partition, after := 20*time.Second, 20*time.Second, 20*time.Second
	if testing.Short() {
		healthy, partition, after = 5*time.Second, 10*time.Second, 7*time.Second
	}
	lab := netlab.New(t)
	lab.AddHost()
	au := newLabAuth(t)
	nodeE, nodeA, nodeB, nodeC := lab.AddNode("etcd"), lab.AddNode("hubA"), lab.AddNode("hubB"), lab.AddNode("hubC")
	agA, agC := lab.AddNode("agA"), lab.AddNode("agC")
	ep := labEtcd(t, nodeE)
	cfg := writeFile(t, "mesh.yaml", s05Config)
	prefix := "/lab-s05" + variant + "/"
	common := []string{"--heartbeat", "500ms", "--registry", "etcd", "--etcd-endpoints", ep, "--etcd-prefix", prefix, "--config", cfg}
	a := labHub(t, nodeA, au, append(common, "--id", "hub-A")...)
	b := labHub(t, nodeB, au, append(common, "--id", "hub-B")...)
	c := labHub(t, nodeC, au, append(common, "--id", "hub-C")...)
	labAgent(t, agA, a, au, "echo", "m-A1")
	labAgent(t, agA, a, au, "echo", "m-A2")
	labAgent(t, agC, c, au, "echo", "m-C1")
	labAgent(t, agC, c, au, "echo", "m-C2")
	labAgent(t, agC, c, au, "chaos", "n-C1", "--latency", "100ms")

	clients := map[string]*mesh.Client{}
	for name, h := range map[string]*hub{"A": a, "B": b} {
		cl, err := mesh.NewClient([]string{h.ws}, mesh.WithoutReliability(), mesh.WithWaitForReady(), mesh.WithToken(au.token))
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
	for _, name := range []string{"A", "B"} { // open the peer links to C
		for to, method := range map[string]string{"m-C1": "echo.echo", "n-C1": "chaos.echo"} {
			if err := clients[name].Call(t.Context(), method, 1, nil, mesh.To(to)); err != nil {
				t.Fatalf("%s via hub %s: %v", to, name, err)
			}
		}
	}
	peerLinks := map[string]float64{"A": metric(a.base, `agentmesh_links{kind="peer"}`), "B": metric(b.base, `agentmesh_links{kind="peer"}`)}
	if peerLinks["A"] < 1 || peerLinks["B"] < 1 {
		t.Fatalf("agentmesh_links{kind=\"peer\"} before the fault: %v; want >= 1 on A and B", peerLinks)
	}
	cut := []*netlab.Node{nodeA, nodeB}
	if loseEtcd {
		cut = append(cut, nodeE)
	}

	led := scenario.NewLedger()
	var cs calls
	var blackholeAt, healAt time.Time
	var dropped int64
	var nftTook time.Duration
	tablesAt := time.Duration(-1)
	faults := make(chan struct{})
	go func() {
		defer close(faults)
		time.Sleep(healthy)
		t0 := time.Now()
		labFault(t, "partition C", nodeC.Drop(cut...))
		blackholeAt = time.Now() // the rules are in force by now
		nftTook = blackholeAt.Sub(t0)
		time.Sleep(partition)
		dropped, _ = nodeC.Dropped()
		healAt = time.Now()
		labFault(t, "heal C", nodeC.Heal())
		for time.Since(healAt) < after {
			if tablesMatch(ep, prefix, a, b, c) {
				tablesAt = time.Since(healAt)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	sent := scenario.Drive(context.Background(), 300, healthy+partition+after, 2000, func(ctx context.Context, i int, intended time.Time) {
		name := []string{"A", "B"}[i%2]
		method := "echo.echo"
		if i%3 == 2 {
			method = "chaos.echo"
		}
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		led.Call(ctx, cs.invoker(name, clients[name].Invoke, intended), method, true, i, intended)
	})
	<-faults
	name := "S05" + variant + "-lab"
	if testing.Short() {
		name += "-short"
	}
	s := led.Summarize(name, sent)
	s.Print(os.Stdout)
	t.Logf("%s: nft dropped %d packets in C's namespace (cut from %d nodes); loading the rules took %v (the times below count from its end)",
		name, dropped, len(cut), nftTook)
	if dropped == 0 {
		t.Error("nft dropped no packet: the partition did not happen")
	}
	s05Verdict(t, s05Run{name: name, sent: sent, s: s, cs: &cs, a: a, b: b,
		blackholeAt: blackholeAt, healAt: healAt, tablesAt: tablesAt, peerLinks: peerLinks, leaseMayExpire: loseEtcd})
}
