package hub_test

import (
	"context"
	"encoding/json"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/telemetry"
)

// BenchmarkTelemetry measures a routed call (client → hub → echo agent)
// with no telemetry at all, with tracing off but metrics on (meshd's
// default), and with tracing on at 100 % and 1 % sampling (the real SDK
// and batch processor, exporting to a discarding exporter).
//
//	go test -run '^$' -bench Telemetry -benchmem -count 6 ./mesh | tee tel.txt
func BenchmarkTelemetry(b *testing.B) {
	modes := []struct {
		name    string
		ratio   float64 // 0: tracing off
		tracing bool
		metrics bool
	}{
		{"none", 0, false, false},
		{"off", 0, false, true},
		{"on-100%", 1, true, true},
		{"on-1%", 0.01, true, true},
	}
	for _, md := range modes {
		b.Run(md.name, func(b *testing.B) {
			mk := func(service string) *telemetry.Telemetry {
				if !md.tracing && !md.metrics {
					return nil
				}
				var p *telemetry.Provider
				if md.tracing {
					var err error
					p, err = telemetry.NewProvider(context.Background(), telemetry.TracingConfig{
						ServiceName: service, SampleRatio: md.ratio, Exporter: tracetest.NewNoopExporter()}, nil)
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { _ = p.Shutdown(context.Background()) })
				}
				var m *telemetry.Metrics
				if md.metrics {
					m = telemetry.NewMetrics(nil)
				}
				return telemetry.New(p, m)
			}
			// In memory: what one hop's instrumentation costs, without the
			// network's noise.
			b.Run("hop-in-memory", func(b *testing.B) {
				tel := mk("client")
				inv := tel.Server(tel.Client(tel.Attempt(func(_ context.Context, req *envelope.Request) (*envelope.Response, error) {
					return &envelope.Response{ID: req.ID, Result: req.Params}, nil
				})))
				req := &envelope.Request{ID: "r", Method: "echo.echo", Params: testkit.Payload128}
				b.ReportAllocs()
				for b.Loop() {
					if _, err := inv(context.Background(), req); err != nil {
						b.Fatal(err)
					}
				}
			})
			m := meshtest.Start(b, hub.Config{}, hub.WithTelemetry(mk("meshd")))
			m.RunAgent(b, agents.NewEcho(agents.WithTelemetry(mk("agent"))))
			c := m.Client(b, mesh.WithClientTelemetry(mk("client")))
			var out json.RawMessage
			ctx := context.Background()
			b.Run("routed", func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					if err := c.Call(ctx, "echo.echo", testkit.Payload128, &out); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
