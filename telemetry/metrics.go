package telemetry

import (
	"net/http"
	"regexp"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/agentmesh/agentmesh/envelope"
)

// Buckets are the OTel semconv advisory buckets for RPC durations, plus
// 30, 60 and 120 s for llm_chat.* and media_gen.* calls.
var Buckets = []float64{.005, .01, .025, .05, .075, .1, .25, .5, .75, 1, 2.5, 5, 7.5, 10, 30, 60, 120}

// Metrics are the mesh's Prometheus series on a private registry (one per
// hub or process, so tests stay hermetic). Safe for concurrent use.
type Metrics struct {
	Registry *prometheus.Registry

	serverDur, clientDur *prometheus.HistogramVec
	inflight             *prometheus.GaugeVec
	inflightClient       prometheus.Gauge // resolved once: no label hashing per call
	inflightServer       prometheus.Gauge
	breakerOpen          *prometheus.GaugeVec
	breakerTransitions   *prometheus.CounterVec
	bulkheadRejected     *prometheus.CounterVec
	retries              *prometheus.CounterVec
	heartbeats           prometheus.Counter
	expirations          prometheus.Counter
	reconnects           *prometheus.CounterVec
	bytes                *prometheus.CounterVec
	refused              *prometheus.CounterVec
	lateResponses        prometheus.Counter
	pingAbuse            prometheus.Counter
	slowConsumers        prometheus.Counter
	invalidFrames        *prometheus.CounterVec
	invalidRecords       *prometheus.CounterVec
	streams              *streamMetrics

	labels *Labeler
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
			Name: "rpc_client_call_duration_seconds", Help: "Duration of calls made, retries included (OTel rpc.client.call.duration).",
			Buckets: Buckets, NativeHistogramBucketFactor: 1.1,
		}, rpcLabels),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "agentmesh_rpc_inflight_requests", Help: "Calls in flight.",
		}, []string{"side"}),
		breakerOpen: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "agentmesh_circuit_breaker_open", Help: "Circuit breakers open now, per method (summed over instances on a hub).",
		}, []string{"method"}),
		breakerTransitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentmesh_circuit_breaker_transitions_total", Help: "Circuit breaker state changes, by the state entered.",
		}, []string{"method", "to"}),
		bulkheadRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentmesh_bulkhead_rejected_total", Help: "Calls refused or shed by a bulkhead.",
		}, []string{"pool"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentmesh_client_retries_total", Help: "Retry decisions: reason retry, hedge, or why a failed attempt was not retried (budget, deadline, attempts, code, not idempotent).",
		}, []string{"method", "reason"}),
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
	m.Registry.MustRegister(m.serverDur, m.clientDur, m.inflight, m.breakerOpen, m.breakerTransitions,
		m.bulkheadRejected, m.retries, m.heartbeats, m.expirations, m.reconnects, m.bytes, m.refused, m.lateResponses, m.pingAbuse, m.slowConsumers, m.invalidFrames, m.invalidRecords,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
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

// Retry counts a retry decision (see agentmesh_client_retries_total).
func (m *Metrics) Retry(method, reason string) {
	if m != nil {
		m.retries.WithLabelValues(m.Method(method), reason).Inc()
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
		m.bytes.WithLabelValues("in").Add(float64(in))
	}
	if out > 0 {
		m.bytes.WithLabelValues("out").Add(float64(out))
	}
}

// Names lists the metric names the mesh's own collectors export (a
// vector with no series yet is absent from a scrape, so dashboards are
// checked against this).
func (m *Metrics) Names() []string {
	ch := make(chan *prometheus.Desc, 64)
	go func() {
		for _, c := range []prometheus.Collector{m.serverDur, m.clientDur, m.inflight, m.breakerOpen, m.breakerTransitions,
			m.bulkheadRejected, m.retries, m.heartbeats, m.expirations, m.reconnects, m.bytes, m.refused, m.lateResponses, m.pingAbuse, m.slowConsumers, m.invalidFrames, m.invalidRecords,
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
