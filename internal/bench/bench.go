// Package bench is the load generator behind meshctl bench: closed-loop
// workers or an open-loop schedule (latency from the intended send time,
// so coordinated omission does not hide stalls), per-worker HDR
// histograms merged at the end, errors by mesh code, the slowest calls'
// trace ids, a ghz-style report, JSON output, comparisons and SLO gates.
package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"

	"github.com/agentmesh/agentmesh/envelope"
)

// Config is one load run.
type Config struct {
	Method      string
	Params      json.RawMessage
	Concurrency int           // workers (closed loop) or the bound on calls in flight (open loop)
	Total       int           // calls to make; 0: until Duration
	Duration    time.Duration // 0: until Total
	RPS         float64       // > 0: open loop at this rate
	Warmup      time.Duration // calls made first and not counted
	Timeout     time.Duration // per call
	Slowest     int           // how many slowest calls to keep (default 5)
	// Progress, if set, is called at most 4 times a second with a snapshot.
	Progress func(Progress)
}

// Progress is a live view of a run.
type Progress struct {
	Elapsed time.Duration
	Sent    int64
	OK      int64
	Errors  int64
	P99     time.Duration
}

// Invoker makes one call; i picks the connection.
type Invoker func(ctx context.Context, i int, req *envelope.Request) error

const maxLatency = int64(5 * time.Minute)

// Run drives the load and returns the report. Every call it starts has
// finished when it returns.
func Run(ctx context.Context, cfg Config, conns int, call Invoker) (*Report, error) {
	if cfg.Concurrency <= 0 {
		return nil, errors.New("bench: concurrency must be at least 1")
	}
	if cfg.Total <= 0 && cfg.Duration <= 0 {
		return nil, errors.New("bench: give a total (-n) or a duration (-d)")
	}
	if cfg.Slowest <= 0 {
		cfg.Slowest = 5
	}
	if conns <= 0 {
		conns = 1
	}
	if cfg.Warmup > 0 {
		wctx, cancel := context.WithTimeout(ctx, cfg.Warmup)
		r := &runner{cfg: cfg, conns: conns, call: call, warm: true}
		r.closed(wctx, 0)
		cancel()
	}
	r := &runner{cfg: cfg, conns: conns, call: call}
	start := time.Now()
	r.start = start
	rctx, cancel := ctx, context.CancelFunc(func() {})
	if cfg.Duration > 0 {
		rctx, cancel = context.WithTimeout(ctx, cfg.Duration)
	}
	defer cancel()
	stopProgress := r.progress(rctx)
	if cfg.RPS > 0 {
		r.open(rctx)
	} else {
		r.closed(rctx, cfg.Total)
	}
	stopProgress()
	return r.report(time.Since(start)), nil
}

type worker struct {
	hist    *hdrhistogram.Histogram
	errs    map[string]int64
	slowest []Slow
}

func newWorker() *worker {
	return &worker{hist: hdrhistogram.New(1, maxLatency, 3), errs: map[string]int64{}}
}

type runner struct {
	cfg    Config
	conns  int
	call   Invoker
	warm   bool
	start  time.Time
	sent   atomic.Int64
	ok     atomic.Int64
	failed atomic.Int64
	missed atomic.Int64
	mu     sync.Mutex
	done   []*worker
	live   *hdrhistogram.Histogram // for progress; guarded by mu
}

// one makes call number n and records it against intended.
func (r *runner) one(ctx context.Context, w *worker, n int64, intended time.Time) {
	id, span := newTraceID()
	req := &envelope.Request{ID: envelope.NewID(), Method: r.cfg.Method, Params: r.cfg.Params,
		Headers: envelope.Headers{Traceparent: "00-" + id + "-" + span + "-01", TraceID: id}}
	cctx, cancel := ctx, context.CancelFunc(func() {})
	if r.cfg.Timeout > 0 {
		cctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), r.cfg.Timeout)
	}
	err := r.call(cctx, int(n)%r.conns, req)
	cancel()
	lat := time.Since(intended)
	if r.warm {
		return
	}
	_ = w.hist.RecordValue(min(max(int64(lat), 1), maxLatency))
	if err != nil {
		r.failed.Add(1)
		w.errs[envelope.CodeOf(err).String()]++
	} else {
		r.ok.Add(1)
	}
	w.keepSlow(Slow{TraceID: id, SpanID: span, RequestID: req.ID, Start: intended, LatencyMs: ms(lat), Code: envelope.CodeOf(err).String()}, r.cfg.Slowest)
	if r.cfg.Progress != nil && n%64 == 0 {
		r.mu.Lock()
		if r.live == nil {
			r.live = hdrhistogram.New(1, maxLatency, 2)
		}
		_ = r.live.RecordValue(min(max(int64(lat), 1), maxLatency))
		r.mu.Unlock()
	}
}

func (w *worker) keepSlow(s Slow, n int) {
	if len(w.slowest) < n {
		w.slowest = append(w.slowest, s)
		return
	}
	least := 0
	for i := range w.slowest {
		if w.slowest[i].LatencyMs < w.slowest[least].LatencyMs {
			least = i
		}
	}
	if s.LatencyMs > w.slowest[least].LatencyMs {
		w.slowest[least] = s
	}
}

