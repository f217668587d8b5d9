package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/faultproxy"
	"github.com/agentmesh/agentmesh/internal/scenario"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
)

// s17Params are the sizes and times of one S17 variant.
type s17Params struct {
	name      string
	agents    int           // agent ids that churn
	events    float64       // churn events (a registration or a deregistration) per second
	rate      float64       // load, req/s
	churn     time.Duration // how long the churn and the load last
	restartAt time.Duration // hub B is killed and started again (since the churn started)
	cutAt     time.Duration // hub A loses etcd for s17Cut
}

// s17FailOnRefused makes requests served over a registration the hub
// refused fail the test (criterion 3). This test found the defect it
// guards: a hub bound an agent's link before its registry accepted the
// registration, and routed an instance to a local binding whatever hub
// its registry entry named. Hub A, cut from etcd, still listed an agent
// that deregistered on B or C (it missed the delete); when that agent
// registered again on A, A sent it the calls meant for the stale entry
// over the new link, although A then refused the registration
// (UNAVAILABLE: no etcd). Seen in 10 of 16 short runs, 3 to 25 calls
// each, and in both full runs (1 and 16 calls). hub.Hub.attempt now
// routes to a binding only once it is ready, or when the entry names
// this hub.
const s17FailOnRefused = true

const (
	s17Cut       = 3 * time.Second // hub A's etcd connection dropped this long
	s17Linger    = 3 * time.Second // a deregistered life's link stays open this long, to catch late requests
	s17LateBound = time.Second     // no request later than this after a deregistration's answer
	s17Prefix    = "/s17/"
	s17Method    = "churn.echo"
)

// s17Config is the hubs' policy file: churn.echo is idempotent, retried
// twice (on another instance) with short backoffs.
const s17Config = `policies:
  "churn.*": { timeout: 3s, retries: 2, idempotent: true, backoff: { strategy: exponential, initial: 10ms, max: 50ms } }
`

// s17Life is one registration of a churning agent: its own link (a new
// WebSocket per registration, as an agent process that starts again),
// from agent.register to the answer of agent.deregister, the link's loss
// or the hub expiring it. Fields are guarded by s17World.mu.
type s17Life struct {
	n       int
	agent   string
	hub     string // A, B or C
	regSent time.Time
	regAck  time.Time // zero: the registration failed
	end     time.Time // zero while registered
	how     string    // how it ended: deregistered, deregister failed CODE, register failed CODE, link lost, expired
	link    *link.Link
	stop    chan struct{} // closed to make the life deregister
	done    chan struct{} // closed when the life's goroutine returned
}

// s17Exec is one request a life served: the load's call number, the
// request id and when its handler started.
type s17Exec struct {
	life int
	i    int // -1: params not the load's
	id   string
	at   time.Time
}

// s17Agent is a churning agent id: off, or on through its current life.
type s17Agent struct {
	id   string
	busy bool     // an operation on it is under way
	life *s17Life // the current life, nil when off
}

// s17World is the test's record of the churn: every life and every
// execution, and when each load call was sent.
type s17World struct {
	hubWS map[string]string

	mu     sync.Mutex
	lives  []*s17Life
	execs  []s17Exec
	starts map[int]time.Time // load call i → when the client sent it
	errs   map[int]string    // load call i → its error, if it failed
	ops    map[string]int    // churn operations by outcome
}

func s17Call(ctx context.Context, l *link.Link, method string, params, result any, timeout time.Duration) error {
	raw, err := json.Marshal(params)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	res, err := l.Call(ctx, &envelope.Request{ID: envelope.NewID(), Method: method, Params: raw,
		Timestamp: time.Now().UnixMilli(), Version: envelope.Version})
	if err != nil {
		return err
	}
	if result == nil {
		return nil
	}
	return json.Unmarshal(res.Result, result)
}

func (w *s17World) count(op string) {
	w.mu.Lock()
	w.ops[op]++
	w.mu.Unlock()
}

