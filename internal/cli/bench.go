package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/bench"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/stream"
	"github.com/agentmesh/agentmesh/telemetry"
)

// ExitSLO is the exit code when a --fail-on bound is broken (k6's 99).
const ExitSLO = 99

func (g *ctlFlags) benchCmd() *cobra.Command {
	var (
		cfg                          bench.Config
		conns                        int
		output, compare, failOn, hdr string
		metricsAddr, cpuProfile      string
		streamed                     bool
		window                       int
	)
	cmd := &cobra.Command{
		Use:   "bench METHOD [PARAMS_JSON|@FILE|-]",
		Short: "Load-test a method and report throughput, latency percentiles and errors by code",
		Long: `Load-test a method through the hub.

Closed loop by default: -c workers call back to back. With --rps it is an open
loop: calls start on a fixed schedule and latency counts from each call's
intended start time, so a stall is not hidden (coordinated omission); -c then
bounds the calls in flight, and late sends are reported.

The report has count, successes, errors by code, requests/s, p50/p90/p95/p99/
p99.9/max, a latency histogram and the trace ids of the slowest calls (as
Jaeger links when $MESH_JAEGER_URL is set). -o json writes a machine-readable
report (ghz/vegeta field names); --compare OLD.json prints the deltas;
--fail-on 'p99>20ms,errors>0.1%' exits 99 when a bound is broken.

--stream calls a streaming method: each call is one stream read to its end
(its latency is the whole stream's), and the report adds the chunks, chunks/s,
MB/s and the time to first chunk.`,
		Example: `  meshctl bench echo.echo '{"data":"hello"}' -c 16 -n 20000
  meshctl bench echo.echo -d 10s --rps 2000 -c 256 --fail-on 'p99>5ms,errors>0'
  meshctl bench memory.get '{"key":"cat"}' -d 5s -o json > run.json
  meshctl bench echo.stream '{"n":1000,"size":128}' --stream -c 4 -d 10s`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg.Method = args[0]
			if len(args) == 2 {
				p, err := g.readParams(args[1])
				if err != nil {
					return err
				}
				cfg.Params = p
			}
			if cfg.Total < 0 || cfg.Duration < 0 || cfg.RPS < 0 || conns < 1 || cfg.Concurrency < 1 {
				return usageErr("-c, -n, -d, --rps and --connections must be positive")
			}
			if cfg.Total == 0 && cfg.Duration == 0 {
				cfg.Total = 200
			}
			cfg.Timeout = g.timeout
			var bounds []bench.Bound
			if failOn != "" {
				b, err := bench.ParseBounds(failOn)
				if err != nil {
					return usageErr("%v", err)
				}
				bounds = b
			}
			if output != "text" && output != "json" {
				return usageErr("-o must be text or json")
			}
			var old *bench.Report
			if compare != "" {
				f, err := os.Open(compare)
				if err != nil {
					return usageErr("--compare: %v", err)
				}
				old, err = bench.ReadReport(f)
				f.Close()
				if err != nil {
					return usageErr("--compare %s: %v", compare, err)
				}
			}
			var tel *telemetry.Telemetry
			if metricsAddr != "" {
				m := telemetry.NewMetrics(nil)
				tel = telemetry.New(nil, m)
				log, _ := telemetry.NewLogger(g.stderr, "warn")
				stop, err := serveMetrics(metricsAddr, m, log)
				if err != nil {
					return withCode(ExitError, err)
				}
				defer stop()
			}
			clients := make([]*mesh.Client, conns)
			for i := range clients {
				var opts []mesh.ClientOption
				if tel != nil {
					opts = append(opts, mesh.WithClientTelemetry(tel))
				}
				c, err := g.client(opts...)
				if err != nil {
					return err
				}
				defer c.Close()
				clients[i] = c
				// Every connection up before the clock starts.
				if err := c.Call(cmd.Context(), "mesh.ping", nil, nil, mesh.CallTimeout(g.timeout)); err != nil {
					return g.callErr(err, false)
				}
			}
			if isTerminal(g.stderr) {
				cfg.Progress = func(p bench.Progress) {
					fmt.Fprintf(g.stderr, "\r  %5.1fs  sent %d (%.0f/s)  ok %d  errors %d  p99 %v   ",
						p.Elapsed.Seconds(), p.Sent, float64(p.Sent)/p.Elapsed.Seconds(), p.OK, p.Errors, p.P99.Round(time.Microsecond))
				}
			}
			if cpuProfile != "" {
				f, err := os.Create(cpuProfile)
				if err != nil {
					return withCode(ExitError, err)
				}
				if err := pprof.StartCPUProfile(f); err != nil {
					f.Close()
					return withCode(ExitError, err)
				}
				defer func() { pprof.StopCPUProfile(); f.Close() }()
			}
			call := func(ctx context.Context, i int, req *envelope.Request) error {
				_, err := clients[i].Invoke(ctx, req)
				return err
			}
			var st *bench.StreamStats
			if streamed {
				st = bench.NewStreamStats()
				call = streamInvoker(clients, window, st)
				if !cmd.Flags().Changed("timeout") {
					cfg.Timeout = stream.DefaultTimeout
				}
			}
			rep, err := bench.Run(cmd.Context(), cfg, conns, call)
			if err == nil && st != nil {
				rep.Stream = st.Report(time.Duration(rep.TotalSeconds * float64(time.Second)))
			}
			if cfg.Progress != nil {
				fmt.Fprintln(g.stderr)
			}
			if err != nil {
				return usageErr("%v", err)
			}
			g.exportSlowest(cmd.Context(), rep)
			if hdr != "" {
				f, err := os.Create(hdr)
				if err != nil {
					return withCode(ExitError, err)
				}
				err = rep.WriteHDR(f)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
				if err != nil {
					return withCode(ExitError, err)
				}
			}
			if output == "json" {
				enc := json.NewEncoder(g.stdout)
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep); err != nil {
					return withCode(ExitError, err)
				}
			} else {
				rep.Print(g.stdout, os.Getenv("MESH_JAEGER_URL"))
			}
			if old != nil {
				out := g.stdout
				if output == "json" {
					out = g.stderr // keep stdout a valid JSON document
				}
				rep.Compare(out, old)
			}
			if broken := rep.Broken(bounds); len(broken) > 0 {
				fmt.Fprintf(g.stderr, "SLO broken: %s\n", strings.Join(broken, ", "))
				return withCode(ExitSLO, errReported)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVarP(&cfg.Concurrency, "concurrency", "c", 10, "workers (closed loop) or calls in flight at most (open loop)")
	f.IntVarP(&cfg.Total, "total", "n", 0, "calls to make (default 200 when -d is not given)")
	f.DurationVarP(&cfg.Duration, "duration", "d", 0, "how long to run")
	f.Float64Var(&cfg.RPS, "rps", 0, "open loop at this many calls per second (0: closed loop)")
	f.IntVar(&conns, "connections", 1, "hub connections the calls are spread over")
	f.DurationVar(&cfg.Warmup, "warmup", 0, "calls made first for this long, not counted")
	f.IntVar(&cfg.Slowest, "slowest", 5, "how many of the slowest calls' trace ids to print")
	f.StringVarP(&output, "output", "o", "text", "text or json")
	f.StringVar(&compare, "compare", "", "an earlier -o json report to compare with")
	f.StringVar(&failOn, "fail-on", "", "bounds such as 'p99>20ms,errors>0.1%': exit 99 when one is broken")
	f.StringVar(&hdr, "hdr-out", "", "write the latency percentiles in HdrHistogram's format to this file")
	f.StringVar(&metricsAddr, "metrics-addr", "", "serve the client's Prometheus /metrics here during the run")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write the client's CPU profile (pprof) for the run to this file")
	f.BoolVar(&streamed, "stream", false, "call METHOD as a stream: each call reads a whole stream; adds chunks/s, MB/s and the time to first chunk")
	f.IntVar(&window, "window", stream.DefaultWindow, "with --stream: each stream's credit, in chunks")
	return cmd
}

// exportSlowest writes the client spans of the slowest calls, whose trace
// ids the report shows, so that each id opens a trace rooted at the
// bench's own span, as long as the bench measured the call (tail
// sampling: every call carried a sampled trace context; only these spans
// are written). It says on stderr where they went, or that nothing took
// them.
func (g *ctlFlags) exportSlowest(ctx context.Context, rep *bench.Report) {
	if len(rep.Slowest) == 0 {
		return
	}
	spans := make([]telemetry.ClientSpan, 0, len(rep.Slowest))
	for _, s := range rep.Slowest {
		code, _ := envelope.ParseCode(s.Code)
		spans = append(spans, telemetry.ClientSpan{TraceID: s.TraceID, SpanID: s.SpanID, Method: rep.Method, RequestID: s.RequestID,
			Start: s.Start, End: s.Start.Add(time.Duration(s.LatencyMs * float64(time.Millisecond))), Code: code})
	}
	if telemetry.Disabled() {
		return // OTEL_SDK_DISABLED: the ids are the calls', no span is written
	}
	endpoint, _ := telemetry.CLIEndpoint()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := telemetry.ExportClientSpans(ctx, telemetry.TracingConfig{ServiceName: "meshctl", Endpoint: endpoint}, spans); err != nil {
		fmt.Fprintf(g.stderr, "the slowest calls' client spans were not exported to %s (%v): set OTEL_EXPORTER_OTLP_ENDPOINT to your collector (Jaeger's OTLP/HTTP port)\n", endpoint, err)
		return
	}
	fmt.Fprintf(g.stderr, "the slowest calls' client spans went to %s (service meshctl)\n", endpoint)
}
