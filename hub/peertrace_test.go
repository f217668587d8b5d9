package hub_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/registry/etcd"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
	"github.com/agentmesh/agentmesh/reliability"
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
	exp, p := testkit.Tracing(t, name)
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
	a := meshtest.StartCluster(t, hub.Config{ID: "hub-A"}, newReg(), hub.WithTelemetry(trA.tel()))
	b := meshtest.StartCluster(t, hub.Config{ID: "hub-B"}, newReg(), hub.WithTelemetry(trB.tel()))
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
		one("client", oteltrace.SpanKindInternal, "echo.echo"),
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

// ttlAttr returns a span's agentmesh.ttl_ms (the ttl header its server
// received), or -1.
func ttlAttr(s tracetest.SpanStub) int64 {
	for _, kv := range s.Attributes {
		if kv.Key == "agentmesh.ttl_ms" {
			return kv.Value.AsInt64()
		}
	}
	return -1
}

// TestTTLShrinksAcrossPeerHop: client → hub A → peer link → hub B →
// agent; each hub forwards the ttl it received minus the time it held the
// call (DESIGN: "each hop subtracts what it spent"). Hub A's bulkhead lets
// one ttl.work call run at a time, so a second call waits in A's queue
// while the first is held at the agent: that wait must come off the ttl B
// and the agent see. Checked on the spans: a server span records the ttl
// it received; a hub held the call from its server span's start to the
// start of the attempt that went on. The ttl is relative, so time on the
// wire is not (cannot be) subtracted; the bound allows 1 ms for clock
// reading.
func TestTTLShrinksAcrossPeerHop(t *testing.T) {
	srv := etcdtest.Start(t)
	newReg := func() *etcd.Registry {
		reg, err := etcd.New(etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: "/peerttl/"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return reg
	}
	trA, trB, trAgent := newTracer(t, "hub-A"), newTracer(t, "hub-B"), newTracer(t, "agent")
	rc := reliability.DefaultConfig()
	rc.Bulkhead = reliability.BulkheadConfig{MaxConcurrent: 1, QueueSize: 10, QueueTimeout: 20 * time.Second}
	a := meshtest.StartCluster(t, hub.Config{ID: "hub-A", Reliability: &rc}, newReg(), hub.WithTelemetry(trA.tel()))
	b := meshtest.StartCluster(t, hub.Config{ID: "hub-B"}, newReg(), hub.WithTelemetry(trB.tel()))
	held, release := make(chan struct{}, 1), make(chan struct{})
	ag := agents.New("ttl", agents.WithID("ttl-on-b"), agents.WithTelemetry(trAgent.tel()))
	ag.Handle("ttl.work", func(ctx context.Context, p json.RawMessage) (any, error) {
		if string(p) == `"hold"` {
			held <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return "done", nil
	})
	b.RunAgent(t, ag)
	meshtest.WaitFor(t, 10*time.Second, func() bool { return a.Hub.Registry().Snapshot().Instance("ttl-on-b") != nil })

	cl := a.Client(t, mesh.WithoutReliability())
	errs := make(chan error, 2)
	call := func(p string) {
		// Under the method's policy timeout (10 s), which would cap the
		// ttl A forwards by itself.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		errs <- cl.Call(ctx, "ttl.work", p, nil)
	}
	go call("hold")
	select {
	case <-held:
	case err := <-errs:
		t.Fatalf("the first call ended before reaching the agent: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the first call did not reach the agent within 10 s")
	}
	go call("queued") // waits in A's bulkhead behind the held call
	time.Sleep(300 * time.Millisecond)
	close(release)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("ttl.work: %v", err)
		}
	}

	// Per process, the spans of ttl.work by kind and name.
	byID := map[oteltrace.SpanID]tracetest.SpanStub{}
	var agentSpans []tracetest.SpanStub
	meshtest.WaitFor(t, 10*time.Second, func() bool {
		clear(byID)
		agentSpans = agentSpans[:0]
		for _, tr := range []*tracer{trA, trB, trAgent} {
			if err := tr.p.ForceFlush(t.Context()); err != nil {
				t.Fatal(err)
			}
			for _, s := range tr.exp.GetSpans() {
				if !strings.HasPrefix(s.Name, "ttl.work") {
					continue
				}
				byID[s.SpanContext.SpanID()] = s
				if tr == trAgent {
					agentSpans = append(agentSpans, s)
				}
			}
		}
		return len(agentSpans) == 2 && len(byID) == 2*5
	})
	const tol = time.Millisecond
	maxHeld := time.Duration(0)
	for _, ags := range agentSpans {
		// agent server ← B attempt ← B server ← A attempt ← A server
		bAtt, ok1 := byID[ags.Parent.SpanID()]
		bSrv, ok2 := byID[bAtt.Parent.SpanID()]
		aAtt, ok3 := byID[bSrv.Parent.SpanID()]
		aSrv, ok4 := byID[aAtt.Parent.SpanID()]
		if !ok1 || !ok2 || !ok3 || !ok4 || aSrv.SpanKind != oteltrace.SpanKindServer || bSrv.SpanKind != oteltrace.SpanKindServer {
			t.Fatalf("the agent's span %s does not hang under B's and A's spans", ags.SpanContext.SpanID())
		}
		ttlA, ttlB, ttlAgent := ttlAttr(aSrv), ttlAttr(bSrv), ttlAttr(ags)
		heldA, heldB := aAtt.StartTime.Sub(aSrv.StartTime), bAtt.StartTime.Sub(bSrv.StartTime)
		maxHeld = max(maxHeld, heldA)
		t.Logf("ttl at A %d ms, held %v; at B %d ms, held %v; at the agent %d ms", ttlA, heldA, ttlB, heldB, ttlAgent)
		if ttlA <= 0 || ttlB <= 0 || ttlAgent <= 0 {
			t.Errorf("a server saw no ttl: A %d, B %d, agent %d", ttlA, ttlB, ttlAgent)
			continue
		}
		if got, limit := time.Duration(ttlB)*time.Millisecond, time.Duration(ttlA)*time.Millisecond-heldA+tol; got > limit {
			t.Errorf("B received ttl %v; want <= A's %d ms minus the %v A held the call (+1 ms)", got, ttlA, heldA)
		}
		if got, limit := time.Duration(ttlAgent)*time.Millisecond, time.Duration(ttlB)*time.Millisecond-heldB+tol; got > limit {
			t.Errorf("the agent received ttl %v; want <= B's %d ms minus the %v B held the call (+1 ms)", got, ttlB, heldB)
		}
	}
	t.Logf("longest hold at hub A: %v (the queued call)", maxHeld)
}
