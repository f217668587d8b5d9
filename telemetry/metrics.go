package telemetry

import (
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/cow"
)

// Buckets resolve the durations a mesh's calls take: a routed call on
// loopback takes 100 µs to 2 ms (meshctl bench), so the classic buckets
// start at 50 µs, step by 1.5 to 2.5 × up to 10 ms (a p99 interpolated in
// them lands within a bucket's width), then follow the OTel semconv
// advisory buckets for RPC durations, plus 30, 60 and 120 s for model
// calls and media generation. (The semconv's own list starts at 5 ms:
// 1,998 of 2,002 echo calls fell in its first bucket.) Native histograms
// (factor 1.1) are exported too, for a scraper that asks for them.
var Buckets = []float64{
	.00005, .0001, .00025, .0005, .00075, .001, .0015, .002, .003, .005, .0075, .01,
	.025, .05, .075, .1, .25, .5, .75, 1, 2.5, 5, 7.5, 10, 30, 60, 120,
}

// Retry reasons: why an attempt beyond the first was sent
// (agentmesh_client_retries_total), and why a failed call that could
// have been retried was not (agentmesh_client_retries_skipped_total).
// A retry's reason is the failed attempt's code in snake case
// (RetryReason), or RetryHedge.
const (
	RetryHedge   = "hedge"    // a hedged attempt, sent while the first still ran
	RetryNotSent = "not_sent" // the failed attempt provably never reached a handler

	SkipAttempts      = "attempts_exhausted" // the policy's retries were all used
	SkipDeadline      = "deadline"           // no time left for a backoff and another attempt
	SkipBudget        = "budget"             // the retry budget was spent
	SkipNotIdempotent = "not_idempotent"     // retryable code, but the method may not run twice
)

// SkipReasons lists the reasons of agentmesh_client_retries_skipped_total.
var SkipReasons = []string{SkipAttempts, SkipDeadline, SkipBudget, SkipNotIdempotent}

// RetryReason is the retry reason for an attempt that failed with c.
func RetryReason(c envelope.Code) string { return strings.ToLower(c.String()) }

// retryReasons are the reasons a retry counter starts with at 0: the
// codes a default policy retries, a hedge, an attempt not sent.
var retryReasons = []string{RetryHedge, RetryNotSent, "unavailable", "timeout", "overloaded", "circuit_open"}

// Metrics are the mesh's Prometheus series on a private registry (one per
// hub or process, so tests stay hermetic). Safe for concurrent use.
type Metrics struct {
	Registry *prometheus.Registry

	serverDur, clientDur *prometheus.HistogramVec
	callDur, controlDur  *prometheus.HistogramVec
	inflight             *prometheus.GaugeVec
	inflightClient       prometheus.Gauge // resolved once: no label hashing per call
	inflightServer       prometheus.Gauge
	breakerOpen          *prometheus.GaugeVec
	breakerTransitions   *prometheus.CounterVec
	bulkheadRejected     *prometheus.CounterVec
	retries              *prometheus.CounterVec
	retriesSkipped       *prometheus.CounterVec
	heartbeats           prometheus.Counter
	expirations          prometheus.Counter
	reconnects           *prometheus.CounterVec
	bytes                *prometheus.CounterVec
	bytesIn, bytesOut    prometheus.Counter // resolved once
	refused              *prometheus.CounterVec
	lateResponses        prometheus.Counter
	pingAbuse            prometheus.Counter
	slowConsumers        prometheus.Counter
	invalidFrames        *prometheus.CounterVec
	invalidRecords       *prometheus.CounterVec
	streams              *streamMetrics

	labels *Labeler

	// When each duration family last took an exemplar (observe).
	exServer, exClient, exCall atomic.Int64

	// The duration series calls observed, resolved once each (durOf):
	// WithLabelValues hashes three labels and takes a lock per call.
	durs cow.Map[durKey, prometheus.Observer]
}

type durKey struct {
	vec           *prometheus.HistogramVec
	system, label string
	code          envelope.Code
}

// durOf is vec's series for system, label and code.
func (m *Metrics) durOf(vec *prometheus.HistogramVec, system, label string, code envelope.Code) prometheus.Observer {
	k := durKey{vec, system, label, code}
	if o, ok := m.durs.Load(k); ok {
		return o
	}
	return m.durs.LoadOrCreate(k, func() prometheus.Observer { return vec.WithLabelValues(system, label, statusCode(code)) })
}

