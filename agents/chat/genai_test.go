package chat

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/telemetry"
)

// proc is one process's tracing in a test, exporting to its own
// in-memory exporter, so that every span says which process made it.
type proc struct {
	name string
	exp  *tracetest.InMemoryExporter
	p    *telemetry.Provider
}

func newProc(t *testing.T, name string) *proc {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	p, err := telemetry.NewProvider(t.Context(), telemetry.TracingConfig{ServiceName: name, Exporter: exp}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	return &proc{name: name, exp: exp, p: p}
}

type span struct {
	proc string
	tracetest.SpanStub
}

func (s span) String() string {
	return fmt.Sprintf("%s %q %s", s.proc, s.Name, s.SpanKind)
}

func (s span) attr(key string) attribute.Value {
	for _, kv := range s.Attributes {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// TestTurnTrace: a chat turn that calls the mesh_call tool is, in the
// trace of the chat.send that asked for it,
//
//	agent SERVER chat.send
//	└─ invoke_agent main (INTERNAL)
//	   ├─ compact main (INTERNAL)           the context was past its budget
//	   ├─ chat scripted-1 (CLIENT)          finish_reasons [tool_use]
//	   ├─ execute_tool mesh_call (INTERNAL) linked to the call above
//	   │  └─ … hub SERVER echo.echo → hub CLIENT attempt → echo agent SERVER echo.echo
//	   └─ chat scripted-1 (CLIENT)          finish_reasons [end_turn]
//
// with the GenAI attributes, and the model calls observed in
// gen_ai_client_token_usage and gen_ai_client_operation_duration_seconds.
// Two ways: the runtime given its telemetry (SetTelemetry) and a mesh_call
// client without any (meshd --demo's: the tool's request carries the trace
// context itself), and a runtime traced through its agent's server span
// alone with an instrumented mesh_call client (its own call and attempt
// spans between the tool and the hub).
func TestTurnTrace(t *testing.T) {
	for _, tc := range []struct {
		name             string
		setTelemetry     bool
		instrumentedTool bool
	}{
		{"SetTelemetry, plain tool client", true, false},
		{"traced by the agent, instrumented tool client", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, hubP, chatP, echoP := newProc(t, "client"), newProc(t, "hub"), newProc(t, "agent-chat"), newProc(t, "agent-echo")
			procs := []*proc{client, hubP, chatP, echoP}
			m := meshtest.Start(t, hub.Config{}, hub.WithTelemetry(telemetry.New(hubP.p, nil)))
			m.RunAgent(t, agents.NewEcho(agents.WithTelemetry(telemetry.New(echoP.p, nil))))
			var toolOpts []mesh.ClientOption
			if tc.instrumentedTool {
				toolOpts = append(toolOpts, mesh.WithClientTelemetry(telemetry.New(chatP.p, nil)))
			}
			// Count compaction: the second turn starts past 2 messages.
			rt := NewRuntime(Config{DataDir: t.TempDir(), MaxMessages: 2, KeepMessages: 1}, &Scripted{},
				NewTools(MeshCallTool(m.Client(t, toolOpts...), 10*time.Second)))
			t.Cleanup(func() { rt.Close(context.Background()) })
			metrics := telemetry.NewMetrics(nil)
			if tc.setTelemetry {
				rt.SetTelemetry(telemetry.New(chatP.p, metrics))
			}
			m.RunAgent(t, NewService(rt, agents.WithTelemetry(telemetry.New(chatP.p, nil))))

			var trace string
			c := m.Client(t, mesh.WithClientTelemetry(telemetry.New(client.p, nil)), mesh.WithMiddleware(func(next envelope.Invoker) envelope.Invoker {
				return func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
					if req.Method == "chat.send" {
						trace = telemetry.TraceID(ctx)
					}
					return next(ctx, req)
				}
			}))
			call := func(method string, params any, out any) {
				t.Helper()
				if err := c.Call(t.Context(), method, params, out, mesh.CallTimeout(20*time.Second)); err != nil {
					t.Fatalf("%s: %v", method, err)
				}
			}
			call("chat.create", map[string]any{"agent_id": "main"}, nil)
			call("chat.send", map[string]any{"agentId": "main", "content": "hello"}, nil)
			var sent SendResult
			call("chat.send", map[string]any{"agentId": "main", "content": `/call echo.echo {"ping":1}`, "request_id": "r-tool"}, &sent)
			if sent.Content != `Tool mesh_call returned: {"ping":1}` {
				t.Fatalf("the turn answered %q", sent.Content)
			}
			if trace == "" {
				t.Fatal("the chat.send had no trace id")
			}

			// The trace's spans, from every process, once the last (the
			// client's call span) is exported.
			var spans []span
			meshtest.WaitFor(t, 10*time.Second, func() bool {
				spans = spans[:0]
				done := false
				for _, p := range procs {
					if err := p.p.ForceFlush(t.Context()); err != nil {
						t.Fatal(err)
					}
					for _, s := range p.exp.GetSpans() {
						if s.SpanContext.TraceID().String() == trace {
							spans = append(spans, span{p.name, s})
							done = done || (p == client && s.Name == "chat.send" && s.SpanKind == oteltrace.SpanKindInternal)
						}
					}
				}
				return done
			})
			byID := map[oteltrace.SpanID]span{}
			for _, s := range spans {
				byID[s.SpanContext.SpanID()] = s
			}
			kids := func(parent span) []span {
				var out []span
				for _, s := range spans {
					if s.Parent.SpanID() == parent.SpanContext.SpanID() {
						out = append(out, s)
					}
				}
				slices.SortFunc(out, func(a, b span) int { return a.StartTime.Compare(b.StartTime) })
				return out
			}
			var tree strings.Builder
			var draw func(s span, depth int)
			draw = func(s span, depth int) {
				fmt.Fprintf(&tree, "%s%s\n", strings.Repeat("  ", depth), s)
				for _, k := range kids(s) {
					draw(k, depth+1)
				}
			}
			for _, s := range spans {
				if _, ok := byID[s.Parent.SpanID()]; !ok {
					draw(s, 0)
				}
			}
			t.Logf("the trace of chat.send r-tool:\n%s", tree.String())

			one := func(proc, name string, kind oteltrace.SpanKind) span {
				t.Helper()
				var out []span
				for _, s := range spans {
					if s.proc == proc && s.Name == name && s.SpanKind == kind {
						out = append(out, s)
					}
				}
				if len(out) != 1 {
					t.Fatalf("%d spans %s %q %s; want 1", len(out), proc, name, kind)
				}
				return out[0]
			}
			parentOf := func(s span) span { return byID[s.Parent.SpanID()] }
			wantParent := func(child, parent span) {
				t.Helper()
				if child.Parent.SpanID() != parent.SpanContext.SpanID() {
					t.Errorf("%s: parent %s; want %s", child, parentOf(child), parent)
				}
			}
			wantAttr := func(s span, key string, want any) {
				t.Helper()
				if got := s.attr(key).AsInterface(); fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("%s: %s = %v; want %v", s, key, got, want)
				}
			}

			server := one("agent-chat", "chat.send", oteltrace.SpanKindServer)
			turn := one("agent-chat", "invoke_agent main", oteltrace.SpanKindInternal)
			wantParent(turn, server)
			for k, v := range map[string]any{"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": "main", "gen_ai.agent.id": "main",
				"gen_ai.conversation.id": "main", "gen_ai.provider.name": "scripted", "gen_ai.request.model": "scripted-1",
				"gen_ai.response.model": "scripted-1", "agentmesh.chat.request_id": "r-tool"} {
				wantAttr(turn, k, v)
			}
			under := kids(turn)
			var got []string
			for _, s := range under {
				got = append(got, fmt.Sprintf("%s/%s", s.Name, s.SpanKind))
			}
			if want := []string{"compact main/internal", "chat scripted-1/client", "execute_tool mesh_call/internal", "chat scripted-1/client"}; !slices.Equal(got, want) {
				t.Fatalf("the turn's children: %v; want %v", got, want)
			}
			compact, ask, tool, answer := under[0], under[1], under[2], under[3]
			wantAttr(compact, "agentmesh.compaction.reason", "count")
			wantAttr(compact, "agentmesh.compaction.messages_removed", 2)
			wantAttr(compact, "agentmesh.compaction.messages_kept", 1)
			if before, after := compact.attr("agentmesh.compaction.tokens_before").AsInt64(), compact.attr("agentmesh.compaction.tokens_after").AsInt64(); before <= after || after <= 0 {
				t.Errorf("compaction tokens %d → %d; want fewer after", before, after)
			}
			var in, out int64
			for i, s := range []span{ask, answer} {
				for k, v := range map[string]any{"gen_ai.operation.name": "chat", "gen_ai.provider.name": "scripted",
					"gen_ai.request.model": "scripted-1", "gen_ai.response.model": "scripted-1"} {
					wantAttr(s, k, v)
				}
				wantAttr(s, "gen_ai.response.finish_reasons", []string{[]string{StopToolUse, StopEndTurn}[i]})
				i, o := s.attr("gen_ai.usage.input_tokens").AsInt64(), s.attr("gen_ai.usage.output_tokens").AsInt64()
				if i <= 0 || o <= 0 {
					t.Errorf("%s: usage %d in, %d out", s, i, o)
				}
				in, out = in+i, out+o
			}
			wantAttr(turn, "gen_ai.usage.input_tokens", in)
			wantAttr(turn, "gen_ai.usage.output_tokens", out)
			for k, v := range map[string]any{"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "mesh_call", "gen_ai.tool.call.id": "call_1"} {
				wantAttr(tool, k, v)
			}
			if len(tool.Links) != 1 || tool.Links[0].SpanContext.SpanID() != ask.SpanContext.SpanID() {
				t.Errorf("the tool span's links %v; want the model call that asked for it", tool.Links)
			}
			if tool.StartTime.Before(ask.EndTime) || answer.StartTime.Before(tool.EndTime) {
				t.Errorf("tool span not between the model calls")
			}

			// The routed call, under the tool span.
			agentSrv := one("agent-echo", "echo.echo", oteltrace.SpanKindServer)
			chain := []span{agentSrv}
			for s := agentSrv; s.SpanContext.SpanID() != tool.SpanContext.SpanID(); {
				p, ok := byID[s.Parent.SpanID()]
				if !ok {
					t.Fatalf("%s is not under the tool span (its parent %s is not in the trace)", s, s.Parent.SpanID())
				}
				chain = append(chain, p)
				s = p
			}
			var path []string
			for _, s := range slices.Backward(chain) {
				path = append(path, s.String())
			}
			want := []string{`agent-chat "execute_tool mesh_call" internal`}
			if tc.instrumentedTool {
				want = append(want, `agent-chat "echo.echo" internal`, `agent-chat "echo.echo attempt" client`)
			}
			want = append(want, `hub "echo.echo" server`, `hub "echo.echo attempt" client`, `agent-echo "echo.echo" server`)
			if !slices.Equal(path, want) {
				t.Errorf("tool → agent: %v\nwant %v", path, want)
			}

			if !tc.setTelemetry {
				return
			}
			// Three model calls (one in the first turn, two in this one).
			fams, err := metrics.Registry.Gather()
			if err != nil {
				t.Fatal(err)
			}
			series := func(name string, labels map[string]string) *dto.Histogram {
				t.Helper()
				for _, f := range fams {
					if f.GetName() != name {
						continue
					}
				next:
					for _, s := range f.Metric {
						have := map[string]string{}
						for _, lp := range s.Label {
							have[lp.GetName()] = lp.GetValue()
						}
						if len(have) != len(labels) {
							continue
						}
						for k, v := range labels {
							if have[k] != v {
								continue next
							}
						}
						return s.GetHistogram()
					}
				}
				t.Fatalf("no series %s%v", name, labels)
				return nil
			}
			model := map[string]string{"gen_ai_operation_name": "chat", "gen_ai_provider_name": "scripted", "gen_ai_request_model": "scripted-1"}
			with := func(k, v string) map[string]string {
				l := map[string]string{k: v}
				for k, v := range model {
					l[k] = v
				}
				return l
			}
			dur := series("gen_ai_client_operation_duration_seconds", with("error_type", ""))
			inH, outH := series("gen_ai_client_token_usage", with("gen_ai_token_type", "input")), series("gen_ai_client_token_usage", with("gen_ai_token_type", "output"))
			t.Logf("gen_ai_client_operation_duration_seconds%v count %d sum %.6f", with("error_type", ""), dur.GetSampleCount(), dur.GetSampleSum())
			t.Logf("gen_ai_client_token_usage{input} count %d sum %.0f; {output} count %d sum %.0f", inH.GetSampleCount(), inH.GetSampleSum(), outH.GetSampleCount(), outH.GetSampleSum())
			if dur.GetSampleCount() != 3 || inH.GetSampleCount() != 3 || outH.GetSampleCount() != 3 {
				t.Errorf("model calls observed: duration %d, input tokens %d, output tokens %d; want 3 each", dur.GetSampleCount(), inH.GetSampleCount(), outH.GetSampleCount())
			}
			if inH.GetSampleSum() <= float64(in) || outH.GetSampleSum() <= float64(out) {
				t.Errorf("token sums %v in, %v out; want more than this turn's %d, %d", inH.GetSampleSum(), outH.GetSampleSum(), in, out)
			}
			if b := dur.GetBucket(); len(b) != 14 || b[0].GetUpperBound() != 0.01 || b[13].GetUpperBound() != 81.92 {
				t.Errorf("duration buckets %v", b)
			}
			if b := inH.GetBucket(); len(b) != 14 || b[0].GetUpperBound() != 1 || b[13].GetUpperBound() != 67108864 {
				t.Errorf("token buckets %v", b)
			}
			// An exemplar links a bucket to this trace.
			found := false
			for _, b := range inH.GetBucket() {
				for _, lp := range b.GetExemplar().GetLabel() {
					found = found || (lp.GetName() == "trace_id" && lp.GetValue() == trace)
				}
			}
			if !found {
				t.Errorf("no exemplar of trace %s on gen_ai_client_token_usage", trace)
			}
		})
	}
}

