package fleetsim

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/agentmesh/agentmesh/internal/faultproxy"
	"github.com/agentmesh/agentmesh/registry"
	"github.com/agentmesh/agentmesh/registry/etcd"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
)

// The grpc goroutines registry/etcd's own tests ignore too: they end
// shortly after a client's Close.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc.(*addrConn).resetTransportAndUnlock"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
}

const (
	defaultHubs, defaultAgents = 3, 50
	inFlightPerHub             = 16               // registrations in flight per hub
	steadyFor                  = 10 * time.Second // the steady-state phase
	pollEvery                  = 20 * time.Millisecond
	prefix                     = "/sim/"
)

// counters are the etcd counters compared across each phase: the first
// four are the writes and watch events measured; ranges (the hubs'
// probes) and lease renewals (their keep-alives) explain the steady state.
var counters = []string{
	"etcd_mvcc_put_total", "etcd_mvcc_delete_total", "etcd_mvcc_txn_total", "etcd_debugging_mvcc_events_total",
	"etcd_mvcc_range_total", "etcd_debugging_lease_renewed_total",
	"process_cpu_seconds_total", selfCPU,
}

// selfCPU is this process's CPU time (every hub's registry), added to each
// scrape from getrusage.
const selfCPU = "fleetsim_hubs_cpu_seconds"

var short = map[string]string{
	"etcd_mvcc_put_total": "puts", "etcd_mvcc_delete_total": "deletes", "etcd_mvcc_txn_total": "txns",
	"etcd_debugging_mvcc_events_total": "events", "etcd_mvcc_range_total": "ranges", "etcd_debugging_lease_renewed_total": "renewals",
	"process_cpu_seconds_total": "etcd-cpu-s", selfCPU: "hubs-cpu-s",
}

func hubID(i int) string   { return fmt.Sprintf("hub-%02d", i) }
func hubAddr(i int) string { return fmt.Sprintf("127.0.0.1:%d", 7000+i) }

