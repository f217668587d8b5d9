package console

import (
	"context"
	"encoding/json"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/registry"
	"github.com/agentmesh/agentmesh/surface"
)

// window is how far back the rates and quantiles look.
const (
	rateWindow     = 5 * time.Second // calls/s and error ratio
	quantileWindow = time.Minute     // p50, p99, the histogram
)

// agentView is one agent instance on the page.
type agentView struct {
	ID            string   `json:"id"`
	Name          string   `json:"name"`
	Hub           string   `json:"hub"`
	State         string   `json:"state"`
	Load          float64  `json:"load"`
	InFlight      int64    `json:"inFlight"`
	LastHeartbeat int64    `json:"lastHeartbeatMs"` // unix ms
	Methods       []string `json:"methods"`
}

// methodView is one method on the page.
type methodView struct {
	Name      string    `json:"name"`
	Ready     int       `json:"ready"`
	Total     int       `json:"total"`
	Rate      float64   `json:"rate"`      // calls/s over rateWindow
	ErrorPct  float64   `json:"errorPct"`  // failed share of those, %
	Codes     []codeN   `json:"codes"`     // failures by code over rateWindow
	P50       float64   `json:"p50Ms"`     // over quantileWindow, ms
	P99       float64   `json:"p99Ms"`     // over quantileWindow, ms
	Breaker   string    `json:"breaker"`   // the worst state of its instances' breakers
	Breakers  []brView  `json:"breakers"`  // per instance
	Spark     []float64 `json:"spark"`     // calls/s, one per tick, oldest first
	Histogram []bucketN `json:"histogram"` // quantileWindow's calls by bucket
}

type codeN struct {
	Code string  `json:"code"`
	Rate float64 `json:"rate"`
}

type brView struct {
	Instance string `json:"instance"`
	State    string `json:"state"`
	Failures uint32 `json:"consecutiveFailures"`
}

type bucketN struct {
	LeMs  float64 `json:"leMs"` // +Inf as 0
	Count float64 `json:"count"`
}

// view is what the page draws, once per tick.
type view struct {
	Hub     string              `json:"hub"`
	At      int64               `json:"at"` // unix ms
	Cluster control.ClusterInfo `json:"cluster"`
	Hubs    []string            `json:"hubs"` // every hub an agent is attached to, and this one
	Agents  []agentView         `json:"agents"`
	Methods []methodView        `json:"methods"`
}

// sample is the hub's server histogram at one tick, by method.
type sample struct {
	at      time.Time
	methods map[string]*methodSample
}

type methodSample struct {
	total   float64            // calls
	byCode  map[string]float64 // calls by rpc_response_status_code ("" ok)
	buckets []float64          // cumulative counts, by bounds
	bounds  []float64          // upper bounds (s), +Inf last
}

// viewer makes the view every tick while someone watches.
type viewer struct {
	h    surface.Host
	tick time.Duration

	mu      sync.Mutex
	subs    map[chan []byte]struct{}
	cancel  context.CancelFunc
	done    chan struct{}
	samples []sample // oldest first, quantileWindow of them
	closed  bool
	who     *auth.Principal // the latest subscriber: mesh.breakers is called as them
}

func newViewer(h surface.Host, tick time.Duration) *viewer {
	return &viewer{h: h, tick: tick, subs: map[chan []byte]struct{}{}}
}

// subscribe returns a channel of views until ctx ends; the first
// subscriber starts the ticker, the last one gone stops it.
func (v *viewer) subscribe(ctx context.Context, who *auth.Principal) <-chan []byte {
	ch := make(chan []byte, 1)
	v.mu.Lock()
	v.who = who
	if v.closed {
		v.mu.Unlock()
		close(ch)
		return ch
	}
	v.subs[ch] = struct{}{}
	if v.cancel == nil {
		tctx, cancel := context.WithCancel(context.Background())
		v.cancel, v.done = cancel, make(chan struct{})
		go v.run(tctx, v.done)
	}
	v.mu.Unlock()
	context.AfterFunc(ctx, func() {
		v.mu.Lock()
		delete(v.subs, ch)
		var wait chan struct{}
		if len(v.subs) == 0 && v.cancel != nil {
			v.cancel()
			v.cancel, wait = nil, v.done
			v.samples = nil
		}
		v.mu.Unlock()
		if wait != nil {
			<-wait
		}
	})
	return ch
}

