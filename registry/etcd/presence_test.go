package etcd_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/agentmesh/agentmesh/registry"
	"github.com/agentmesh/agentmesh/registry/etcd"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
	"github.com/agentmesh/agentmesh/registry/registrytest"
)

func rawClient(t *testing.T, srv *etcdtest.Server) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// crashedHub writes, with a raw client, what a hub leaves in etcd when it
// is SIGKILLed: its presence key and one instance stamped with the hub's
// epoch, both under its session lease, which nobody keeps alive.
func crashedHub(t *testing.T, cli *clientv3.Client, prefix, hub, epoch, inst string, hubTTL int64) {
	t.Helper()
	ctx := context.Background()
	hl, err := cli.Grant(ctx, hubTTL)
	if err != nil {
		t.Fatal(err)
	}
	hv, _ := json.Marshal(map[string]any{"id": hub, "addr": "127.0.0.1:1", "epoch": epoch})
	iv, _ := json.Marshal(map[string]any{"agentId": inst, "name": "kv", "hub": hub, "capabilities": []string{"kv.*"},
		"heartbeatMs": 20000, "state": "ready", "hubEpoch": epoch})
	if _, err := cli.Put(ctx, prefix+"hubs/"+hub, string(hv), clientv3.WithLease(hl.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, prefix+"instances/"+inst, string(iv), clientv3.WithLease(hl.ID)); err != nil {
		t.Fatal(err)
	}
}

// TestDeadHubsAgentsLeaveAtHubTTL: when a hub dies, the others stop
// routing to its agents when the hub's session lease expires (seconds),
// and the methods answer as recently known (UNAVAILABLE), not unknown.
func TestDeadHubsAgentsLeaveAtHubTTL(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := rawClient(t, srv)
	b, err := etcd.New(etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: "/dead/", Hub: "hub-b"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	crashedHub(t, cli, "/dead/", "hub-a", "epoch-1", "agent-on-a", 1)
	start := time.Now()
	waitFor(t, "b to see the agent on a", 5*time.Second, func() bool { return b.Snapshot().Instance("agent-on-a") != nil })
	waitFor(t, "b to drop the dead hub's agent", 6*time.Second, func() bool { return b.Snapshot().Instance("agent-on-a") == nil })
	gone := time.Since(start)
	t.Logf("dead hub's agent left b's view %v after the hub's last keep-alive", gone.Round(time.Millisecond))
	if !b.Snapshot().Known("kv.get") {
		t.Error("kv.* should stay known for a while after its last instance left")
	}
	// The agent re-registers through hub b under the same id: routable again.
	reg := registrytest.Reg("agent-on-a", "kv.*")
	reg.Hub = "hub-b"
	reg.HeartbeatInterval = time.Second
	if _, err := b.Register(context.Background(), reg); err != nil {
		t.Fatal(err)
	}
	if in := b.Snapshot().Instance("agent-on-a"); in == nil || in.Hub != "hub-b" {
		t.Fatalf("re-registered agent: %+v", in)
	}
}

// TestRestartedHubEpoch: a hub restarted under the same id has a new
// epoch; the instances of its previous life are not routed to, even while
// their leases last, and those of the new life are.
func TestRestartedHubEpoch(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := rawClient(t, srv)
	crashedHub(t, cli, "/epoch/", "hub-a", "old-life", "old-agent", 30)
	c, err := etcd.New(etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: "/epoch/", Hub: "hub-c"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitFor(t, "c to see the old agent", 5*time.Second, func() bool { return c.Snapshot().Instance("old-agent") != nil })
	// hub-a comes back (new process, same id).
	a, err := etcd.New(etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: "/epoch/", Hub: "hub-a"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	reg := registrytest.Reg("new-agent", "kv.*")
	reg.Hub = "hub-a"
	if _, err := a.Register(context.Background(), reg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "c to see the new life and drop the old", 5*time.Second, func() bool {
		s := c.Snapshot()
		return s.Instance("new-agent") != nil && s.Instance("old-agent") == nil
	})
	if a.Snapshot().Instance("old-agent") != nil {
		t.Error("the restarted hub routes to an agent of its previous life")
	}
	waitFor(t, "a ready (synced, presence up)", 5*time.Second, a.Synced)
}

// TestHubCloseWithdrawsPresence: a hub that shuts down cleanly revokes
// its presence, and its agents leave the other hubs' views at once.
func TestHubCloseWithdrawsPresence(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := rawClient(t, srv)
	a, _ := etcd.New(etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: "/close/", Hub: "hub-a"}, nil)
	b, _ := etcd.New(etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: "/close/", Hub: "hub-b"}, nil)
	defer b.Close()
	waitFor(t, "a's presence", 5*time.Second, func() bool {
		res, err := cli.Get(context.Background(), "/close/hubs/hub-a")
		return err == nil && len(res.Kvs) == 1
	})
	_ = a.Close()
	res, err := cli.Get(context.Background(), "/close/hubs/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range res.Kvs {
		if strings.HasSuffix(string(kv.Key), "hub-a") {
			t.Errorf("hub-a's presence is still in etcd after Close")
		}
	}
}

type traced struct {
	kind string
	rev  int64
	key  string
}

type tracer struct {
	mu  sync.Mutex
	evs []traced
}

func (tr *tracer) record(kind string, rev int64, key string) {
	tr.mu.Lock()
	tr.evs = append(tr.evs, traced{kind, rev, key})
	tr.mu.Unlock()
}

func (tr *tracer) snapshot() []traced {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return slices.Clone(tr.evs)
}

// TestWatchGuaranteesUnderChurn is S17's registry half, against a real
// etcd: three hubs' registries, 50 agents registering and deregistering
// at random, one hub restarted and etcd frozen for a moment in the middle.
// Every registry must apply etcd's history in revision order, with no gap
// and no duplicate between two lists, never going back in revision; and
// 1 s after the churn stops all three views equal etcd's content.
func TestWatchGuaranteesUnderChurn(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := rawClient(t, srv)
	const prefix = "/churn/"
	churn := 8 * time.Second
	if testing.Short() {
		churn = 4 * time.Second
	}
	tracers := make([]*tracer, 4) // 3 hubs + the restarted life of hub 0
	open := func(i, slot int) *etcd.Registry {
		tracers[slot] = &tracer{}
		r, err := etcd.New(etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: prefix, Hub: fmt.Sprintf("hub-%d", i),
			OpTimeout: time.Second, Trace: tracers[slot].record}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	var regMu sync.Mutex
	regs := []*etcd.Registry{open(0, 0), open(1, 1), open(2, 2)}
	defer func() {
		for _, r := range regs {
			_ = r.Close()
		}
	}()
	hubOf := func(i int) *etcd.Registry {
		regMu.Lock()
		defer regMu.Unlock()
		return regs[i]
	}
	for i := range 3 {
		waitFor(t, "hubs ready", 5*time.Second, hubOf(i).Synced)
	}

	ctx, cancel := context.WithTimeout(context.Background(), churn)
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { // the faults: restart hub 0, freeze etcd
		time.Sleep(churn / 3)
		regMu.Lock()
		_ = regs[0].Close()
		regs[0] = open(0, 3)
		regMu.Unlock()
		time.Sleep(churn / 3)
		srv.Pause()
		time.Sleep(1500 * time.Millisecond)
		srv.Resume()
	})
	var events int
	tick := time.NewTicker(25 * time.Millisecond) // 40 events/s
	where := map[string]int{}                     // agent → hub index it is registered on
	rng := rand.New(rand.NewPCG(1, 2))
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-tick.C:
		}
		id := fmt.Sprintf("agent-%02d", rng.IntN(50))
		hub, on := where[id]
		opCtx, opCancel := context.WithTimeout(ctx, time.Second)
		if on {
			// Failed or not, the hub forgets the agent (a failed delete is
			// retried in the background; a restarted hub's session took
			// its agents with it).
			_ = hubOf(hub).Deregister(opCtx, id)
			delete(where, id)
		} else {
			h := rng.IntN(3)
			reg := registrytest.Reg(id, "churn.*")
			reg.Hub = fmt.Sprintf("hub-%d", h)
			reg.HeartbeatInterval = time.Minute
			if _, err := hubOf(h).Register(opCtx, reg); err == nil {
				where[id] = h
			}
		}
		opCancel()
		events++
	}
	tick.Stop()
	wg.Wait()
	// An operation cut by the etcd freeze may or may not have reached etcd;
	// etcd itself is the truth from here on.
	etcdView := func() map[string]bool {
		res, err := cli.Get(context.Background(), prefix+"instances/", clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]bool{}
		for _, kv := range res.Kvs {
			want[strings.TrimPrefix(string(kv.Key), prefix+"instances/")] = true
		}
		return want
	}
	diff := func(want map[string]bool) string {
		var out []string
		for i := range 3 {
			s := hubOf(i).Snapshot()
			for id := range want {
				if s.Instance(id) == nil {
					out = append(out, fmt.Sprintf("hub %d misses %s", i, id))
				}
			}
			for _, in := range s.Instances() {
				if !want[in.InstanceID] {
					out = append(out, fmt.Sprintf("hub %d has %s (on %s), not in etcd", i, in.InstanceID, in.Hub))
				}
			}
		}
		return strings.Join(out, "; ")
	}
	converged := time.Now()
	var want map[string]bool
	deadline := converged.Add(5 * time.Second)
	for {
		want = etcdView()
		d := diff(want)
		if d == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("views differ from etcd's content 5 s after the churn: %s", d)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("%d churn events; %d instances left; views equal etcd's %v after the churn stopped",
		events, len(want), time.Since(converged).Round(time.Millisecond))
	if d := time.Since(converged); d > time.Second {
		t.Errorf("views converged %v after the churn stopped; S17 asks ≤ 1 s", d)
	}

	// etcd's own history of the prefix, to check each registry against.
	hist := history(t, cli, prefix)
	for slot, tr := range tracers {
		checkTrace(t, fmt.Sprintf("registry %d", slot), tr.snapshot(), hist)
	}
}

// history replays every event under prefix from revision 1 (the test's
// etcd never compacts, and only this test writes to it, so the last event
// is at the head revision).
func history(t *testing.T, cli *clientv3.Client, prefix string) []traced {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	head, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	var out []traced
	for wr := range cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(1)) {
		if err := wr.Err(); err != nil {
			t.Fatal(err)
		}
		for _, ev := range wr.Events {
			kind := "put"
			if ev.Type == clientv3.EventTypeDelete {
				kind = "delete"
			}
			out = append(out, traced{kind, ev.Kv.ModRevision, string(ev.Kv.Key)})
		}
		if len(out) > 0 && out[len(out)-1].rev >= head.Header.Revision {
			break
		}
	}
	return out
}