// NewMetrics makes the collectors and registers them, with the Go and
// process collectors, on a new registry. labels bounds rpc_method.
func NewMetrics(labels *Labeler) *Metrics {
	if labels == nil {
		labels = NewLabeler(nil)
	}
	rpcLabels := []string{labelSystem, labelMethod, labelStatus}
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		labels:   labels,
		serverDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rpc_server_call_duration_seconds", Help: "Duration of calls served (OTel rpc.server.call.duration).",
			Buckets: Buckets, NativeHistogramBucketFactor: 1.1,
		}, rpcLabels),
		clientDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "rpc_client_call_duration_seconds", Help: "Duration of outbound call attempts, one per attempt sent (OTel rpc.client.call.duration, shadowing the attempt's CLIENT span).",
			Buckets: Buckets, NativeHistogramBucketFactor: 1.1,
		}, rpcLabels),
		callDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "agentmesh_client_call_duration_seconds", Help: "Duration of logical calls made by a mesh client: every attempt, backoff and hedge included.",
			Buckets: Buckets, NativeHistogramBucketFactor: 1.1,
		}, rpcLabels),
		controlDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "agentmesh_control_call_duration_seconds", Help: "Duration of control-plane calls served (registration, heartbeats, probes, introspection), kept out of rpc_server_call_duration_seconds.",
			Buckets: Buckets, NativeHistogramBucketFactor: 1.1,
		}, []string{labelMethod, labelStatus}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "agentmesh_rpc_inflight_requests", Help: "Calls in flight.",
		}, []string{"side"}),
		breakerOpen: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "agentmesh_circuit_breaker_open", Help: "Circuit breakers open now, per method (summed over instances on a hub).",
		}, []string{labelMethod}),
		breakerTransitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentmesh_circuit_breaker_transitions_total", Help: "Circuit breaker state changes, by the state entered.",
		}, []string{labelMethod, "to"}),
		bulkheadRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentmesh_bulkhead_rejected_total", Help: "Calls refused or shed by a bulkhead.",
		}, []string{"pool"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentmesh_client_retries_total", Help: "Attempts sent beyond a call's first, by reason: the failed attempt's code (unavailable, timeout, overloaded, circuit_open, ...), not_sent, or hedge.",
		}, []string{labelMethod, "reason"}),
		retriesSkipped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentmesh_client_retries_skipped_total", Help: "Failed calls that could have been retried and were not, by reason: attempts_exhausted, deadline, budget, not_idempotent.",
		}, []string{labelMethod, "reason"}),
		heartbeats: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agentmesh_registry_heartbeats_total", Help: "Agent heartbeats received.",
		}),
		expirations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agentmesh_registry_expirations_total", Help: "Agents that expired for missing heartbeats.",
		}),
		reconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentmesh_link_reconnects_total", Help: "Links re-established after a loss.",
		}, []string{"kind"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentmesh_link_bytes_total", Help: "Bytes of WebSocket messages, by direction.",
		}, []string{"direction"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentmesh_security_refused_total", Help: "Connections and calls refused at the edge, by reason (origin, unauthenticated, permission_denied, rate_limited, rate_limited_conn, max_conns).",
		}, []string{"reason"}),
		lateResponses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agentmesh_late_responses_total", Help: "Responses that arrived after their call timed out or was cancelled: dropped, never delivered.",
		}),
		invalidFrames: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentmesh_link_invalid_frames_total", Help: "Native frames refused by their message-level checks (invalid JSON or UTF-8, nesting too deep): answered (seq recovered, caller told) or closed (no seq: link closed 1007).",
		}, []string{"outcome"}),
		invalidRecords: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentmesh_registry_invalid_records_total", Help: "Records read from the cluster registry (etcd) and refused, by reason: not written by a hub of this mesh, malformed, not backed by their hub's presence, or past the bounds.",
		}, []string{"reason"}),
		pingAbuse: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agentmesh_link_ping_abuse_total", Help: "WebSockets closed because the peer pinged more often than the policy allows (1008 too many pings).",
		}),
		slowConsumers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "agentmesh_link_slow_consumers_total", Help: "WebSockets closed because the peer took none of the bytes written to it for the write timeout (1008 slow consumer).",
		}),
	}
	m.streams = newStreamMetrics()
	m.Registry.MustRegister(m.streams.collectors()...)
	m.inflightClient = m.inflight.WithLabelValues("client")
	m.inflightServer = m.inflight.WithLabelValues("server")
	m.bytesIn, m.bytesOut = m.bytes.WithLabelValues("in"), m.bytes.WithLabelValues("out")
	m.Registry.MustRegister(m.serverDur, m.clientDur, m.callDur, m.controlDur, m.inflight, m.breakerOpen, m.breakerTransitions,
		m.bulkheadRejected, m.retries, m.retriesSkipped, m.heartbeats, m.expirations, m.reconnects, m.bytes, m.refused, m.lateResponses, m.pingAbuse, m.slowConsumers, m.invalidFrames, m.invalidRecords,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.initZero()
	return m
}