// close stops the ticker and ends every subscription.
func (v *viewer) close() {
	v.mu.Lock()
	v.closed = true
	cancel, done := v.cancel, v.done
	v.cancel = nil
	for ch := range v.subs {
		delete(v.subs, ch)
		close(ch)
	}
	v.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}

func (v *viewer) run(ctx context.Context, done chan struct{}) {
	defer close(done)
	t := time.NewTicker(v.tick)
	defer t.Stop()
	for {
		b := v.make(ctx)
		v.mu.Lock()
		for ch := range v.subs {
			select { // a slow page skips a view, never holds the others
			case <-ch:
			default:
			}
			ch <- b
		}
		v.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// make builds the view now and keeps the histogram's sample.
func (v *viewer) make(ctx context.Context) []byte {
	now := time.Now()
	snap := v.h.Registry().Snapshot()
	out := view{Hub: v.h.ID(), At: now.UnixMilli(), Cluster: v.h.Cluster()}
	hubs := map[string]bool{v.h.ID(): true}
	for _, in := range snap.Instances() {
		caps := slices.Clone(in.Capabilities)
		sort.Strings(caps)
		out.Agents = append(out.Agents, agentView{ID: in.InstanceID, Name: in.Name, Hub: in.Hub, State: in.State(),
			Load: in.Load(), InFlight: in.InFlight(), LastHeartbeat: in.LastHeartbeat().UnixMilli(), Methods: caps})
		hubs[in.Hub] = true
	}
	sort.Slice(out.Agents, func(i, j int) bool {
		a, b := out.Agents[i], out.Agents[j]
		if a.Name != b.Name {
			return a.Name < b.Name
		}
		return a.ID < b.ID
	})
	for h := range hubs {
		out.Hubs = append(out.Hubs, h)
	}
	sort.Strings(out.Hubs)

	cur := v.sampleNow(now)
	v.mu.Lock()
	v.samples = append(v.samples, cur)
	for len(v.samples) > 1 && now.Sub(v.samples[0].at) > quantileWindow {
		v.samples = v.samples[1:]
	}
	samples := slices.Clone(v.samples)
	v.mu.Unlock()

	breakers := v.breakers(ctx)
	for m, ins := range snap.Methods() {
		if strings.HasSuffix(m, "*") {
			continue // a pattern: its calls are counted under their names
		}
		mv := methodView{Name: m, Total: len(ins), Breaker: "closed", Breakers: breakers[m]}
		for _, in := range ins {
			if in.State() == registry.StateReady {
				mv.Ready++
			}
		}
		for _, b := range mv.Breakers {
			mv.Breaker = worse(mv.Breaker, b.State)
		}
		fillRates(&mv, samples, now)
		out.Methods = append(out.Methods, mv)
	}
	sort.Slice(out.Methods, func(i, j int) bool { return out.Methods[i].Name < out.Methods[j].Name })
	b, _ := json.Marshal(out)
	return b
}

// worse is the worse of two breaker states.
func worse(a, b string) string {
	rank := map[string]int{"closed": 0, "half-open": 1, "open": 2}
	if rank[b] > rank[a] {
		return b
	}
	return a
}

// breakers asks the hub (mesh.breakers, as the hub itself) for its
// breakers, by method.
func (v *viewer) breakers(ctx context.Context) map[string][]brView {
	out := map[string][]brView{}
	req := &envelope.Request{ID: envelope.NewID(), Method: "mesh.breakers", Origin: "console", Timestamp: time.Now().UnixMilli(), Version: envelope.Version}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	v.mu.Lock()
	who := v.who
	v.mu.Unlock()
	res, err := v.h.Invoke(v.h.WithCaller(cctx, who, ""), req)
	if err != nil {
		return out
	}
	var list []struct {
		Method, Instance, State string
		ConsecutiveFailures     uint32
	}
	if json.Unmarshal(res.Result, &list) != nil {
		return out
	}
	for _, b := range list {
		out[b.Method] = append(out[b.Method], brView{Instance: b.Instance, State: b.State, Failures: b.ConsecutiveFailures})
	}
	return out
}

// sampleNow reads the hub's rpc_server_call_duration_seconds.
func (v *viewer) sampleNow(now time.Time) sample {
	s := sample{at: now, methods: map[string]*methodSample{}}
	m := v.h.Metrics()
	if m == nil {
		return s
	}
	fams, err := m.Registry.Gather()
	if err != nil {
		return s
	}
	for _, f := range fams {
		if f.GetName() != "rpc_server_call_duration_seconds" {
			continue
		}
		for _, mm := range f.GetMetric() {
			method, code := labelOf(mm, "rpc_method"), labelOf(mm, "rpc_response_status_code")
			ms := s.methods[method]
			if ms == nil {
				ms = &methodSample{byCode: map[string]float64{}}
				s.methods[method] = ms
			}
			hist := mm.GetHistogram()
			n := float64(hist.GetSampleCount())
			ms.total += n
			ms.byCode[code] += n
			bs := hist.GetBucket()
			if ms.bounds == nil {
				for _, b := range bs {
					ms.bounds = append(ms.bounds, b.GetUpperBound())
				}
				ms.bounds = append(ms.bounds, math.Inf(1))
				ms.buckets = make([]float64, len(ms.bounds))
			}
			for i, b := range bs {
				if i < len(ms.buckets) {
					ms.buckets[i] += float64(b.GetCumulativeCount())
				}
			}
			ms.buckets[len(ms.buckets)-1] += n
		}
	}
	return s
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// fillRates sets mv's rate, error ratio, codes and spark line from the
// samples (oldest first) over rateWindow, and its quantiles and histogram
// over the whole window.
func fillRates(mv *methodView, samples []sample, now time.Time) {
	if len(samples) < 2 {
		return
	}
	last := samples[len(samples)-1].methods[mv.Name]
	if last == nil {
		return
	}
	// The sample rateWindow ago (or the oldest).
	i := len(samples) - 1
	for i > 0 && now.Sub(samples[i-1].at) <= rateWindow {
		i--
	}
	if i == len(samples)-1 {
		i--
	}
	ref := samples[i]
	secs := now.Sub(ref.at).Seconds()
	var prev methodSample
	if p := ref.methods[mv.Name]; p != nil {
		prev = *p
	}
	calls := last.total - prev.total
	if secs > 0 {
		mv.Rate = round(calls / secs)
	}
	var failed float64
	for code, n := range last.byCode {
		if code == "" {
			continue
		}
		d := n - prev.byCode[code]
		if d > 0 {
			failed += d
			name := code
			if n, err := strconv.Atoi(code); err == nil {
				if c, ok := envelope.CodeFromJSONRPC(n); ok {
					name = c.String()
				}
			}
			mv.Codes = append(mv.Codes, codeN{Code: name, Rate: round(d / secs)})
		}
	}
	sort.Slice(mv.Codes, func(i, j int) bool { return mv.Codes[i].Code < mv.Codes[j].Code })
	if calls > 0 {
		mv.ErrorPct = round(100 * failed / calls)
	}
	// Spark: calls/s per tick.
	for k := 1; k < len(samples); k++ {
		a, b := samples[k-1].methods[mv.Name], samples[k].methods[mv.Name]
		var d float64
		if b != nil {
			d = b.total
			if a != nil {
				d -= a.total
			}
		}
		mv.Spark = append(mv.Spark, round(d/samples[k].at.Sub(samples[k-1].at).Seconds()))
	}
	// Quantiles over the window: the buckets' growth since its start.
	first := samples[0].methods[mv.Name]
	delta := slices.Clone(last.buckets)
	if first != nil && len(first.buckets) == len(delta) {
		for k := range delta {
			delta[k] -= first.buckets[k]
		}
	}
	if len(delta) == 0 || delta[len(delta)-1] <= 0 {
		return
	}
	mv.P50 = round(1000 * quantile(0.5, last.bounds, delta))
	mv.P99 = round(1000 * quantile(0.99, last.bounds, delta))
	prevCum := 0.0
	for k, c := range delta {
		le := last.bounds[k] * 1000
		if math.IsInf(le, 1) {
			le = 0
		}
		mv.Histogram = append(mv.Histogram, bucketN{LeMs: le, Count: c - prevCum})
		prevCum = c
	}
}

// quantile interpolates q in cumulative bucket counts, as Prometheus'
// histogram_quantile does.
func quantile(q float64, bounds, cum []float64) float64 {
	total := cum[len(cum)-1]
	rank := q * total
	for i, c := range cum {
		if c >= rank {
			lo, loCount := 0.0, 0.0
			if i > 0 {
				lo, loCount = bounds[i-1], cum[i-1]
			}
			hi := bounds[i]
			if math.IsInf(hi, 1) {
				return lo
			}
			if c == loCount {
				return hi
			}
			return lo + (hi-lo)*(rank-loCount)/(c-loCount)
		}
	}
	return bounds[len(bounds)-2]
}

func round(f float64) float64 { return math.Round(f*100) / 100 }