// checkTrace: between two lists, the events a registry applied are
// exactly etcd's history after the first list's revision, in order, as a
// prefix (the watch may end early); revisions never go back.
func checkTrace(t *testing.T, name string, tr, hist []traced) {
	t.Helper()
	var last int64
	var seg []traced
	var listRev int64 = -1
	flush := func() {
		if listRev < 0 {
			return
		}
		i := firstAfter(hist, listRev)
		for j, ev := range seg {
			if i+j >= len(hist) || hist[i+j] != ev {
				t.Errorf("%s: after the list at rev %d, event %d is %+v; etcd's history has %+v", name, listRev, j, ev, at(hist, i+j))
				return
			}
		}
	}
	lists := 0
	for _, ev := range tr {
		if ev.rev < last {
			t.Errorf("%s: went back in revision: %+v after %d", name, ev, last)
		}
		if ev.kind == "put" || ev.kind == "delete" {
			if ev.rev == last && len(seg) > 0 && seg[len(seg)-1] == ev {
				t.Errorf("%s: duplicate event %+v", name, ev)
			}
		}
		last = max(last, ev.rev)
		if ev.kind == "list" {
			flush()
			seg, listRev = nil, ev.rev
			lists++
			continue
		}
		seg = append(seg, ev)
	}
	flush()
	t.Logf("%s: %d lists, %d events applied, last revision %d", name, lists, len(tr)-lists, last)
}