// TestClusterSimulation: H hubs' registries over one etcd, K agents
// registered on each; measured: registration and convergence times,
// etcd's writes and watch events while registering and at rest, the heap
// the views take, and how long after one hub is cut from etcd every other
// hub has dropped its agents.
func TestClusterSimulation(t *testing.T) {
	hubs := envInt(t, "FLEETSIM_HUBS", defaultHubs)
	agents := envInt(t, "FLEETSIM_AGENTS", defaultAgents)
	if hubs < 2 || agents < 1 {
		t.Fatalf("FLEETSIM_HUBS=%d FLEETSIM_AGENTS=%d: want at least 2 hubs and 1 agent", hubs, agents)
	}
	small := hubs <= defaultHubs && agents <= defaultAgents
	convergeBound, dropBound := 30*time.Second, 30*time.Second
	if !small {
		convergeBound = 60*time.Second + time.Duration(hubs*hubs*agents)*50*time.Microsecond
		dropBound = 60 * time.Second
	}
	res := &result{Hubs: hubs, Agents: agents, HubTTLSeconds: 3}
	defer res.report(t)

	srv := etcdtest.Start(t)
	ctx := t.Context()
	// The victim reaches etcd through a proxy: blackholing it is the
	// abrupt death (no Close, no revoke; the lease expires in etcd).
	proxy, err := faultproxy.New(ctx, strings.TrimPrefix(srv.Endpoint, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	victim := hubs - 1

	res.Heap.Before = heapInuse()
	regs := make([]*etcd.Registry, hubs)
	for i := range hubs {
		ep := srv.Endpoint
		if i == victim {
			ep = "http://" + proxy.Addr()
		}
		r, err := etcd.New(etcd.Config{Endpoints: []string{ep}, Prefix: prefix, Hub: hubID(i), HubAddr: hubAddr(i)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		regs[i] = r
	}
	if _, ok := waitUntil(time.Now(), 30*time.Second, func() bool {
		for _, r := range regs {
			if !r.Synced() {
				return false
			}
		}
		return true
	}); !ok {
		t.Fatal("the registries were not all synced with a session within 30 s")
	}
	res.Heap.AfterCreate = heapInuse()

	// Registration: every hub at once, inFlightPerHub in flight each.
	m0 := scrape(t, srv.Endpoint)
	okBy := make([]atomic.Int64, hubs)
	var failed atomic.Int64
	var errOnce sync.Once
	start := time.Now()
	var wg sync.WaitGroup
	for i := range hubs {
		next := new(atomic.Int64)
		for range min(inFlightPerHub, agents) {
			wg.Go(func() {
				for {
					j := int(next.Add(1) - 1)
					if j >= agents {
						return
					}
					_, err := regs[i].Register(ctx, registry.Registration{
						InstanceID: fmt.Sprintf("h%02d-a%05d", i, j), Name: "sim", Hub: hubID(i), HubAddr: hubAddr(i),
						Capabilities: []string{fmt.Sprintf("sim%d.run", j%50)}, HeartbeatInterval: time.Hour,
					})
					if err != nil {
						failed.Add(1)
						errOnce.Do(func() { res.FirstError = err.Error() })
						continue
					}
					okBy[i].Add(1)
				}
			})
		}
	}
	wg.Wait()
	res.RegisterSeconds = time.Since(start).Seconds()
	var total int
	for i := range okBy {
		total += int(okBy[i].Load())
	}
	res.Registered, res.Failed = total, int(failed.Load())
	if small && res.Failed > 0 {
		t.Errorf("%d of %d registrations failed; the first: %s", res.Failed, hubs*agents, res.FirstError)
	}
	allAt := func(want int, skip int) func() bool {
		return func() bool {
			for i, r := range regs {
				if i != skip && r.Snapshot().Len() != want {
					return false
				}
			}
			return true
		}
	}
	conv, ok := waitUntil(start, convergeBound, allAt(total, -1))
	res.ConvergeSeconds = conv.Seconds()
	res.ConvergeAfterRegisterSeconds = res.ConvergeSeconds - res.RegisterSeconds
	m1 := scrape(t, srv.Endpoint)
	res.Phases = append(res.Phases, newPhase("register", conv, m0, m1, hubs))
	res.EtcdRSSBytes, res.EtcdDBBytes = gauge(m1, "process_resident_memory_bytes"), gauge(m1, "etcd_mvcc_db_total_size_in_bytes")
	if !ok {
		var got []string
		for i, r := range regs {
			got = append(got, fmt.Sprintf("%s:%d", hubID(i), r.Snapshot().Len()))
		}
		t.Fatalf("not every hub shows the %d instances registered within %v: %s", total, convergeBound, strings.Join(got, " "))
	}
	res.Heap.AfterConverge = heapInuse()
	res.Heap.derive(hubs, total)

	// Steady state: nothing registers; what etcd does is the hubs' own.
	m2 := scrape(t, srv.Endpoint)
	t0 := time.Now()
	select {
	case <-time.After(steadyFor):
	case <-ctx.Done():
	}
	m3 := scrape(t, srv.Endpoint)
	res.Phases = append(res.Phases, newPhase("steady", time.Since(t0), m2, m3, hubs))
	if !allAt(total, -1)() {
		t.Errorf("a hub's view changed at rest (agents' heartbeat interval is 1 h: nothing should expire)")
	}

	// Kill: cut the victim from etcd. An observer's watch sees its
	// presence key go when etcd expires the lease.
	obs, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer obs.Close()
	key := prefix + "hubs/" + hubID(victim)
	g, err := obs.Get(ctx, key)
	if err != nil || len(g.Kvs) != 1 {
		t.Fatalf("the victim's presence %s: %v (%d keys)", key, err, len(g.Kvs))
	}
	if ttl, err := obs.TimeToLive(ctx, clientv3.LeaseID(g.Kvs[0].Lease)); err == nil {
		res.HubTTLSeconds = ttl.GrantedTTL
	}
	wctx, wcancel := context.WithCancel(ctx)
	wch := obs.Watch(wctx, key, clientv3.WithRev(g.Header.Revision+1))
	gone := make(chan time.Time, 1)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for wr := range wch {
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					gone <- time.Now()
					return
				}
			}
		}
	}()
	defer func() { wcancel(); <-watched }()
	m4 := scrape(t, srv.Endpoint)
	cut := time.Now()
	proxy.Blackhole()
	drop, ok := waitUntil(cut, dropBound, allAt(total-int(okBy[victim].Load()), victim))
	res.DropSeconds = drop.Seconds()
	m5 := scrape(t, srv.Endpoint)
	res.Phases = append(res.Phases, newPhase("kill", drop, m4, m5, hubs))
	select {
	case at := <-gone:
		res.LeaseExpirySeconds = at.Sub(cut).Seconds()
		res.PropagationSeconds = res.DropSeconds - res.LeaseExpirySeconds
	case <-time.After(time.Second):
	}
	if !ok {
		t.Fatalf("%s's %d agents not dropped by every other hub within %v of its cut", hubID(victim), okBy[victim].Load(), dropBound)
	}
}

// result is every figure of a run: the table and the JSON line.
type result struct {
	Hubs, Agents                 int
	Registered, Failed           int
	FirstError                   string `json:",omitempty"`
	RegisterSeconds              float64
	ConvergeSeconds              float64 // from the first registration to every hub showing all
	ConvergeAfterRegisterSeconds float64 // from the last registration's return
	Phases                       []phase
	Heap                         heapFigures
	EtcdRSSBytes, EtcdDBBytes    *float64 // after convergence
	HubTTLSeconds                int64    // the session lease's granted TTL
	LeaseExpirySeconds           float64  // cut → etcd deletes the victim's presence
	DropSeconds                  float64  // cut → every other hub dropped its agents
	PropagationSeconds           float64  // presence deleted → every other hub dropped them
}

type heapFigures struct {
	Before, AfterCreate, AfterConverge uint64 // HeapInuse after GC
	PerHubBytes                        float64
	PerRecordBytes                     float64 // (AfterConverge-Before) / (H × registered): each hub holds every instance
	PerRecordNetBytes                  float64 // the same without the empty registries (from AfterCreate)
}

func (h *heapFigures) derive(hubs, total int) {
	grow := float64(int64(h.AfterConverge) - int64(h.Before))
	h.PerHubBytes = grow / float64(hubs)
	if total > 0 {
		h.PerRecordBytes = grow / float64(hubs*total)
		h.PerRecordNetBytes = float64(int64(h.AfterConverge)-int64(h.AfterCreate)) / float64(hubs*total)
	}
}

type phase struct {
	Name               string
	Seconds            float64
	Delta              map[string]*float64 // nil: etcd does not expose it
	WritesPerSecPerHub *float64            // (puts + deletes) / s / hub
	EventsPerSecPerHub *float64            // watch events sent / s / hub
}

func newPhase(name string, d time.Duration, before, after map[string]float64, hubs int) phase {
	p := phase{Name: name, Seconds: d.Seconds(), Delta: map[string]*float64{}}
	for _, c := range counters {
		b, ok1 := before[c]
		a, ok2 := after[c]
		if ok1 && ok2 {
			v := a - b
			p.Delta[c] = &v
		} else {
			p.Delta[c] = nil
		}
	}
	per := d.Seconds() * float64(hubs)
	if put, del := p.Delta["etcd_mvcc_put_total"], p.Delta["etcd_mvcc_delete_total"]; put != nil && del != nil && per > 0 {
		v := (*put + *del) / per
		p.WritesPerSecPerHub = &v
	}
	if ev := p.Delta["etcd_debugging_mvcc_events_total"]; ev != nil && per > 0 {
		v := *ev / per
		p.EventsPerSecPerHub = &v
	}
	return p
}

func (r *result) report(t *testing.T) {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "phase\tseconds\t")
	for _, c := range counters {
		fmt.Fprintf(w, "%s\t", short[c])
	}
	fmt.Fprintf(w, "writes/s/hub\tevents/s/hub\t\n")
	for _, p := range r.Phases {
		fmt.Fprintf(w, "%s\t%.2f\t", p.Name, p.Seconds)
		for _, c := range counters {
			prec := 0
			if strings.HasSuffix(short[c], "-s") {
				prec = 2
			}
			fmt.Fprintf(w, "%s\t", num(p.Delta[c], prec))
		}
		fmt.Fprintf(w, "%s\t%s\t\n", num(p.WritesPerSecPerHub, 2), num(p.EventsPerSecPerHub, 1))
	}
	_ = w.Flush()
	mib := func(v uint64) float64 { return float64(v) / (1 << 20) }
	fmt.Fprintf(&b, "hubs %d × agents %d: registered %d, failed %d%s\n", r.Hubs, r.Agents, r.Registered, r.Failed, firstErr(r.FirstError))
	fmt.Fprintf(&b, "register %.2f s (all returned), converge %.2f s from start (%.2f s after the last return)\n",
		r.RegisterSeconds, r.ConvergeSeconds, r.ConvergeAfterRegisterSeconds)
	fmt.Fprintf(&b, "heap in use: before %.1f MiB, registries up %.1f MiB, converged %.1f MiB; per hub %.0f KiB; per agent record %.0f B (%.0f B without the empty registries)\n",
		mib(r.Heap.Before), mib(r.Heap.AfterCreate), mib(r.Heap.AfterConverge), r.Heap.PerHubBytes/1024, r.Heap.PerRecordBytes, r.Heap.PerRecordNetBytes)
	fmt.Fprintf(&b, "etcd after convergence: RSS %s MiB, db %s MiB\n", num(div(r.EtcdRSSBytes, 1<<20), 1), num(div(r.EtcdDBBytes, 1<<20), 1))
	fmt.Fprintf(&b, "kill (cut from etcd, lease TTL %d s): lease expired %.2f s after the cut; every other hub dropped its agents %.2f s after the cut (%.3f s after the expiry)\n",
		r.HubTTLSeconds, r.LeaseExpirySeconds, r.DropSeconds, r.PropagationSeconds)
	t.Logf("fleetsim figures:\n%s", b.String())
	js, err := json.Marshal(r)
	if err != nil {
		t.Errorf("figures: %v", err)
		return
	}
	fmt.Println("fleetsim: " + string(js))
}