// TestTurnTelemetryOff: without tracing, a turn makes no span and the
// instrumentation costs no allocation; the histograms still observe.
func TestTurnTelemetryOff(t *testing.T) {
	metrics := telemetry.NewMetrics(nil)
	rt := NewRuntime(Config{DataDir: t.TempDir()}, &Scripted{Model: "m1"}, NewTools(Tool{
		Spec: ToolSpec{Name: "fail"},
		Run: func(context.Context, ToolCall, json.RawMessage) (string, error) {
			return "", envelope.NewError(envelope.CodeMethodNotFound, "nope")
		},
	}))
	t.Cleanup(func() { rt.Close(context.Background()) })
	rt.SetTelemetry(telemetry.New(nil, metrics))
	rt.SetTelemetry(telemetry.New(nil, metrics)) // twice on one registry: the same histograms
	if _, err := rt.Create("a", ""); err != nil {
		t.Fatal(err)
	}
	res, err := rt.Get("a").Send(t.Context(), "/tool fail {}", "")
	if err != nil || res.Content != "Tool fail returned: METHOD_NOT_FOUND: nope" {
		t.Fatalf("send = %+v, %v", res, err)
	}
	fams, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, f := range fams {
		if strings.HasPrefix(f.GetName(), "gen_ai_") {
			for _, s := range f.Metric {
				var l []string
				for _, lp := range s.Label {
					l = append(l, lp.GetName()+"="+lp.GetValue())
				}
				counts[f.GetName()+"{"+strings.Join(l, ",")+"}"] = s.GetHistogram().GetSampleCount()
			}
		}
	}
	want := map[string]uint64{
		"gen_ai_client_operation_duration_seconds{error_type=,gen_ai_operation_name=chat,gen_ai_provider_name=scripted,gen_ai_request_model=m1}": 2,
		"gen_ai_client_token_usage{gen_ai_operation_name=chat,gen_ai_provider_name=scripted,gen_ai_request_model=m1,gen_ai_token_type=input}":    2,
		"gen_ai_client_token_usage{gen_ai_operation_name=chat,gen_ai_provider_name=scripted,gen_ai_request_model=m1,gen_ai_token_type=output}":   2,
	}
	if fmt.Sprint(counts) != fmt.Sprint(want) {
		t.Errorf("GenAI series: %v\nwant %v", counts, want)
	}

	// Tracing off, and tracing on under a call that is not sampled.
	unsampled := oteltrace.ContextWithSpanContext(t.Context(), oteltrace.NewSpanContext(oteltrace.SpanContextConfig{
		TraceID: oteltrace.TraceID{1}, SpanID: oteltrace.SpanID{1}, Remote: true}))
	traced := newProc(t, "agent-chat")
	for _, c := range []struct {
		name string
		g    *telemetry.GenAI
		ctx  context.Context
	}{
		{"off", telemetry.NewGenAI(telemetry.New(nil, nil)), t.Context()},
		{"not sampled", telemetry.NewGenAI(telemetry.New(traced.p, nil)), unsampled},
	} {
		g, ctx := c.g, c.ctx
		if n := testing.AllocsPerRun(100, func() {
			tctx, turn := g.StartInvokeAgent(ctx, telemetry.GenAIAgent{Name: "a", ID: "a", ConversationID: "a", Provider: "p", RequestModel: "m", RequestID: "r"})
			_, mc := g.StartChat(tctx, "p", "m")
			r := telemetry.ModelResult{ResponseModel: "m", Usage: true, InputTokens: 1, OutputTokens: 1, FinishReason: StopToolUse}
			mc.End(r, nil)
			turn.Add(&r)
			_, tr := g.StartTool(tctx, "t", "c", mc.SpanContext())
			tr.End("", "")
			_, cr := g.StartCompaction(tctx, "a")
			cr.End(telemetry.Compaction{}, nil)
			turn.End(nil)
		}); n != 0 {
			t.Errorf("GenAI instrumentation, tracing %s: %v allocations per turn; want 0", c.name, n)
		}
	}
	if err := traced.p.ForceFlush(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := len(traced.exp.GetSpans()); n != 0 {
		t.Errorf("%d spans under a call not sampled; want none", n)
	}
}