// initZero shows every family without a method label at 0 for each of
// its known label values before the first event: a counter that jumps
// from absent to 1 is missed by rate(), and a dashboard shows "No data"
// where it should show 0. Families by method start with InitMethod.
func (m *Metrics) initZero() {
	for _, r := range []string{"origin", "unauthenticated", "permission_denied", "rate_limited", "rate_limited_conn", "rate_limited_global", "max_conns"} {
		m.refused.WithLabelValues(r)
	}
	for _, k := range []string{"client"} { // the kinds Reconnected is given
		m.reconnects.WithLabelValues(k)
	}
	for _, d := range []string{"in", "out"} {
		m.bytes.WithLabelValues(d)
	}
	for _, o := range []string{"answered", "closed"} {
		m.invalidFrames.WithLabelValues(o)
	}
}

// InitMethod shows the families by method at 0 for method: its breaker
// closed, no transition, no retry, no rejection. The hub calls it for
// each method an agent registers, so that a breaker or retry panel has
// series before the first failure.
func (m *Metrics) InitMethod(method string) {
	if m == nil {
		return
	}
	l := m.Method(method)
	m.breakerOpen.WithLabelValues(l)
	for _, to := range []string{"open", "half-open", "closed"} {
		m.breakerTransitions.WithLabelValues(l, to)
	}
	m.bulkheadRejected.WithLabelValues(l)
	for _, r := range retryReasons {
		m.retries.WithLabelValues(l, r)
	}
	for _, r := range SkipReasons {
		m.retriesSkipped.WithLabelValues(l, r)
	}
}

// Handler serves /metrics (OpenMetrics when asked, for exemplars).
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{EnableOpenMetrics: true, Registry: m.Registry})
}

// Method returns the bounded label for method.
func (m *Metrics) Method(method string) string { return m.labels.Label(method) }

// Heartbeat counts an agent heartbeat.
func (m *Metrics) Heartbeat() {
	if m != nil {
		m.heartbeats.Inc()
	}
}

// Expired counts an agent that expired.
func (m *Metrics) Expired() {
	if m != nil {
		m.expirations.Inc()
	}
}

// Refused counts a connection or call refused at the edge.
func (m *Metrics) Refused(reason string) {
	if m != nil {
		m.refused.WithLabelValues(reason).Inc()
	}
}

// RefusalReason names the reason of a call refused by its credential or
// its rate limit, as Refused counts it: "unauthenticated",
// "rate_limited" (OVERLOADED), else "permission_denied". The hub and the
// surfaces that answer refusals in their own shape (OpenAI's) share it.
func RefusalReason(err error) string {
	switch envelope.CodeOf(err) {
	case envelope.CodeUnauthenticated:
		return "unauthenticated"
	case envelope.CodeOverloaded:
		return "rate_limited"
	default:
		return "permission_denied"
	}
}

// LateResponse counts a response dropped because its call had already
// timed out or been cancelled.
func (m *Metrics) LateResponse() {
	if m != nil {
		m.lateResponses.Inc()
	}
}

// InvalidRecord counts a registry record refused, by reason. It never
// blocks (the registry calls it from its watch).
func (m *Metrics) InvalidRecord(reason string) {
	if m != nil {
		m.invalidRecords.WithLabelValues(reason).Inc()
	}
}

// InitInvalidRecords shows each reason of InvalidRecord at 0 before the
// first refusal (a counter that jumps from absent to 1 is missed by rate()).
func (m *Metrics) InitInvalidRecords(reasons []string) {
	if m != nil {
		for _, r := range reasons {
			m.invalidRecords.WithLabelValues(r)
		}
	}
}