func firstErr(s string) string {
	if s == "" {
		return ""
	}
	return " (first: " + s + ")"
}

func num(v *float64, prec int) string {
	if v == nil {
		return "n/a"
	}
	return strconv.FormatFloat(*v, 'f', prec, 64)
}

func div(v *float64, by float64) *float64 {
	if v == nil {
		return nil
	}
	x := *v / by
	return &x
}

func gauge(m map[string]float64, name string) *float64 {
	if v, ok := m[name]; ok {
		return &v
	}
	return nil
}

// scrape reads etcd's Prometheus endpoint: every sample without labels.
func scrape(t *testing.T, endpoint string) map[string]float64 {
	t.Helper()
	res, err := (&http.Client{Timeout: 5 * time.Second}).Get(endpoint + "/metrics")
	if err != nil {
		t.Fatalf("etcd metrics: %v", err)
	}
	defer res.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' || strings.ContainsRune(line, '{') {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		if v, err := strconv.ParseFloat(f[1], 64); err == nil {
			out[f[0]] = v
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("etcd metrics: %v", err)
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		out[selfCPU] = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	}
	return out
}

// waitUntil polls cond every pollEvery until it holds or d has passed
// since from; it returns the time from from.
func waitUntil(from time.Time, d time.Duration, cond func() bool) (time.Duration, bool) {
	for {
		if cond() {
			return time.Since(from), true
		}
		if time.Since(from) > d {
			return time.Since(from), false
		}
		time.Sleep(pollEvery)
	}
}

func heapInuse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, s, err)
	}
	return n
}
