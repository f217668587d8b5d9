package hub_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/telemetry"
)

func labelValues(t *testing.T, m *telemetry.Metrics, name, label string) []string {
	t.Helper()
	fams, _ := m.Registry.Gather()
	var out []string
	for _, f := range fams {
		if f.GetName() == name {
			for _, s := range f.Metric {
				for _, lp := range s.Label {
					if lp.GetName() == label {
						out = append(out, lp.GetValue())
					}
				}
			}
		}
	}
	return out
}

func TestMetrics(t *testing.T) {
	var hb *hub.Hub
	labels := telemetry.NewLabeler(func(m string) bool { return hb.KnownMethod(m) })
	metrics := telemetry.NewMetrics(labels)
	m := meshtest.Start(t, hub.Config{}, hub.WithTelemetry(telemetry.New(nil, metrics)))
	hb = m.Hub
	m.RunAgent(t, agents.NewEcho())
	c := m.Client(t, mesh.WithoutReliability())
	for range 5 {
		if err := c.Call(t.Context(), "echo.echo", 1, nil); err != nil {
			t.Fatal(err)
		}
	}
	// A caller sending random method names must not create series.
	for i := range 50 {
		if err := c.Call(t.Context(), fmt.Sprintf("junk.%d", i), nil, nil); envelope.CodeOf(err) != envelope.CodeMethodNotFound {
			t.Fatalf("junk call: %v", err)
		}
	}
	if got := testkit.HistCount(t, metrics, "rpc_server_call_duration_seconds", map[string]string{"rpc_method": "echo.echo", "rpc_response_status_code": ""}); got != 5 {
		t.Errorf("successful echo.echo calls counted %d; want 5", got)
	}
	if got := testkit.HistCount(t, metrics, "rpc_server_call_duration_seconds", map[string]string{"rpc_method": "_OTHER", "rpc_response_status_code": "-32601"}); got != 50 {
		t.Errorf("unknown-method calls under _OTHER/-32601 counted %d; want 50", got)
	}
	for _, v := range labelValues(t, metrics, "rpc_server_call_duration_seconds", "rpc_method") {
		if strings.HasPrefix(v, "junk.") {
			t.Fatalf("a caller's method name %q became a label value", v)
		}
	}
	problems, err := testutil.GatherAndLint(metrics.Registry)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	// /metrics serves them, registry and link gauges included.
	res, err := http.Get(m.HTTP + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{`agentmesh_registry_agents{state="ready"} 1`, `agentmesh_links{kind="agent"} 1`, "agentmesh_link_bytes_total", "go_goroutines", `agentmesh_pending_requests{side="hub"} 0`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
