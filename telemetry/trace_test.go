package telemetry_test

import (
	"context"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/reliability"
	"github.com/agentmesh/agentmesh/telemetry"
)

func provider(t *testing.T) (*tracetest.InMemoryExporter, *telemetry.Provider) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	p, err := telemetry.NewProvider(t.Context(), telemetry.TracingConfig{ServiceName: "test", Exporter: exp}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	return exp, p
}

func family(t *testing.T, m *telemetry.Metrics, name string) *dto.MetricFamily {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return f
		}
	}
	return nil
}

func label(s *dto.Metric, name string) string {
	for _, l := range s.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestCallAttemptSpans: a client's logical call is one INTERNAL span,
// each attempt a CLIENT span under it (the retry's reason and backoff as
// its "retry" event), the server a SERVER span under the attempt that
// reached it; the client histograms count the call once
// (agentmesh_client_call_duration_seconds) and each attempt
// (rpc_client_call_duration_seconds), with a sampled span's ids as the
// exemplar.
func TestCallAttemptSpans(t *testing.T) {
	exp, p := provider(t)
	m := telemetry.NewMetrics(nil)
	tel := telemetry.New(p, m)
	server := tel.Server(func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
		if req.Headers.RetryCount == 0 {
			return nil, envelope.NewError(envelope.CodeUnavailable, "first fails")
		}
		return &envelope.Response{}, nil
	})
	ps, _ := reliability.NewPolicySet(reliability.Policy{Retries: 2, Idempotent: true,
		Backoff: reliability.BackoffConfig{Strategy: reliability.Fixed, Initial: time.Millisecond}}, nil)
	call := envelope.Chain(tel.Client, reliability.Retry(ps, reliability.RetryOptions{}), tel.Attempt)(server)
	if _, err := call(t.Context(), &envelope.Request{ID: "r1", Method: "echo.echo"}); err != nil {
		t.Fatal(err)
	}
	_ = p.ForceFlush(t.Context())
	spans := exp.GetSpans()
	kinds := map[string][]trace.SpanKind{}
	byID := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		kinds[s.Name] = append(kinds[s.Name], s.SpanKind)
		byID[s.SpanContext.SpanID().String()] = s
	}
	var logical, retry tracetest.SpanStub
	servers := 0
	for _, s := range spans {
		switch {
		case s.Name == "echo.echo" && s.SpanKind == trace.SpanKindInternal:
			logical = s
		case s.Name == "echo.echo attempt" && s.SpanKind == trace.SpanKindClient:
			if parent := byID[s.Parent.SpanID().String()]; parent.SpanKind != trace.SpanKindInternal {
				t.Errorf("attempt span's parent %q (%v); want the call's INTERNAL span", parent.Name, parent.SpanKind)
			}
			if len(s.Events) > 0 {
				retry = s
			}
		case s.SpanKind == trace.SpanKindServer:
			servers++
			if parent := byID[s.Parent.SpanID().String()]; parent.SpanKind != trace.SpanKindClient {
				t.Errorf("server span's parent %q (%v); want an attempt's CLIENT span", parent.Name, parent.SpanKind)
			}
		}
	}
	if logical.Name == "" || len(kinds["echo.echo attempt"]) != 2 || servers != 2 || len(spans) != 5 {
		t.Fatalf("spans %v; want the call (INTERNAL), 2 attempts (CLIENT), 2 server spans", kinds)
	}
	if len(retry.Events) != 1 || retry.Events[0].Name != "retry" {
		t.Fatalf("retry attempt events %v; want one retry event", retry.Events)
	}
	attrs := map[string]string{}
	for _, a := range retry.Events[0].Attributes {
		attrs[string(a.Key)] = a.Value.Emit()
	}
	if attrs["agentmesh.retry.reason"] != "unavailable" || attrs["agentmesh.retry.backoff_ms"] != "1" {
		t.Errorf("retry event %v; want reason unavailable, backoff_ms 1", attrs)
	}
	count := func(name string) (n uint64, exemplar bool) {
		f := family(t, m, name)
		for _, s := range f.GetMetric() {
			if label(s, "rpc_method") == "echo.echo" {
				n += s.GetHistogram().GetSampleCount()
				for _, b := range s.GetHistogram().GetBucket() {
					if e := b.GetExemplar(); e != nil && len(e.GetLabel()) == 2 {
						exemplar = true
					}
				}
			}
		}
		return n, exemplar
	}
	if n, ex := count("agentmesh_client_call_duration_seconds"); n != 1 || !ex {
		t.Errorf("logical calls counted %d (exemplar %v); want 1 with an exemplar", n, ex)
	}
	if n, _ := count("rpc_client_call_duration_seconds"); n != 2 {
		t.Errorf("attempts counted %d; want 2", n)
	}
	if n, _ := count("rpc_server_call_duration_seconds"); n != 2 {
		t.Errorf("server calls counted %d; want 2", n)
	}
}