// closed runs Concurrency workers, each calling back to back, until total
// calls were made (0: until ctx ends).
func (r *runner) closed(ctx context.Context, total int) {
	var wg sync.WaitGroup
	for range r.cfg.Concurrency {
		wg.Go(func() {
			w := newWorker()
			defer r.finish(w)
			for ctx.Err() == nil {
				n := r.sent.Add(1)
				if total > 0 && n > int64(total) {
					r.sent.Add(-1)
					return
				}
				r.one(ctx, w, n, time.Now())
			}
		})
	}
	wg.Wait()
}

// open sends at the configured rate; each call's latency counts from its
// intended start. At most Concurrency calls are in flight: a send that
// finds them all busy waits, and still counts from its intended time.
func (r *runner) open(ctx context.Context) {
	interval := time.Duration(float64(time.Second) / r.cfg.RPS)
	slots := make(chan *worker, r.cfg.Concurrency)
	for range r.cfg.Concurrency {
		slots <- newWorker()
	}
	var wg sync.WaitGroup
	t := time.NewTimer(0)
	defer t.Stop()
	for n := int64(0); r.cfg.Total <= 0 || n < int64(r.cfg.Total); n++ {
		intended := r.start.Add(time.Duration(n) * interval)
		if d := time.Until(intended); d > 0 {
			t.Reset(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				goto done
			}
		} else if ctx.Err() != nil {
			break
		}
		var w *worker
		select {
		case w = <-slots:
		default:
			r.missed.Add(1) // every slot busy: the send is late
			select {
			case w = <-slots:
			case <-ctx.Done():
				goto done
			}
		}
		r.sent.Add(1)
		wg.Go(func() {
			r.one(ctx, w, n, intended)
			slots <- w
		})
	}
done:
	wg.Wait()
	close(slots)
	for w := range slots {
		r.finish(w)
	}
}

func (r *runner) finish(w *worker) {
	r.mu.Lock()
	r.done = append(r.done, w)
	r.mu.Unlock()
}

func (r *runner) progress(ctx context.Context) (stop func()) {
	if r.cfg.Progress == nil {
		return func() {}
	}
	pctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-pctx.Done():
				return
			case <-t.C:
				r.mu.Lock()
				var p99 time.Duration
				if r.live != nil {
					p99 = time.Duration(r.live.ValueAtQuantile(99))
				}
				r.mu.Unlock()
				r.cfg.Progress(Progress{Elapsed: time.Since(r.start), Sent: r.sent.Load(), OK: r.ok.Load(), Errors: r.failed.Load(), P99: p99})
			}
		}
	})
	return func() { cancel(); wg.Wait() }
}

// newTraceID returns a new trace id and the id of the call's client span
// (its traceparent's parent; the span is written only for the slowest
// calls, after the run).
func newTraceID() (trace, span string) {
	var b [24]byte
	_, _ = rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	return h[:32], h[32:]
}

func ms(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e6 }

// report merges the workers.
func (r *runner) report(elapsed time.Duration) *Report {
	h := hdrhistogram.New(1, maxLatency, 3)
	rep := &Report{
		Method: r.cfg.Method, Concurrency: r.cfg.Concurrency, Connections: r.conns,
		Errors: map[string]int64{}, Mode: "closed loop",
	}
	if r.cfg.RPS > 0 {
		rep.Mode, rep.TargetRPS = "open loop", r.cfg.RPS
	}
	var slow []Slow
	for _, w := range r.done {
		h.Merge(w.hist)
		for k, v := range w.errs {
			rep.Errors[k] += v
		}
		slow = append(slow, w.slowest...)
	}
	sort.Slice(slow, func(i, j int) bool { return slow[i].LatencyMs > slow[j].LatencyMs })
	if len(slow) > r.cfg.Slowest {
		slow = slow[:r.cfg.Slowest]
	}
	rep.Slowest = slow
	rep.Count = h.TotalCount()
	rep.Succeeded = r.ok.Load()
	rep.Missed = r.missed.Load()
	rep.TotalSeconds = elapsed.Seconds()
	if elapsed > 0 {
		rep.RPS = float64(rep.Count) / elapsed.Seconds()
	}
	rep.Latencies = Latencies{
		Mean: h.Mean() / 1e6, Min: float64(h.Min()) / 1e6, P50: q(h, 50), P90: q(h, 90), P95: q(h, 95),
		P99: q(h, 99), P999: q(h, 99.9), Max: float64(h.Max()) / 1e6,
	}
	rep.Histogram = buckets(h, 10)
	rep.hist = h
	return rep
}

func q(h *hdrhistogram.Histogram, p float64) float64 { return float64(h.ValueAtQuantile(p)) / 1e6 }

func buckets(h *hdrhistogram.Histogram, n int) []Bucket {
	if h.TotalCount() == 0 {
		return nil
	}
	lo, hi := h.Min(), h.Max()
	step := max((hi-lo)/int64(n), 1)
	out := make([]Bucket, 0, n+1)
	for i := 0; i <= n; i++ {
		out = append(out, Bucket{Mark: float64(lo+int64(i)*step) / 1e6})
	}
	for _, bar := range h.Distribution() {
		if bar.Count == 0 {
			continue
		}
		i := int((bar.From - lo) / step)
		i = min(max(i, 0), n)
		out[i].Count += bar.Count
	}
	for i := range out {
		out[i].Frequency = float64(out[i].Count) / float64(h.TotalCount())
	}
	return out
}
