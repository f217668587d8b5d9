// Package testkit holds the helpers the hub's and the surfaces' tests
// share: a hub with a chat agent, tokens, metric and span readers.
package testkit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/agents/chat"
	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/scenario"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/telemetry"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// HistCount returns the sample count of the histogram series with labels.
func HistCount(t *testing.T, m *telemetry.Metrics, name string, labels map[string]string) uint64 {
	t.Helper()
	if s := series(t, m, name, labels); s != nil {
		return s.GetHistogram().GetSampleCount()
	}
	return 0
}

// GaugeValue returns the value of the gauge series with labels.
func GaugeValue(t *testing.T, m *telemetry.Metrics, name string, labels map[string]string) float64 {
	t.Helper()
	if s := series(t, m, name, labels); s != nil {
		return s.GetGauge().GetValue()
	}
	return 0
}

// series returns the first series of the metric name whose labels
// include labels, or nil.
func series(t *testing.T, m *telemetry.Metrics, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, s := range f.Metric {
			for _, lp := range s.Label {
				if want, ok := labels[lp.GetName()]; ok && want != lp.GetValue() {
					continue next
				}
			}
			return s
		}
	}
	return nil
}

func Keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return SortedStrings(out)
}

func SecuredHub(t *testing.T, sec hub.Security) *meshtest.Mesh {
	t.Helper()
	sec.Key = TestKey
	return meshtest.Start(t, hub.Config{HeartbeatInterval: time.Second, Security: &sec},
		hub.WithTelemetry(telemetry.New(nil, telemetry.NewMetrics(nil))))
}

// SecuredMemHub is SecuredHub on the in-memory network, for a test in a
// synctest bubble.
func SecuredMemHub(t *testing.T, sec hub.Security) *meshtest.InMemory {
	t.Helper()
	sec.Key = TestKey
	return meshtest.StartInMemory(t, hub.Config{HeartbeatInterval: time.Second, Security: &sec},
		hub.WithTelemetry(telemetry.New(nil, telemetry.NewMetrics(nil))))
}

// SpanShapes lists the spans of one trace as "name/kind/status", sorted,
// and checks that its server span is a child of the caller's span parent:
// what the tests comparing a surface's trace with the native call's
// compare.
func SpanShapes(t *testing.T, exp *tracetest.InMemoryExporter, trace, parent string) []string {
	t.Helper()
	var out []string
	for _, sp := range exp.GetSpans() {
		if sp.SpanContext.TraceID().String() != trace {
			continue
		}
		out = append(out, fmt.Sprintf("%s/%s/%s", sp.Name, sp.SpanKind, sp.Status.Code))
		if sp.SpanKind == oteltrace.SpanKindServer && sp.Parent.SpanID().String() != parent {
			t.Errorf("trace %s: server span's parent %s; want the caller's %s", trace, sp.Parent.SpanID(), parent)
		}
	}
	slices.Sort(out)
	return out
}

// StartNexus3 runs a hub with a chat agent (scripted provider, sessions in
// a temporary directory).
func StartNexus3(t *testing.T, hb **hub.Hub, opts ...hub.Option) *meshtest.Mesh {
	t.Helper()
	return StartNexus3With(t, &EssayProvider{}, hb, opts...)
}

func StartNexus3With(t *testing.T, p chat.Provider, hb **hub.Hub, opts ...hub.Option) *meshtest.Mesh {
	t.Helper()
	return StartChatHub(t, p, nil, hb, opts...)
}

// StartChatHub runs a hub with a chat agent of provider p and tools.
func StartChatHub(t *testing.T, p chat.Provider, tools *chat.Tools, hb **hub.Hub, opts ...hub.Option) *meshtest.Mesh {
	t.Helper()
	m := meshtest.Start(t, hub.Config{}, opts...)
	if hb != nil {
		*hb = m.Hub
	}
	rt := chat.NewRuntime(chat.Config{DataDir: t.TempDir()}, p, tools)
	t.Cleanup(func() { rt.Close(context.Background()) })
	m.RunAgent(t, chat.NewService(rt))
	return m
}