// firstAfter returns the index of the first history event after rev.
func firstAfter(h []traced, rev int64) int {
	i, _ := slices.BinarySearchFunc(h, rev+1, func(e traced, r int64) int { return int(e.rev - r) })
	return i
}

func at(h []traced, i int) any {
	if i < len(h) {
		return h[i]
	}
	return "nothing"
}

// TestManyAgentsOneSession is S18 (d), short: 500 agents on one hub,
// heartbeating at their interval for a while: none expires, and etcd sees
// one keep-alive stream per hub (a renewal every TTL/3), not one per
// agent: heartbeats stay on the hub.
func TestManyAgentsOneSession(t *testing.T) {
	srv := etcdtest.Start(t)
	a, _ := etcd.New(etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: "/many/", Hub: "hub-a"}, nil)
	defer a.Close()
	b, _ := etcd.New(etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: "/many/", Hub: "hub-b"}, nil)
	defer b.Close()
	const n = 500
	iv := 500 * time.Millisecond
	run := 9 * time.Second
	if testing.Short() {
		run = 6 * time.Second
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	beats, fails := 0, 0
	for i := range n {
		reg := registrytest.Reg(fmt.Sprintf("agent-%03d", i), "many.*")
		reg.Hub, reg.HeartbeatInterval = "hub-a", iv
		if _, err := a.Register(context.Background(), reg); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { // the agent's heartbeats, from its registration on
			tk := time.NewTicker(iv)
			defer tk.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tk.C:
				}
				err := a.Heartbeat(ctx, reg.InstanceID, registry.Beat{})
				mu.Lock()
				beats++
				if err != nil && ctx.Err() == nil {
					fails++
				}
				mu.Unlock()
			}
		})
	}
	waitFor(t, "b to see all", 10*time.Second, func() bool { return len(b.Snapshot().Instances()) == n })
	before := renewed(t, srv)
	end := time.Now().Add(run)
	lowest := n
	for time.Now().Before(end) {
		lowest = min(lowest, len(b.Snapshot().Instances()))
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	wg.Wait()
	renewals := renewed(t, srv) - before
	// Two hubs, each renewing its session every TTL/3 = 1 s.
	ceiling := int64(2 * (run.Seconds() + 2))
	t.Logf("%d agents for %v: %d heartbeats, %d failed; etcd renewed %d leases (ceiling for 2 sessions: %d); fewest visible on the other hub: %d",
		n, run, beats, fails, renewals, ceiling, lowest)
	if fails > 0 || lowest != n {
		t.Errorf("agents were lost: %d failed heartbeats, only %d of %d visible at one point", fails, lowest, n)
	}
	if renewals > ceiling || renewals == 0 {
		t.Errorf("etcd renewed %d leases; two hub sessions should take about %d", renewals, ceiling)
	}
	// A silent agent leaves both views after three intervals.
	start := time.Now()
	waitFor(t, "silent agents to expire everywhere", 5*time.Second, func() bool { return len(b.Snapshot().Instances()) == 0 })
	t.Logf("all %d silent agents left the other hub's view %v after the last heartbeat (3 intervals = %v)", n, time.Since(start).Round(time.Millisecond), 3*iv)
}

