package telemetry

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
)

// StreamStats are what one stream carried, as the hub relaying it saw it.
type StreamStats struct {
	Chunks, Bytes uint64
	// FirstChunk is the time from the stream's start to its first chunk
	// (zero: none came).
	FirstChunk time.Duration
	// Stalls counts the times the producer used up the credit the
	// consumer had granted, and had to wait for more (flow control
	// holding it back).
	Stalls uint64
}

// streamMetrics are the streams' series.
type streamMetrics struct {
	open       *prometheus.GaugeVec
	chunks     *prometheus.CounterVec
	bytes      *prometheus.CounterVec
	stalls     *prometheus.CounterVec
	firstChunk *prometheus.HistogramVec
}

func newStreamMetrics() *streamMetrics {
	return &streamMetrics{
		open: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "agentmesh_streams_open", Help: "Streaming calls open through the hub.",
		}, []string{labelMethod}),
		chunks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentmesh_stream_chunks_total", Help: "Chunks relayed to streams' callers.",
		}, []string{labelMethod}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentmesh_stream_bytes_total", Help: "Bytes of the chunks relayed to streams' callers (their JSON data).",
		}, []string{labelMethod}),
		stalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "agentmesh_stream_flow_control_stalls_total", Help: "Times a stream's producer used up its caller's credit and waited for more.",
		}, []string{labelMethod}),
		firstChunk: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "agentmesh_stream_first_chunk_seconds", Help: "Time from a stream's start to its first chunk.",
			Buckets: Buckets, NativeHistogramBucketFactor: 1.1,
		}, []string{labelMethod}),
	}
}

func (s *streamMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{s.open, s.chunks, s.bytes, s.stalls, s.firstChunk}
}

// StreamOpened counts a stream open until StreamClosed.
func (m *Metrics) StreamOpened(method string) {
	if m != nil {
		m.streams.open.WithLabelValues(m.Method(method)).Inc()
	}
}

// StreamClosed records a stream's figures and counts it closed.
func (m *Metrics) StreamClosed(method string, st StreamStats) {
	if m == nil {
		return
	}
	l := m.Method(method)
	m.streams.open.WithLabelValues(l).Dec()
	m.streams.chunks.WithLabelValues(l).Add(float64(st.Chunks))
	m.streams.bytes.WithLabelValues(l).Add(float64(st.Bytes))
	m.streams.stalls.WithLabelValues(l).Add(float64(st.Stalls))
	if st.Chunks > 0 {
		m.streams.firstChunk.WithLabelValues(l).Observe(st.FirstChunk.Seconds())
	}
}

// AnnotateStream sets a stream's figures on the span in ctx (its server
// span: one span per stream, however many chunks).
func AnnotateStream(ctx context.Context, st StreamStats) {
	s := trace.SpanFromContext(ctx)
	if !s.IsRecording() {
		return
	}
	s.SetAttributes(keyStreamChunks.Int64(int64(st.Chunks)), keyStreamBytes.Int64(int64(st.Bytes)), keyStreamStalls.Int64(int64(st.Stalls)))
	if st.Chunks > 0 {
		s.SetAttributes(keyStreamFirstChunk.Float64(float64(st.FirstChunk.Microseconds()) / 1000))
	}
}