// TestControlPlaneUntraced: a control-plane call makes no span and is
// counted in agentmesh_control_call_duration_seconds, not in the user
// calls' histogram; one whose caller's trace is sampled is traced.
func TestControlPlaneUntraced(t *testing.T) {
	exp, p := provider(t)
	m := telemetry.NewMetrics(nil)
	tel := telemetry.New(p, m)
	tel.SetControl(func(method string) bool { return strings.HasPrefix(method, "agent.") })
	ok := func(context.Context, *envelope.Request) (*envelope.Response, error) { return &envelope.Response{}, nil }
	srv := tel.Server(ok)
	for range 3 {
		_, _ = srv(t.Context(), &envelope.Request{Method: "agent.heartbeat"})
	}
	_, _ = srv(t.Context(), &envelope.Request{Method: "echo.echo"})
	traced := &envelope.Request{Method: "agent.register"}
	traced.Headers.Traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	_, _ = srv(t.Context(), traced)
	_ = p.ForceFlush(t.Context())
	var names []string
	for _, s := range exp.GetSpans() {
		names = append(names, s.Name)
	}
	if strings.Join(names, ",") != "echo.echo,agent.register" {
		t.Errorf("spans %v; want echo.echo and the sampled agent.register only", names)
	}
	server, control := map[string]uint64{}, map[string]uint64{}
	for _, s := range family(t, m, "rpc_server_call_duration_seconds").GetMetric() {
		server[label(s, "rpc_method")] += s.GetHistogram().GetSampleCount()
	}
	for _, s := range family(t, m, "agentmesh_control_call_duration_seconds").GetMetric() {
		control[label(s, "rpc_method")] += s.GetHistogram().GetSampleCount()
	}
	if server["echo.echo"] != 1 || server["agent.heartbeat"] != 0 || control["agent.heartbeat"] != 3 || control["agent.register"] != 1 {
		t.Errorf("server %v, control %v; want echo.echo 1 in server, heartbeats 3 and register 1 in control", server, control)
	}
}

// TestMetricsStartAtZero: the families without a method show 0 from the
// start, and those by method once InitMethod named it.
func TestMetricsStartAtZero(t *testing.T) {
	m := telemetry.NewMetrics(nil)
	m.InitMethod("echo.echo")
	for name, want := range map[string]int{
		"agentmesh_security_refused_total":            7,
		"agentmesh_link_bytes_total":                  2,
		"agentmesh_link_invalid_frames_total":         2,
		"agentmesh_circuit_breaker_open":              1,
		"agentmesh_circuit_breaker_transitions_total": 3,
		"agentmesh_client_retries_total":              6,
		"agentmesh_client_retries_skipped_total":      4,
		"agentmesh_bulkhead_rejected_total":           1,
	} {
		f := family(t, m, name)
		if f == nil || len(f.GetMetric()) != want {
			t.Errorf("%s: %d series at start; want %d at 0", name, len(f.GetMetric()), want)
		}
	}
}

// TestBucketsResolveSubMillisecond: the classic buckets start at 50 µs
// and step by at most 2.5 × up to 10 ms.
func TestBucketsResolveSubMillisecond(t *testing.T) {
	b := telemetry.Buckets
	if b[0] > 0.0001 || b[len(b)-1] < 120 {
		t.Fatalf("buckets %v: want 50-100 µs to 120 s", b)
	}
	for i := 1; i < len(b) && b[i] <= 0.01; i++ {
		if r := b[i] / b[i-1]; r > 2.5 {
			t.Errorf("buckets %v → %v: a step of %.1f×", b[i-1], b[i], r)
		}
	}
}