// handler serves churn.echo on life n: it records the execution, then
// answers the params.
func (w *s17World) handler(n int, agent string) envelope.Invoker {
	return func(_ context.Context, req *envelope.Request) (*envelope.Response, error) {
		at := time.Now()
		if req.Method != s17Method {
			return nil, envelope.Errorf(envelope.CodeMethodNotFound, "%s serves %s only", agent, s17Method)
		}
		var p struct {
			I *int `json:"i"`
		}
		i := -1
		if json.Unmarshal(req.Params, &p) == nil && p.I != nil {
			i = *p.I
		}
		w.mu.Lock()
		w.execs = append(w.execs, s17Exec{life: n, i: i, id: req.ID, at: at})
		w.mu.Unlock()
		return &envelope.Response{ID: req.ID, Origin: agent, Timestamp: time.Now().UnixMilli(), Result: req.Params}, nil
	}
}

// endLife records the end of a life (once).
func (w *s17World) endLife(l *s17Life, how string) {
	w.mu.Lock()
	if l.end.IsZero() {
		l.end, l.how = time.Now(), how
	}
	w.mu.Unlock()
}

// register starts a life of a on hub: dial, agent.register, then
// heartbeats until stopped. It returns the life once the registration is
// answered, nil if it failed.
func (w *s17World) register(a *s17Agent, hub string) *s17Life {
	w.mu.Lock()
	l := &s17Life{n: len(w.lives), agent: a.id, hub: hub, stop: make(chan struct{}), done: make(chan struct{})}
	w.lives = append(w.lives, l)
	w.mu.Unlock()
	fail := func(what string, err error) *s17Life {
		w.endLife(l, what+" "+envelope.CodeOf(err).String())
		w.count("register failed (" + what + " " + envelope.CodeOf(err).String() + ")")
		close(l.done)
		return nil
	}
	dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	link, err := link.Dial(dctx, w.hubWS[hub], link.Config{}, link.WithHandler(w.handler(l.n, a.id)))
	cancel()
	if err != nil {
		return fail("dial failed", err)
	}
	w.mu.Lock()
	l.link, l.regSent = link, time.Now()
	w.mu.Unlock()
	var res control.RegisterResult
	// 10 s: longer than the hub's registry operations (3 s), so that the
	// hub answers, success or failure, before the agent gives up.
	err = s17Call(context.Background(), link, "agent.register", control.RegisterParams{
		AgentID: a.id, Name: "churn", Capabilities: []string{s17Method}, Intents: []string{"serve"},
	}, &res, 10*time.Second)
	if err == nil && !res.Accepted {
		err = envelope.NewError(envelope.CodeInternal, "registration not accepted")
	}
	if err != nil {
		link.Close()
		return fail("register failed", err)
	}
	w.mu.Lock()
	l.regAck = time.Now()
	w.mu.Unlock()
	w.count("registered")
	iv := time.Duration(res.HeartbeatInterval * float64(time.Second))
	go w.live(l, iv)
	return l
}

// live heartbeats a life until it is told to deregister, its link is
// lost or the hub expired it.
func (w *s17World) live(l *s17Life, iv time.Duration) {
	defer close(l.done)
	tick := time.NewTicker(iv)
	defer tick.Stop()
	for {
		select {
		case <-l.link.Done():
			w.endLife(l, "link lost")
			return
		case <-l.stop:
			err := s17Call(context.Background(), l.link, "agent.deregister",
				control.DeregisterParams{AgentID: l.agent, Reason: "churn"}, nil, 10*time.Second)
			how := "deregistered"
			if err != nil {
				how = "deregister failed " + envelope.CodeOf(err).String()
			}
			w.endLife(l, how)
			w.count(how)
			time.AfterFunc(s17Linger, l.link.Close) // late requests would still reach it meanwhile
			return
		case <-tick.C:
			err := s17Call(context.Background(), l.link, "agent.heartbeat", control.HeartbeatParams{
				AgentID: l.agent, Status: control.AgentStatus{State: "ready", LastActivity: time.Now().UnixMilli()},
			}, nil, iv)
			if envelope.CodeOf(err) == envelope.CodeAgentNotFound {
				w.endLife(l, "expired")
				w.count("expired by the hub")
				l.link.Close()
				return
			}
		}
	}
}

