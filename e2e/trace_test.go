package e2e_test

import (
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/agentmesh/agentmesh/envelope"
	meshhub "github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/reliability"
	"github.com/agentmesh/agentmesh/telemetry"
)

// span is a received span with the service that sent it.
type span struct {
	service      string
	name         string
	kind         tracepb.Span_SpanKind
	trace, id    string
	parent       string
	attrs        map[string]string
	statusError  bool
	statusDetail string
	start        time.Time
}

// receiver is a real OTLP/HTTP receiver: it decodes the protobuf export
// requests it is sent.
type receiver struct {
	mu    sync.Mutex
	spans []span
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "want protobuf on /v1/traces", http.StatusUnsupportedMediaType)
		return
	}
	body, _ := io.ReadAll(req.Body)
	var ex coltrace.ExportTraceServiceRequest
	if err := proto.Unmarshal(body, &ex); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	for _, rs := range ex.ResourceSpans {
		service := ""
		for _, a := range rs.Resource.GetAttributes() {
			if a.Key == "service.name" {
				service = a.Value.GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				sp := span{service: service, name: s.Name, kind: s.Kind, trace: hex.EncodeToString(s.TraceId),
					id: hex.EncodeToString(s.SpanId), parent: hex.EncodeToString(s.ParentSpanId), attrs: map[string]string{},
					statusError: s.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR, statusDetail: s.Status.GetMessage(),
					start: time.Unix(0, int64(s.StartTimeUnixNano))}
				for _, a := range s.Attributes {
					if sv := a.Value.GetStringValue(); sv != "" {
						sp.attrs[a.Key] = sv
					} else if a.Value.GetValue() != nil {
						sp.attrs[a.Key] = strings.TrimSpace(strings.TrimPrefix(a.Value.String(), "int_value:"))
					}
				}
				r.spans = append(r.spans, sp)
			}
		}
	}
	r.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-protobuf")
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	_, _ = w.Write(out)
}

func (r *receiver) trace(id string) []span {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []span
	for _, s := range r.spans {
		if s.trace == id {
			out = append(out, s)
		}
	}
	return out
}

