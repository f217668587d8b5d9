package mesh_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/registry/etcd"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
	"github.com/agentmesh/agentmesh/telemetry"
)

// tracer is one process's tracing, exporting to its own in-memory
// exporter (so that every span says which process made it).
type tracer struct {
	name string
	exp  *tracetest.InMemoryExporter
	p    *telemetry.Provider
}

func newTracer(t *testing.T, name string) *tracer {
	exp := tracetest.NewInMemoryExporter()
	p, err := telemetry.NewProvider(t.Context(), telemetry.TracingConfig{ServiceName: name, Exporter: exp}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	return &tracer{name: name, exp: exp, p: p}
}

func (tr *tracer) tel() *telemetry.Telemetry { return telemetry.New(tr.p, nil) }

// TestTraceAcrossPeerHop: client → hub A → peer link → hub B → agent is
// one trace. The agent is attached to B only and the client to A only, so
// the call crosses the peer link; every process exports its own spans.
// The spans of the call all carry the client's trace id, and each hangs
// under the one before it:
//
//	client call ← client attempt ← A server ← A attempt ← B server ← B attempt ← agent server
//
// so the agent's and B's spans are (transitively) children of A's.
func TestTraceAcrossPeerHop(t *testing.T) {
	srv := etcdtest.Start(t)
	newReg := func() *etcd.Registry {
		reg, err := etcd.New(etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: "/peertrace/"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return reg
	}
	trClient, trA, trB, trAgent := newTracer(t, "client"), newTracer(t, "hub-A"), newTracer(t, "hub-B"), newTracer(t, "agent")
	a := meshtest.StartCluster(t, mesh.HubConfig{ID: "hub-A"}, newReg(), mesh.WithTelemetry(trA.tel()))
	b := meshtest.StartCluster(t, mesh.HubConfig{ID: "hub-B"}, newReg(), mesh.WithTelemetry(trB.tel()))
	b.RunAgent(t, agents.NewEcho(agents.WithID("echo-on-b"), agents.WithTelemetry(trAgent.tel())))
	meshtest.WaitFor(t, 10*time.Second, func() bool { return a.Hub.Registry().Snapshot().Instance("echo-on-b") != nil })

	var trace string
	cl := a.Client(t, mesh.WithClientTelemetry(trClient.tel()), mesh.WithMiddleware(func(next envelope.Invoker) envelope.Invoker {
		return func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
			if req.Method == "echo.echo" {
				trace = telemetry.TraceID(ctx)
			}
			return next(ctx, req)
		}
	}))
	var got string
	if err := cl.Call(t.Context(), "echo.echo", "across the peer link", &got); err != nil || got != "across the peer link" {
		t.Fatalf("echo.echo through A to B's agent = %q, %v", got, err)
	}
	if trace == "" {
		t.Fatal("the client's call had no trace id")
	}

	// The spans of echo.echo, per process, once every process has
	// exported them (the agent and B end theirs before A and the client).
	type sp struct {
		proc string
		tracetest.SpanStub
	}
	var spans []sp
	meshtest.WaitFor(t, 10*time.Second, func() bool {
		spans = spans[:0]
		for _, tr := range []*tracer{trClient, trA, trB, trAgent} {
			if err := tr.p.ForceFlush(t.Context()); err != nil {
				t.Fatal(err)
			}
			for _, s := range tr.exp.GetSpans() {
				if strings.HasPrefix(s.Name, "echo.echo") {
					spans = append(spans, sp{tr.name, s})
				}
			}
		}
		return len(spans) >= 7
	})
	one := func(proc string, kind oteltrace.SpanKind, name string) sp {
		t.Helper()
		var out []sp
		for _, s := range spans {
			if s.proc == proc && s.SpanKind == kind && s.Name == name {
				out = append(out, s)
			}
		}
		if len(out) != 1 {
			for _, s := range spans {
				t.Logf("span %s %s %q trace %s id %s parent %s", s.proc, s.SpanKind, s.Name, s.SpanContext.TraceID(), s.SpanContext.SpanID(), s.Parent.SpanID())
			}
			t.Fatalf("%d %s spans %q from %s; want 1", len(out), kind, name, proc)
		}
		return out[0]
	}
	chain := []sp{
		one("client", oteltrace.SpanKindClient, "echo.echo"),
		one("client", oteltrace.SpanKindClient, "echo.echo attempt"),
		one("hub-A", oteltrace.SpanKindServer, "echo.echo"),
		one("hub-A", oteltrace.SpanKindClient, "echo.echo attempt"),
		one("hub-B", oteltrace.SpanKindServer, "echo.echo"),
		one("hub-B", oteltrace.SpanKindClient, "echo.echo attempt"),
		one("agent", oteltrace.SpanKindServer, "echo.echo"),
	}
	if len(spans) != len(chain) {
		t.Errorf("%d spans of echo.echo; want %d (one per hop and attempt)", len(spans), len(chain))
	}
	desc := func(s sp) string { return s.proc + " " + s.SpanKind.String() + " " + s.Name }
	for i, s := range chain {
		if got := s.SpanContext.TraceID().String(); got != trace {
			t.Errorf("%s: trace %s; want the client's %s", desc(s), got, trace)
		}
		if i == 0 {
			if s.Parent.IsValid() {
				t.Errorf("%s: parent %s; want a root", desc(s), s.Parent.SpanID())
			}
			continue
		}
		if s.Parent.SpanID() != chain[i-1].SpanContext.SpanID() || s.Parent.TraceID() != chain[i-1].SpanContext.TraceID() {
			t.Errorf("%s: parent %s/%s; want %s (%s)", desc(s), s.Parent.TraceID(), s.Parent.SpanID(), chain[i-1].SpanContext.SpanID(), desc(chain[i-1]))
		}
	}
	// Hub A's attempt went to the instance on B, over the peer link.
	var inst string
	for _, kv := range chain[3].Attributes {
		if kv.Key == "agentmesh.instance" {
			inst = kv.Value.AsString()
		}
	}
	if inst != "echo-on-b" {
		t.Errorf("hub A's attempt names instance %q; want echo-on-b", inst)
	}
}