// deregister ends a's current life (if it is still on).
func (w *s17World) deregister(l *s17Life) {
	close(l.stop)
	<-l.done
}

// invoker records when load call i was sent.
func (w *s17World) invoker(i int, inv envelope.Invoker) envelope.Invoker {
	return func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
		w.mu.Lock()
		w.starts[i] = time.Now()
		w.mu.Unlock()
		res, err := inv(ctx, req)
		if err != nil {
			e := envelope.AsError(err)
			w.mu.Lock()
			w.errs[i] = fmt.Sprintf("%s (not sent %v, at %s): %v", e.Code, e.NotSent(), time.Now().Format("15:04:05.000"), err)
			w.mu.Unlock()
		}
		return res, err
	}
}

// s17EtcdTable is etcd's content under the prefix: instance id → hub.
func s17EtcdTable(ctx context.Context, cli *clientv3.Client) (map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	res, err := cli.Get(ctx, s17Prefix+"instances/", clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, kv := range res.Kvs {
		var rec struct {
			Hub string `json:"hub"`
		}
		_ = json.Unmarshal(kv.Value, &rec)
		out[strings.TrimPrefix(string(kv.Key), s17Prefix+"instances/")] = rec.Hub
	}
	return out, nil
}

// s17Diff describes how got (named name) differs from want (named
// wantName), both instance id → hub; "" if they are equal.
func s17Diff(name string, got map[string]string, wantName string, want map[string]string) string {
	var out []string
	for id, h := range want {
		if g, ok := got[id]; !ok {
			out = append(out, fmt.Sprintf("%s misses %s@%s", name, id, h))
		} else if g != h {
			out = append(out, fmt.Sprintf("%s has %s@%s, %s @%s", name, id, g, wantName, h))
		}
	}
	for id, h := range got {
		if _, ok := want[id]; !ok {
			out = append(out, fmt.Sprintf("%s has %s@%s, not in %s", name, id, h, wantName))
		}
	}
	sort.Strings(out)
	return strings.Join(out, "; ")
}

// TestS17RegistryChurn is scenario S17 end to end: three meshd hubs on a
// real etcd; hub A reaches etcd through a fault proxy. Churning agents
// (in the test process, one WebSocket link per registration, speaking
// agent.register / agent.heartbeat / agent.deregister as an agent does)
// register on a random hub and deregister at random, while clients on the
// three hubs (each given every hub, its own first) call churn.echo, served
// only by the churning agents. At 1/3 of the run hub B is killed (SIGKILL)
// and started again on the same address; at 2/3 hub A's etcd connections
// are reset and its etcd traffic blackholed for 3 s (longer than its 2 s
// session TTL: its agents leave etcd and come back after the heal).
//
// Full variant (S17 as written): 50 agents, 10 events/s, 60 s, 200 req/s,
// restart at 20 s, cut at 40 s. Short (-short): 20 agents, 10 events/s,
// 18 s, 100 req/s, restart at 6 s, cut at 12 s.
//
// Pass, each measured and printed:
//  1. 1 s after the churn stopped (the last operation answered), every
//     hub's routing table (mesh.agents: instance id and hub) equals etcd's
//     content under the prefix, and etcd's content is exactly the agents
//     the test holds registered;
//  2. no life (registration) serves a request later than 1 s after its
//     deregistration was answered (or its link was lost, or the hub
//     expired it); a deregistered life's link stays open 3 s to catch them;
//  3. every request served was routed to a life registered at routing
//     time: the life's registration was sent before it arrived, and the
//     client sent it before the life's deregistration was answered (the
//     hub answers agent.register after etcd stored the key, and
//     agent.deregister after etcd deleted it, so these intervals bound
//     etcd's). Requests served over a registration the hub refused are
//     counted and logged but fail the test only with s17FailOnRefused
//     (a known defect, see there); those served between a registration's
//     sending and its answer are counted (they may have been routed
//     before etcd stored the key, which the test cannot tell);
//  4. lost = 0, misdelivered = 0, every failed call carries a code of
//     the table. Phantom executions (a call answered "not sent" that an
//     agent executed) are counted and logged, not failed: once, on a
//     machine at load 7.6, 3 of 1800 were (cause not established;
//     probably the hub's retry loop, which answers with its last
//     attempt's error, "not sent" even when an earlier attempt reached
//     an agent);
//
// and the faults took effect: hub A logged etcd as unreachable. No hub
// logged "a list went back in revision" (its re-list after a reconnect
// returned an older revision than it had applied).
//
// Not checked here: the order, no-gap and no-duplicate guarantees of the
// watch events each hub applies. meshd exposes no revision it applies (no
// metric, builtin or log line per event; etcd.Config.Trace is not wired to
// a flag), so they are checked at the registry level only (registry/etcd
// TestWatchGuaranteesUnderChurn, which also restarts a registry and
// pauses etcd).
func TestS17RegistryChurn(t *testing.T) {
	p := s17Params{name: "S17", agents: 50, events: 10, rate: 200, churn: 60 * time.Second,
		restartAt: 20 * time.Second, cutAt: 40 * time.Second}
	if testing.Short() {
		p = s17Params{name: "S17-short", agents: 20, events: 10, rate: 100, churn: 18 * time.Second,
			restartAt: 6 * time.Second, cutAt: 12 * time.Second}
	} else {
		procLimit = 4 * time.Minute
		t.Cleanup(func() { procLimit = 2 * time.Minute })
	}
	began := time.Now()
	srv := etcdtest.Start(t)
	proxy, err := faultproxy.New(t.Context(), strings.TrimPrefix(srv.Endpoint, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()

	cfg := writeFile(t, "mesh.yaml", s17Config)
	names := []string{"A", "B", "C"}
	addrs := map[string]string{}
	for i, a := range freeAddrs(t, 3) {
		addrs[names[i]] = a
	}
	args := func(n string) []string {
		ep := srv.Endpoint
		if n == "A" {
			ep = "http://" + proxy.Addr()
		}
		return []string{"--id", "hub-" + n, "--heartbeat", "1s", "--hub-ttl", "2s", "--drain-timeout", "1s",
			"--registry", "etcd", "--etcd-endpoints", ep, "--etcd-prefix", s17Prefix, "--config", cfg}
	}
	var hubsMu sync.Mutex
	hubs := map[string]*proc{}
	var allHubs []*proc // every meshd process, the killed one too
	for _, n := range names {
		hubs[n] = hubAt(t, addrs[n], args(n)...).proc
		allHubs = append(allHubs, hubs[n])
	}
	// relaunch starts hub n again; it does not fail the test itself (it
	// runs on the fault goroutine).
	relaunch := func(n string) (*proc, error) {
		h := start(t, "meshd", append([]string{"--listen", addrs[n]}, args(n)...)...)
		hc := &http.Client{Timeout: time.Second}
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if h.exitedYet() {
				return h, fmt.Errorf("meshd %s exited: %v\n%s", n, h.err, h.stderr.String())
			}
			if httpStatus(hc, "http://"+addrs[n]+"/readyz") == http.StatusOK {
				return h, nil
			}
		}
		return h, fmt.Errorf("meshd %s not ready within 10 s", n)
	}

	w := &s17World{hubWS: map[string]string{}, starts: map[int]time.Time{}, errs: map[int]string{}, ops: map[string]int{}}
	for _, n := range names {
		w.hubWS[n] = "ws://" + addrs[n] + "/ws"
	}
	agents := make([]*s17Agent, p.agents)
	for i := range agents {
		agents[i] = &s17Agent{id: fmt.Sprintf("churn-%02d", i)}
	}
	// Half the agents are on before the load starts.
	for i, a := range agents[:p.agents/2] {
		if a.life = w.register(a, names[i%3]); a.life == nil {
			w.mu.Lock()
			how := w.lives[len(w.lives)-1].how
			w.mu.Unlock()
			t.Fatalf("registering %s on hub %s: %s", a.id, names[i%3], how)
		}
	}
	// expected is the test's own view: agents on, with their hub.
	expected := func() map[string]string {
		w.mu.Lock()
		defer w.mu.Unlock()
		out := map[string]string{}
		for _, l := range w.lives {
			if !l.regAck.IsZero() && l.end.IsZero() {
				out[l.agent] = "hub-" + l.hub
			}
		}
		return out
	}
	// tables compares every hub's routing table with etcd's content.
	tables := func() (diff string, inEtcd map[string]string) {
		want, err := s17EtcdTable(context.Background(), cli)
		if err != nil {
			return "etcd: " + err.Error(), nil
		}
		var diffs []string
		for _, n := range names {
			got, err := agentHubs(context.Background(), "http://"+addrs[n])
			if err != nil { // once more: a table, not a slow answer, is what is checked
				got, err = agentHubs(context.Background(), "http://"+addrs[n])
			}
			if err != nil {
				diffs = append(diffs, fmt.Sprintf("hub %s: %v", n, err))
			} else if d := s17Diff("hub "+n, got, "etcd", want); d != "" {
				diffs = append(diffs, d)
			}
		}
		return strings.Join(diffs, "; "), want
	}
	waitFor(t, "every hub's table to equal etcd's, with the first agents", 15*time.Second, func() bool {
		d, want := tables()
		return d == "" && maps.Equal(want, expected())
	})

	clients := make([]*mesh.Client, 3)
	for k, n := range names {
		urls := []string{w.hubWS[n], w.hubWS[names[(k+1)%3]], w.hubWS[names[(k+2)%3]]}
		c, err := mesh.NewClient(urls, mesh.WithoutReliability(), mesh.WithWaitForReady())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients[k] = c
	}

	// The faults.
	type faultReport struct {
		err                              error
		killedAt, readyAt, cutAt, healAt time.Time
	}
	var fr faultReport
	churnStart := time.Now()
	faultDone := make(chan struct{})
	go func() {
		defer close(faultDone)
		time.Sleep(time.Until(churnStart.Add(p.restartAt)))
		hubsMu.Lock()
		b := hubs["B"]
		hubsMu.Unlock()
		fr.killedAt = time.Now()
		_ = b.cmd.Process.Kill()
		<-b.done
		nb, err := relaunch("B")
		hubsMu.Lock()
		hubs["B"] = nb
		allHubs = append(allHubs, nb)
		hubsMu.Unlock()
		if err != nil {
			fr.err = err
			return
		}
		fr.readyAt = time.Now()
		time.Sleep(time.Until(churnStart.Add(p.cutAt)))
		fr.cutAt = time.Now()
		proxy.Blackhole() // the connections A makes again hang too
		proxy.ResetAll()
		time.Sleep(s17Cut)
		proxy.Unblackhole()
		fr.healAt = time.Now()
	}()

	// The load.
	led := scenario.NewLedger()
	loadDone := make(chan int, 1)
	go func() {
		loadDone <- scenario.Drive(context.Background(), p.rate, p.churn, 1000, func(_ context.Context, i int, intended time.Time) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			led.Call(ctx, w.invoker(i, clients[i%3].Invoke), s17Method, true, i, intended)
		})
	}()

	// The churn: every 1/events s one idle agent, picked at random, goes
	// off if it is on, else on at a random hub.
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 17))
	var opsWG sync.WaitGroup
	events, skipped := 0, 0
	tick := time.NewTicker(time.Duration(float64(time.Second) / p.events))
	for time.Since(churnStart) < p.churn {
		<-tick.C
		var a *s17Agent
		w.mu.Lock()
		for _, k := range rng.Perm(len(agents)) {
			if !agents[k].busy {
				a = agents[k]
				a.busy = true
				break
			}
		}
		var on *s17Life
		if a != nil && a.life != nil && a.life.end.IsZero() {
			on = a.life
		}
		w.mu.Unlock()
		if a == nil {
			skipped++
			continue
		}
		events++
		hub := names[rng.IntN(3)]
		opsWG.Go(func() {
			var l *s17Life
			if on != nil {
				w.deregister(on)
			} else {
				l = w.register(a, hub)
			}
			w.mu.Lock()
			a.life, a.busy = l, false
			w.mu.Unlock()
		})
	}
	tick.Stop()
	opsWG.Wait()
	churnStopped := time.Now()
	w.mu.Lock()
	ops := maps.Clone(w.ops) // the churn's operations (not the final deregistrations)
	w.mu.Unlock()

	// (1) Convergence: poll until equal (the figure), and compare once at
	// exactly 1 s (the criterion).
	converged := time.Duration(-1)
	for time.Since(churnStopped) < s17LateBound-30*time.Millisecond {
		if d, _ := tables(); d == "" {
			converged = time.Since(churnStopped)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(time.Until(churnStopped.Add(s17LateBound)))
	diffAt1s, etcdAt1s := tables()
	expAt1s := expected()
	for converged < 0 && time.Since(churnStopped) < 10*time.Second {
		if d, _ := tables(); d == "" {
			converged = time.Since(churnStopped)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}

	sent := <-loadDone
	<-faultDone
	// Every agent still on deregisters; every link closes.
	for _, a := range agents {
		if a.life != nil {
			w.deregister(a.life)
		}
	}
	w.mu.Lock()
	for _, l := range w.lives {
		if l.link != nil {
			l.link.Close()
		}
	}
	w.mu.Unlock()
	if fr.err != nil {
		t.Fatal(fr.err)
	}

	// (2) and (3), from the lives and executions.
	w.mu.Lock()
	execs := slices.Clone(w.execs)
	lives := slices.Clone(w.lives)
	starts := maps.Clone(w.starts)
	errs := maps.Clone(w.errs)
	endAt := map[int]time.Time{}
	ended := map[string]int{}
	registered := 0
	for _, l := range lives {
		endAt[l.n] = l.end
		if !l.regAck.IsZero() {
			registered++
			ended[l.how]++
		}
	}
	w.mu.Unlock()
	var late, afterEnd, unregistered, refused, foreign []string
	var lateMax time.Duration
	early := 0 // served after the registration was sent, before its answer
	for _, e := range execs {
		led.Executed(e.id, 1)
		l := lives[e.life]
		st, known := starts[e.i]
		if !known {
			foreign = append(foreign, fmt.Sprintf("life %d (%s on %s) served %s, not a load call", l.n, l.agent, l.hub, e.id))
			continue
		}
		desc := func() string {
			prev := "none"
			for k := l.n - 1; k >= 0; k-- {
				if q := lives[k]; q.agent == l.agent {
					prev = fmt.Sprintf("life %d on %s, registered %s, ended %s: %s", q.n, q.hub,
						q.regAck.Format("15:04:05.000"), q.end.Format("15:04:05.000"), q.how)
					break
				}
			}
			return fmt.Sprintf("call %d on life %d (%s on %s, registration sent %s, answered %s, ended %s: %s; the agent's previous registration: %s): sent %s, served %s",
				e.i, l.n, l.agent, l.hub, l.regSent.Format("15:04:05.000"), l.regAck.Format("15:04:05.000"),
				l.end.Format("15:04:05.000"), l.how, prev, st.Format("15:04:05.000"), e.at.Format("15:04:05.000"))
		}
		end := endAt[l.n]
		if !end.IsZero() && e.at.After(end) {
			afterEnd = append(afterEnd, desc())
			lateMax = max(lateMax, e.at.Sub(end))
			if e.at.Sub(end) > s17LateBound {
				late = append(late, "served more than 1 s after its life ended: "+desc())
			}
		}
		switch {
		case l.regAck.IsZero():
			refused = append(refused, "served by a registration the hub refused: "+desc())
		case e.at.Before(l.regSent) || (!end.IsZero() && st.After(end)):
			unregistered = append(unregistered, "routed to a life not registered at routing time: "+desc())
		case e.at.Before(l.regAck):
			early++
		}
	}

	// What the hubs logged of their etcd registry: hub A noticed the cut,
	// and no hub's list after a reconnect went back in revision (the only
	// revision meshd reports).
	aLog := func(msg string) int { return countLog(hubs["A"], msg) }
	cutSeen := aLog("etcd registry: etcd unreachable")
	sessionsLost := aLog("etcd registry: session with etcd lost")
	relists, wentBack := 0, 0
	for _, h := range allHubs {
		relists += countLog(h, "etcd registry: etcd is back; listing again") + countLog(h, "etcd registry: watch ended; listing again")
		wentBack += countLog(h, "etcd registry: a list went back in revision")
	}

	s := led.Summarize(p.name, sent)
	badCodes := map[string]int{}
	for _, o := range led.Outcomes() {
		if o.Code != envelope.CodeOK && !slices.Contains(envelope.Codes(), o.Code) {
			badCodes[o.Code.String()]++
		}
	}
	type s17Figures struct {
		scenario.Summary
		Agents          int            `json:"agents"`
		EventsPerSecond float64        `json:"eventsPerSecond"`
		ChurnS          float64        `json:"churnS"`
		Events          int            `json:"events"`
		Lives           int            `json:"registrations"`
		Ops             map[string]int `json:"ops"`
		Ended           map[string]int `json:"ended"`
		Executions      int            `json:"executions"`
		ConvergedMs     float64        `json:"convergedMs"` // churn stop → every table equals etcd's (-1: not within 10 s)
		TablesAt1s      bool           `json:"tablesEqualAt1s"`
		LeftAt1s        int            `json:"instancesAt1s"`
		ServedAfterEnd  int            `json:"servedAfterDeregistration"`
		LateMaxMs       float64        `json:"latestAfterDeregistrationMs"`
		Late            int            `json:"servedOver1sAfterDeregistration"`
		Unregistered    int            `json:"servedUnregistered"`
		Refused         int            `json:"servedOnRefusedRegistration"` // known defect, see s17FailOnRefused
		Early           int            `json:"servedBeforeRegistrationAnswered"`
		RestartDownMs   float64        `json:"hubRestartDownMs"`
		CutSeen         int            `json:"cutHubEtcdUnreachable"`
		SessionsLost    int            `json:"cutHubSessionsLost"`
		Relists         int            `json:"relists"`
		ListWentBack    int            `json:"listsBackInRevision"`
		Seed            uint64         `json:"seed"`
	}
	fig := s17Figures{Summary: s, Agents: p.agents, EventsPerSecond: p.events, ChurnS: p.churn.Seconds(), Events: events,
		Lives: registered, Ops: ops, Ended: ended, Executions: len(execs), ConvergedMs: -1,
		TablesAt1s: diffAt1s == "", LeftAt1s: len(etcdAt1s), ServedAfterEnd: len(afterEnd), LateMaxMs: ms(lateMax),
		Late: len(late), Unregistered: len(unregistered) + len(foreign), Refused: len(refused), Early: early, RestartDownMs: ms(fr.readyAt.Sub(fr.killedAt)),
		CutSeen: cutSeen, SessionsLost: sessionsLost, Relists: relists, ListWentBack: wentBack, Seed: seed}
	if converged >= 0 {
		fig.ConvergedMs = ms(converged)
	}
	scenario.Emit(fig)

	var failed []call
	for _, o := range led.Outcomes() {
		if o.Code != envelope.CodeOK {
			failed = append(failed, call{Code: o.Code})
		}
	}
	t.Logf("S17: %d agents, %d churn events in %v (%d skipped: every agent busy), %d registrations; operations %v; registrations ended %v",
		p.agents, events, p.churn, skipped, registered, ops, ended)
	t.Logf("S17: hub B killed at %v and ready again %v later; hub A cut from etcd at %v for %v",
		fr.killedAt.Sub(churnStart).Round(time.Millisecond), fr.readyAt.Sub(fr.killedAt).Round(time.Millisecond),
		fr.cutAt.Sub(churnStart).Round(time.Millisecond), fr.healAt.Sub(fr.cutAt).Round(time.Millisecond))
	t.Logf("S17: hub A logged etcd unreachable %d times and lost its session %d times; the hubs listed etcd again %d times after a reconnect; lists that went back in revision: %d",
		cutSeen, sessionsLost, relists, wentBack)
	t.Logf("S17: tables equal etcd's %v after the churn stopped (-1: not within 10 s); at 1 s: equal %v, %d instances in etcd, the test holds %d on",
		converged.Round(time.Millisecond), diffAt1s == "", len(etcdAt1s), len(expAt1s))
	t.Logf("S17: %d calls, %d ok, failed %v, lost %d, misdelivered %d, phantom %d, p50 %.1f ms, p99 %.1f ms; %d executions, %d after their life's end (latest %v after), %d over 1 s after, %d on a life not registered at routing time, %d not load calls; %d served before their registration's answer, %d on a registration the hub refused",
		sent, s.Succeeded, byCode(failed), s.Lost, s.Misdelivered, s.Phantom, s.P50Ms, s.P99Ms,
		len(execs), len(afterEnd), lateMax.Round(time.Millisecond), len(late), len(unregistered), len(foreign), early, len(refused))
	t.Logf("S17: took %v in all", time.Since(began).Round(time.Millisecond))

	if diffAt1s != "" {
		t.Errorf("1 s after the churn stopped, the routing tables differ from etcd's content: %s", diffAt1s)
	}
	if d := s17Diff("etcd", etcdAt1s, "the test's view", expAt1s); diffAt1s == "" && d != "" {
		t.Errorf("1 s after the churn stopped, etcd's content is not the agents registered (the test's view): %s", d)
	}
	if !s17FailOnRefused {
		for k, d := range refused {
			if k == 3 {
				t.Logf("KNOWN DEFECT: ... and %d more", len(refused)-3)
				break
			}
			t.Logf("KNOWN DEFECT (not failed, see s17FailOnRefused): %s", d)
		}
		refused = nil
	}
	for _, l := range [][]string{late, unregistered, refused, foreign} {
		for k, d := range l {
			if k == 10 {
				t.Errorf("... and %d more", len(l)-10)
				break
			}
			t.Error(d)
		}
	}
	if s.Lost != 0 || s.Misdelivered != 0 {
		t.Errorf("lost %d, misdelivered %d; want 0", s.Lost, s.Misdelivered)
	}
	if s.Phantom != 0 {
		// Logged, not failed (S17's criteria do not include it): which
		// calls, their error and their executions.
		byID := map[string][]s17Exec{}
		for _, e := range execs {
			byID[e.id] = append(byID[e.id], e)
		}
		for _, o := range led.Outcomes() {
			if !o.NotSent || len(byID[o.ID]) == 0 {
				continue
			}
			var i int
			_, _ = fmt.Sscanf(o.Want, `{"i":%d}`, &i)
			var where []string
			for _, e := range byID[o.ID] {
				l := lives[e.life]
				where = append(where, fmt.Sprintf("life %d (%s on %s, ended %s: %s) at %s", l.n, l.agent, l.hub,
					l.end.Format("15:04:05.000"), l.how, e.at.Format("15:04:05.000")))
			}
			t.Logf("phantom: call %d sent %s, failed %s; executed by %s", i, starts[i].Format("15:04:05.000"), errs[i], strings.Join(where, ", "))
		}
	}
	if len(badCodes) > 0 {
		t.Errorf("failed calls without a code of the table: %v", badCodes)
	}
	if cutSeen == 0 {
		t.Error("hub A never logged etcd as unreachable: the cut did not reach it")
	}
	if wentBack > 0 {
		t.Errorf("%d \"a list went back in revision\" log lines", wentBack)
	}
	if len(execs) < sent/2 {
		t.Errorf("only %d executions for %d calls: the load hardly reached the churning agents", len(execs), sent)
	}
}