// renewed reads etcd's lease renewal counter from its /metrics.
func renewed(t *testing.T, srv *etcdtest.Server) int64 {
	t.Helper()
	res, err := http.Get(srv.Endpoint + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "etcd_debugging_lease_renewed_total "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return int64(f)
		}
	}
	t.Fatal("etcd_debugging_lease_renewed_total not in etcd's /metrics")
	return 0
}

// TestSetHubNewAddressSameID: a registry made with its hub's id but not
// its address (before the hub listened) may have its session, and the
// presence, written before hub.New tells it the address (SetHub with the
// same id): the presence is rewritten with the address. (A transaction
// that deleted and put the one key was refused by etcd: "duplicate key
// given in txn request", a hub failing to start now and then.)
func TestSetHubNewAddressSameID(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := rawClient(t, srv)
	r, err := etcd.New(etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: "/sethub/", Hub: "hub-X"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	presence := func() map[string]any {
		res, err := cli.Get(t.Context(), "/sethub/hubs/hub-X")
		if err != nil || len(res.Kvs) == 0 {
			return nil
		}
		var v map[string]any
		_ = json.Unmarshal(res.Kvs[0].Value, &v)
		return v
	}
	deadline := time.Now().Add(10 * time.Second)
	for presence() == nil { // the session is up
		if time.Now().After(deadline) {
			t.Fatal("no presence of hub-X within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := r.SetHub("hub-X", "127.0.0.1:4567"); err != nil {
		t.Fatalf("SetHub with the same id and an address: %v", err)
	}
	if p := presence(); p == nil || p["addr"] != "127.0.0.1:4567" {
		t.Fatalf("presence after SetHub: %v; want addr 127.0.0.1:4567", p)
	}
}