func Token(t *testing.T, c auth.Claims, ttl time.Duration) string {
	t.Helper()
	tok, err := auth.Issue(TestKey, c, ttl)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func MustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func IsTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

func MustClient(t *testing.T, url string, opts ...mesh.ClientOption) *mesh.Client {
	t.Helper()
	c, err := mesh.NewClient([]string{url}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func WantCode(t *testing.T, what string, err error, code envelope.Code) {
	t.Helper()
	if got := envelope.CodeOf(err); got != code {
		t.Errorf("%s: got %v (%v), want %v", what, got, err, code)
	}
}

// CountingAgent serves methods and counts the calls it executed.
func CountingAgent(name string, n *atomic.Int64, tok string, methods ...string) *agents.Agent {
	return CountingAgentWith(name, n, tok, nil, methods...)
}

// CountingAgentWith is CountingAgent with the agent's options (an
// in-memory mesh's AgentConn, say).
func CountingAgentWith(name string, n *atomic.Int64, tok string, opts []agents.Option, methods ...string) *agents.Agent {
	a := agents.New(name, append([]agents.Option{agents.WithToken(tok)}, opts...)...)
	for _, m := range methods {
		a.Handle(m, func(ctx context.Context, p json.RawMessage) (any, error) {
			n.Add(1)
			return map[string]string{"authToken": agents.RequestFrom(ctx).Headers.AuthToken}, nil
		})
	}
	return a
}

func SortedStrings(s []string) []string {
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s
}

type EssayProvider struct{ chat.Scripted }

func (p *EssayProvider) Stream(ctx context.Context, req *chat.Request, update func(chat.Content)) (*chat.Message, error) {
	if n := len(req.Messages); n > 0 && chat.TextOf(req.Messages[n-1].Content) == "Write a long essay" {
		update(chat.Content{chat.Text("Once upon a time")})
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return p.Scripted.Stream(ctx, req, update)
}

var TestKey = []byte("0123456789abcdef0123456789abcdef-test-key")

// Pctl returns the p-th percentile (0..100) of ds, or 0 for none.
func Pctl(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p / 100)
	return s[i]
}

// PrintSummary prints a scenario's figures as one JSON line.
func PrintSummary(t *testing.T, v map[string]any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	scenario.Emit(b)
}

// JSONSchema is the part of a JSON Schema the tests read.
type JSONSchema struct {
	Type       string                     `json:"type"`
	Properties map[string]json.RawMessage `json:"properties"`
	Required   []string                   `json:"required"`
}

// MCPConnect connects the official MCP Go SDK's client to the hub's /mcp
// over Streamable HTTP (with a bearer token when tok is set).
func MCPConnect(t *testing.T, m *meshtest.Mesh, tok string) (*mcp.ClientSession, error) {
	t.Helper()
	hc := &http.Client{Transport: http.DefaultTransport, Timeout: 10 * time.Second}
	if tok != "" {
		hc.Transport = bearer{tok, http.DefaultTransport}
	}
	c := mcp.NewClient(&mcp.Implementation{Name: "agentmesh-test", Version: "1"}, nil)
	s, err := c.Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: m.HTTP + "/mcp", HTTPClient: hc, DisableStandaloneSSE: true, MaxRetries: -1}, nil)
	if err == nil {
		t.Cleanup(func() { _ = s.Close() })
	}
	return s, err
}

// bearer adds a token to every request of an HTTP client.
type bearer struct {
	tok  string
	next http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.tok)
	return b.next.RoundTrip(r)
}

// Payload128 is the 128-byte params of the benchmarks.
var Payload128 = json.RawMessage(`{"data":"` + strings.Repeat("x", 128-11) + `"}`)

// Tracing returns an in-memory span exporter and a tracing provider for
// service that exports to it, shut down when the test ends.
func Tracing(t *testing.T, service string) (*tracetest.InMemoryExporter, *telemetry.Provider) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	p, err := telemetry.NewProvider(t.Context(), telemetry.TracingConfig{ServiceName: service, Exporter: exp}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	return exp, p
}