// TestOneTraceAcrossHops: a client, a hub (in this process) and an agent
// (its own process) export to a real OTLP/HTTP receiver; one call is one
// trace with the right parents, a failed call carries its code, and the
// hub makes one attempt span per retry.
func TestOneTraceAcrossHops(t *testing.T) {
	t.Parallel()
	rcv := &receiver{}
	srv := httptest.NewServer(rcv)
	defer srv.Close()
	ctx := t.Context()

	newTel := func(service string) (*telemetry.Telemetry, *telemetry.Provider) {
		tp, err := telemetry.NewProvider(ctx, telemetry.TracingConfig{ServiceName: service, Endpoint: srv.URL}, nil)
		if err != nil || !tp.Enabled {
			t.Fatalf("provider: %v (enabled %v)", err, tp != nil && tp.Enabled)
		}
		return telemetry.New(tp, nil), tp
	}
	hubTel, hubTP := newTel("meshd")
	rc := reliability.DefaultConfig()
	rc.Policies["chaos.*"] = reliability.Policy{Timeout: 5 * time.Second, Retries: 2, Idempotent: true,
		Backoff: reliability.BackoffConfig{Strategy: reliability.Fixed, Initial: time.Millisecond}}
	hub, err := meshhub.New(meshhub.Config{Reliability: &rc}, meshhub.WithTelemetry(hubTel))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hctx, stopHub := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { _ = hub.Serve(hctx, ln); close(served) }()
	defer func() { stopHub(); <-served }()
	ws := "ws://" + ln.Addr().String() + "/ws"

	// The agents are processes of their own, exporting with the standard
	// variables.
	for _, args := range [][]string{{"echo", "--id", "echo-t"}, {"chaos", "--id", "chaos-t", "--fail-rate", "1", "--fail-code", "UNAVAILABLE"}} {
		// The agents export with the standard variables (start clears the
		// developer's own OTEL_*; these are the test's).
		startWithEnv(t, []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + srv.URL, "OTEL_BSP_SCHEDULE_DELAY=50"}, "meshctl", append([]string{"agent", "run", "--hub", ws}, args...)...)
	}
	waitFor(t, "agents registered", 10*time.Second, func() bool {
		s := hub.Registry().Snapshot()
		return s.Instance("echo-t") != nil && s.Instance("chaos-t") != nil
	})

	cliTel, cliTP := newTel("test-client")
	var lastTrace string
	c, err := mesh.NewClient([]string{ws}, mesh.WithClientTelemetry(cliTel), mesh.WithMiddleware(func(next envelope.Invoker) envelope.Invoker {
		return func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
			lastTrace = telemetry.TraceID(ctx)
			return next(ctx, req)
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	if err := c.Call(ctx, "echo.echo", map[string]int{"a": 1}, nil); err != nil {
		t.Fatal(err)
	}
	okTrace := lastTrace
	err = c.Call(ctx, "chaos.echo", 1, nil)
	if envelope.CodeOf(err) != envelope.CodeUnavailable {
		t.Fatalf("chaos call = %v; want UNAVAILABLE", err)
	}
	failTrace := lastTrace
	flush := func(tp *telemetry.Provider) {
		fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tp.Shutdown(fctx)
	}
	flush(cliTP)
	flush(hubTP)

	// The successful call: client → attempt → hub server → hub attempt → agent server.
	var spans []span
	waitFor(t, "the agent's spans", 10*time.Second, func() bool { spans = rcv.trace(okTrace); return len(spans) >= 5 })
	find := func(spans []span, service string, kind tracepb.Span_SpanKind, nameSuffix string) []span {
		var out []span
		for _, s := range spans {
			if s.service == service && s.kind == kind && strings.HasSuffix(s.name, nameSuffix) {
				out = append(out, s)
			}
		}
		return out
	}
	one := func(spans []span, service string, kind tracepb.Span_SpanKind, name string) span {
		t.Helper()
		got := find(spans, service, kind, name)
		if len(got) != 1 {
			t.Fatalf("%d spans %s/%v/%q in %+v; want 1", len(got), service, kind, name, spans)
		}
		return got[0]
	}
	cl := one(spans, "test-client", tracepb.Span_SPAN_KIND_INTERNAL, "echo.echo")
	ca := one(spans, "test-client", tracepb.Span_SPAN_KIND_CLIENT, "echo.echo attempt")
	hs := one(spans, "meshd", tracepb.Span_SPAN_KIND_SERVER, "echo.echo")
	ha := one(spans, "meshd", tracepb.Span_SPAN_KIND_CLIENT, "echo.echo attempt")
	as := one(spans, "agent-echo", tracepb.Span_SPAN_KIND_SERVER, "echo.echo")
	for _, link := range []struct {
		child, parent span
		what          string
	}{{ca, cl, "client attempt → client call"}, {hs, ca, "hub server → client attempt"}, {ha, hs, "hub attempt → hub server"}, {as, ha, "agent server → hub attempt"}} {
		if link.child.parent != link.parent.id {
			t.Errorf("%s: parent %s; want %s", link.what, link.child.parent, link.parent.id)
		}
	}
	if cl.parent != "" {
		t.Errorf("the client span has a parent %s; want a root", cl.parent)
	}
	if cl.attrs["rpc.system.name"] != "agentmesh" || cl.attrs["rpc.method"] != "echo.echo" || ha.attrs["agentmesh.instance"] != "echo-t" {
		t.Errorf("attributes: client %v, hub attempt %v", cl.attrs, ha.attrs)
	}

	// The failed call: its code on the spans, one hub attempt span per
	// attempt (1 + 2 retries), each agent span under its own attempt.
	waitFor(t, "the failed call's spans", 10*time.Second, func() bool {
		return len(find(rcv.trace(failTrace), "agent-chaos", tracepb.Span_SPAN_KIND_SERVER, "chaos.echo")) == 3
	})
	spans = rcv.trace(failTrace)
	fc := one(spans, "test-client", tracepb.Span_SPAN_KIND_INTERNAL, "chaos.echo")
	if !fc.statusError || fc.attrs["rpc.response.status_code"] != "-32002" || !strings.HasPrefix(fc.statusDetail, "UNAVAILABLE") {
		t.Errorf("failed client span: error %v, attrs %v, status %q; want UNAVAILABLE -32002", fc.statusError, fc.attrs, fc.statusDetail)
	}
	attempts := find(spans, "meshd", tracepb.Span_SPAN_KIND_CLIENT, "chaos.echo attempt")
	if len(attempts) != 3 {
		t.Fatalf("%d hub attempt spans; want 3 (1 + 2 retries)", len(attempts))
	}
	seen := map[string]bool{}
	for _, a := range attempts {
		seen[a.attrs["agentmesh.attempt"]] = true
		if !a.statusError {
			t.Errorf("attempt span %v not marked as an error", a.attrs)
		}
	}
	if !seen["0"] || !seen["1"] || !seen["2"] {
		t.Errorf("attempt numbers %v; want 0, 1, 2", seen)
	}
	for _, as := range find(spans, "agent-chaos", tracepb.Span_SPAN_KIND_SERVER, "chaos.echo") {
		ok := false
		for _, a := range attempts {
			ok = ok || as.parent == a.id
		}
		if !ok {
			t.Errorf("agent span %s hangs under %s, not under a hub attempt", as.id, as.parent)
		}
	}
}