// PingAbuse counts a WebSocket closed for pinging too often.
func (m *Metrics) PingAbuse() {
	if m != nil {
		m.pingAbuse.Inc()
	}
}

// SlowConsumer counts a WebSocket closed for not reading (1008 slow
// consumer).
func (m *Metrics) SlowConsumer() {
	if m != nil {
		m.slowConsumers.Inc()
	}
}

// InvalidFrame counts a native frame refused by its message-level checks,
// by outcome: answered or closed.
func (m *Metrics) InvalidFrame(outcome string) {
	if m != nil {
		m.invalidFrames.WithLabelValues(outcome).Inc()
	}
}

// Reconnected counts a link re-established after a loss.
func (m *Metrics) Reconnected(kind string) {
	if m != nil {
		m.reconnects.WithLabelValues(kind).Inc()
	}
}

// Retry counts an attempt sent beyond a call's first, by reason (see
// agentmesh_client_retries_total).
func (m *Metrics) Retry(method, reason string) {
	if m != nil {
		m.retries.WithLabelValues(m.Method(method), reason).Inc()
	}
}

// RetrySkipped counts a failed call that could have been retried and was
// not, by reason (SkipReasons).
func (m *Metrics) RetrySkipped(method, reason string) {
	if m != nil {
		m.retriesSkipped.WithLabelValues(m.Method(method), reason).Inc()
	}
}

// BreakerChanged records a breaker's transition (states as gobreaker
// names them: closed, half-open, open).
func (m *Metrics) BreakerChanged(method, from, to string) {
	if m == nil {
		return
	}
	l := m.Method(method)
	m.breakerTransitions.WithLabelValues(l, to).Inc()
	switch {
	case to == "open":
		m.breakerOpen.WithLabelValues(l).Inc()
	case from == "open":
		m.breakerOpen.WithLabelValues(l).Dec()
	}
}

// BulkheadRejected counts a call a bulkhead refused.
func (m *Metrics) BulkheadRejected(method string) {
	if m != nil {
		m.bulkheadRejected.WithLabelValues(m.Method(method)).Inc()
	}
}

// Bytes counts WebSocket message bytes.
func (m *Metrics) Bytes(in, out int) {
	if m == nil {
		return
	}
	if in > 0 {
		m.bytesIn.Add(float64(in))
	}
	if out > 0 {
		m.bytesOut.Add(float64(out))
	}
}

// Names lists the metric names the mesh's own collectors export (a
// vector with no series yet is absent from a scrape, so dashboards are
// checked against this).
func (m *Metrics) Names() []string {
	ch := make(chan *prometheus.Desc, 64)
	go func() {
		for _, c := range []prometheus.Collector{m.serverDur, m.clientDur, m.callDur, m.controlDur, m.inflight, m.breakerOpen, m.breakerTransitions,
			m.bulkheadRejected, m.retries, m.retriesSkipped, m.heartbeats, m.expirations, m.reconnects, m.bytes, m.refused, m.lateResponses, m.pingAbuse, m.slowConsumers, m.invalidFrames, m.invalidRecords,
			m.streams.open, m.streams.chunks, m.streams.bytes, m.streams.stalls, m.streams.firstChunk,
			stateCollector{}} {
			c.Describe(ch)
		}
		close(ch)
	}()
	var out []string
	re := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range ch {
		if mm := re.FindStringSubmatch(d.String()); mm != nil {
			out = append(out, mm[1])
		}
	}
	return out
}

// MustRegister adds collectors (the hub's registry and bulkhead gauges).
func (m *Metrics) MustRegister(cs ...prometheus.Collector) { m.Registry.MustRegister(cs...) }

// Labeler bounds the rpc_method label: a method the known func accepts
// keeps its name; other methods keep theirs only while fewer than max
// distinct names were seen, then collapse into _OTHER.
type Labeler struct {
	known func(string) bool
	max   int
	mu    sync.Mutex
	seen  atomic.Pointer[map[string]struct{}]
}

// NewLabeler returns a labeler; known may be nil.
func NewLabeler(known func(string) bool) *Labeler {
	l := &Labeler{known: known, max: 256}
	m := map[string]struct{}{}
	l.seen.Store(&m)
	return l
}

// Label returns the label value for method.
func (l *Labeler) Label(method string) string {
	if l == nil {
		return method
	}
	if _, ok := (*l.seen.Load())[method]; ok {
		return method
	}
	if l.known != nil && !l.known(method) {
		return OtherMethod
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	old := *l.seen.Load()
	if _, ok := old[method]; ok {
		return method
	}
	if len(old) >= l.max {
		return OtherMethod
	}
	m := make(map[string]struct{}, len(old)+1)
	for k := range old {
		m[k] = struct{}{}
	}
	m[method] = struct{}{}
	l.seen.Store(&m)
	return method
}

// HubState is what a hub reports at scrape time.
type HubState struct {
	AgentsByState map[string]int // registered instances by state
	Methods       int            // distinct capabilities registered
	Links         map[string]int // open WebSockets by kind (agent, client)
	Pending       int            // calls the hub awaits answers to
	Pools         []PoolState    // bulkheads
}

// PoolState is one bulkhead at scrape time.
type PoolState struct {
	Method          string
	Running, Queued int
}

var (
	descAgents   = prometheus.NewDesc("agentmesh_registry_agents", "Registered agent instances, by state.", []string{"state"}, nil)
	descMethods  = prometheus.NewDesc("agentmesh_registry_methods", "Distinct methods and patterns registered.", nil, nil)
	descLinks    = prometheus.NewDesc("agentmesh_links", "Open WebSocket links, by kind.", []string{"kind"}, nil)
	descPending  = prometheus.NewDesc("agentmesh_pending_requests", "Calls awaiting an answer, by side.", []string{"side"}, nil)
	descBHRun    = prometheus.NewDesc("agentmesh_bulkhead_inflight", "Calls running in a bulkhead.", []string{"pool"}, nil)
	descBHQueued = prometheus.NewDesc("agentmesh_bulkhead_queued", "Calls waiting in a bulkhead's queue.", []string{"pool"}, nil)
)

type stateCollector struct {
	m *Metrics
	f func() HubState
}

func (c stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descAgents, descMethods, descLinks, descPending, descBHRun, descBHQueued} {
		ch <- d
	}
}

func (c stateCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.f()
	for st, n := range s.AgentsByState {
		ch <- prometheus.MustNewConstMetric(descAgents, prometheus.GaugeValue, float64(n), st)
	}
	ch <- prometheus.MustNewConstMetric(descMethods, prometheus.GaugeValue, float64(s.Methods))
	for k, n := range s.Links {
		ch <- prometheus.MustNewConstMetric(descLinks, prometheus.GaugeValue, float64(n), k)
	}
	ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(s.Pending), "hub")
	run, queued := map[string]int{}, map[string]int{}
	for _, p := range s.Pools {
		l := c.m.Method(p.Method)
		run[l] += p.Running
		queued[l] += p.Queued
	}
	for l, n := range run {
		ch <- prometheus.MustNewConstMetric(descBHRun, prometheus.GaugeValue, float64(n), l)
		ch <- prometheus.MustNewConstMetric(descBHQueued, prometheus.GaugeValue, float64(queued[l]), l)
	}
}

// RegisterHubState reports f's figures at every scrape.
func (m *Metrics) RegisterHubState(f func() HubState) {
	m.Registry.MustRegister(stateCollector{m, f})
}

// pendingCollector reports one side's pending calls. It describes nothing
// (an unchecked collector): the hub's state collector describes the same
// series, and a process may hold both.
type pendingCollector struct {
	side string
	f    func() int
}

func (pendingCollector) Describe(chan<- *prometheus.Desc) {}

func (c pendingCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descPending, prometheus.GaugeValue, float64(c.f()), c.side)
}

// RegisterPending reports f's figure as agentmesh_pending_requests{side}
// at every scrape ("client", "agent"; the hub reports side "hub" itself).
// Register each side once per registry.
func (m *Metrics) RegisterPending(side string, f func() int) {
	if m == nil {
		return
	}
	m.Registry.MustRegister(pendingCollector{side, f})
}

// CallRecord is one call a hub served, as a live tail shows it (the
// console's failed and slow calls).
type CallRecord struct {
	At         time.Time `json:"at"`
	Method     string    `json:"method"`
	Code       string    `json:"code"` // "OK" on success
	Message    string    `json:"message,omitempty"`
	DurationMs float64   `json:"durationMs"`
	Instance   string    `json:"instance,omitempty"`
	TraceID    string    `json:"traceId,omitempty"`
	RequestID  string    `json:"requestId"`
}
