package cli

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/config"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/telemetry"
)

type ctlFlags struct {
	config  string
	hubs    []string
	timeout time.Duration
	token   string
	tlsCA   string
	tlsCert string
	tlsKey  string
	output  string
	stdin   io.Reader
	stdout  io.Writer
	stderr  io.Writer
}

// NewMeshctl returns the meshctl command tree.
func NewMeshctl(stdin io.Reader, stdout, stderr io.Writer) *cobra.Command {
	g := &ctlFlags{stdin: stdin, stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "meshctl",
		Short: "Call methods on an agentmesh hub, list agents, run agents",
		Long: `meshctl is the CLI tester of agentmesh.

Exit codes: 0 success, 1 the call failed with a coded error, 2 bad usage,
3 no hub could be reached.`,
	}
	pf := root.PersistentFlags()
	pf.StringSliceVar(&g.hubs, "hub", splitList(envOr("MESH_HUB", link.DefaultHubURL)),
		"hub URL(s): ws://host:port/ws or http://host:port/rpc; repeat or comma-separate [$MESH_HUB]")
	pf.StringVar(&g.token, "token", envOr("MESH_TOKEN", ""), "bearer token for hubs started with --auth-key (meshctl token issue) [$MESH_TOKEN]")
	pf.StringVar(&g.tlsCA, "tls-ca", envOr("MESH_TLS_CA", ""), "CA bundle (PEM) that wss:// and https:// hubs must chain to (default: the system's roots) [$MESH_TLS_CA]")
	pf.StringVar(&g.tlsCert, "tls-cert", envOr("MESH_TLS_CERT", ""), "client certificate (PEM) for hubs that require mutual TLS [$MESH_TLS_CERT]")
	pf.StringVar(&g.tlsKey, "tls-key", envOr("MESH_TLS_KEY", ""), "key of --tls-cert [$MESH_TLS_KEY]")
	pf.DurationVar(&g.timeout, "timeout", mesh.DefaultCallTimeout, "call timeout (the method's policy timeout caps it)")
	pf.StringVar(&g.config, "config", envOr("MESH_CONFIG", ""), "YAML file with the client's policies, circuitBreaker, bulkhead, retryBudget [$MESH_CONFIG]")
	root.AddCommand(g.callCmd(), g.streamCmd(), g.agentsCmd(), g.methodsCmd(), g.agentCmd(), g.benchCmd(), g.tokenCmd(), g.chatCmd())
	root.SetOut(stdout)
	root.SetErr(stderr)
	return root
}

// hubList is --hub with each URL trimmed and empty ones dropped
// ("--hub 'a, b'" as well as "--hub a,b").
func (g *ctlFlags) hubList() []string { return splitList(strings.Join(g.hubs, ",")) }

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// tls returns the dialler's TLS configuration (nil when no flag is set).
func (g *ctlFlags) tls() (*tls.Config, error) {
	if g.tlsCA == "" && g.tlsCert == "" && g.tlsKey == "" {
		return nil, nil
	}
	c, err := link.ClientTLS(g.tlsCA, g.tlsCert, g.tlsKey)
	if err != nil {
		return nil, usageErr("%v", err)
	}
	return c, nil
}

func (g *ctlFlags) client(extra ...mesh.ClientOption) (*mesh.Client, error) {
	file, err := config.Load(g.config)
	if err != nil {
		return nil, usageErr("%v", err)
	}
	tlsCfg, err := g.tls()
	if err != nil {
		return nil, err
	}
	opts := append([]mesh.ClientOption{mesh.WithTimeout(g.timeout), mesh.WithOrigin("meshctl"), mesh.WithReliability(file.Config),
		mesh.WithToken(g.token), mesh.WithTLS(tlsCfg)}, extra...)
	c, err := mesh.NewClient(g.hubList(), opts...)
	if err != nil {
		return nil, usageErr("%v", err)
	}
	return c, nil
}

// callErr turns a failed call into the exit code and the stderr line.
func (g *ctlFlags) callErr(err error, pretty bool) error {
	e := envelope.AsError(err)
	if pretty {
		retry := "no"
		switch e.Code.Retry() {
		case envelope.RetryAlways:
			retry = "yes"
		case envelope.RetryIdempotent:
			retry = "only if the method is idempotent"
		}
		fmt.Fprintf(g.stderr, "❌ Error: %s\nCode: %s (%d)\nRetryable: %s\n", e.Message, e.Code, e.Code.JSONRPC(), retry)
	} else {
		fmt.Fprintf(g.stderr, "%s: %s\n", e.Code, e.Message)
	}
	if errors.Is(err, link.ErrHubUnreachable) {
		return withCode(ExitUnreachable, errReported)
	}
	return withCode(ExitError, errReported)
}

// readParams reads PARAMS_JSON: inline JSON, @file, or - for stdin.
func (g *ctlFlags) readParams(arg string) (json.RawMessage, error) {
	var data []byte
	switch {
	case arg == "-":
		b, err := io.ReadAll(io.LimitReader(g.stdin, 64<<20))
		if err != nil {
			return nil, usageErr("reading params from stdin: %v", err)
		}
		data = b
	case strings.HasPrefix(arg, "@"):
		b, err := os.ReadFile(arg[1:])
		if err != nil {
			return nil, usageErr("reading params: %v", err)
		}
		data = b
	default:
		data = []byte(arg)
	}
	data = bytes.TrimSpace(data)
	if !json.Valid(data) {
		return nil, usageErr("params are not valid JSON: %.80s", data)
	}
	return data, nil
}

func (g *ctlFlags) callCmd() *cobra.Command {
	var output string
	var traced bool
	cmd := &cobra.Command{
		Use:   "call METHOD [PARAMS_JSON|@FILE|-]",
		Short: "Call a method and print its result",
		Long: `Call a method and print its result JSON on stdout.

-o json prints the result alone; -o pretty (the default on a terminal) also
reports the latency, or the error's message, code and whether it is retryable.
On an RPC error it prints "CODE: message" on stderr and exits 1; it exits 3
when it cannot reach the hub.`,
		Example: `  meshctl call echo.echo '{"hello":"mesh"}'
  meshctl call memory.put '{"key":"cat","value":"meow"}'
  echo '{"key":"cat"}' | meshctl call memory.get -`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			pretty, err := outputMode(output, g.stdout, "pretty", "json")
			if err != nil {
				return err
			}
			var params json.RawMessage
			if len(args) == 2 {
				if params, err = g.readParams(args[1]); err != nil {
					return err
				}
			}
			var opts []mesh.ClientOption
			var traceID string
			var tp *telemetry.Provider
			endpoint, _ := telemetry.CLIEndpoint()
			if traced {
				// The client's spans go where the hub's and agents' do
				// (OTEL_EXPORTER_OTLP_ENDPOINT), else to the SDKs' default
				// endpoint: a trace id printed is a trace whose root was
				// exported, or the command says it was not.
				tp, err = telemetry.NewProvider(cmd.Context(), telemetry.TracingConfig{ServiceName: "meshctl", Endpoint: endpoint, Force: true, Interactive: true}, nil)
				if err != nil {
					return usageErr("%v", err)
				}
				defer func() {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					_ = tp.Shutdown(ctx)
				}()
				opts = append(opts, mesh.WithClientTelemetry(telemetry.New(tp, nil)), mesh.WithMiddleware(func(next envelope.Invoker) envelope.Invoker {
					return func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
						traceID = telemetry.TraceID(ctx)
						return next(ctx, req)
					}
				}))
			}
			c, err := g.client(opts...)
			if err != nil {
				return err
			}
			defer c.Close()
			var result json.RawMessage
			var res envelope.Response
			start := time.Now()
			err = c.Call(cmd.Context(), args[0], params, &result, mesh.ResponseInto(&res), mesh.CallTimeout(g.timeout))
			if traced && traceID != "" {
				fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				if ferr := tp.ForceFlush(fctx); ferr != nil {
					fmt.Fprintf(g.stderr, "the client's spans were not exported to %s (%v): set OTEL_EXPORTER_OTLP_ENDPOINT to your collector (Jaeger's OTLP/HTTP port)\n", endpoint, ferr)
				}
				cancel()
				fmt.Fprintf(g.stderr, "trace_id: %s\n", traceID)
				if u := os.Getenv("MESH_JAEGER_URL"); u != "" {
					fmt.Fprintf(g.stderr, "jaeger: %s/trace/%s\n", strings.TrimSuffix(u, "/"), traceID)
				}
			}
			if err != nil {
				return g.callErr(err, pretty)
			}
			if !pretty {
				fmt.Fprintf(g.stdout, "%s\n", result)
				return nil
			}
			var ind bytes.Buffer
			if json.Indent(&ind, result, "", "  ") != nil {
				ind.Write(result)
			}
			fmt.Fprintf(g.stdout, "✅ Success (%s)\nResult: %s\n", time.Since(start).Round(10*time.Microsecond), ind.String())
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "json or pretty (default: pretty on a terminal, else json)")
	cmd.Flags().BoolVar(&traced, "trace", false, "trace the call and print its trace id on stderr (a Jaeger link when $MESH_JAEGER_URL is set)")
	return cmd
}

// outputMode resolves -o: "" picks the first choice on a terminal, the
// second otherwise. It reports whether the first (human) form was chosen.
func outputMode(o string, w io.Writer, human, machine string) (bool, error) {
	switch o {
	case "":
		return isTerminal(w), nil
	case human:
		return true, nil
	case machine:
		return false, nil
	}
	return false, usageErr("-o must be %s or %s", human, machine)
}

func (g *ctlFlags) agentCmd() *cobra.Command {
	agent := &cobra.Command{Use: "agent", Short: "Run a built-in agent"}
	var (
		id, logLevel, metricsAddr string
		chaos                     agents.ChaosConfig
		failCode                  string
		drain, linkPing           time.Duration
		chatFlags                 chatAgentFlags
		instances                 int
		chaosLedger               string
	)
	run := &cobra.Command{
		Use:   "run echo|kv|chaos|chat",
		Short: "Run a built-in agent against the hub until interrupted",
		Long: `Run a built-in agent: it registers with the hub, heartbeats, reconnects
with backoff when the link drops, and deregisters on SIGINT/SIGTERM.

  echo   echo.echo returns its params; echo.sleep {ms} sleeps
  kv     memory.put/get/delete/query on an in-memory store
  chaos  chaos.echo with injected faults; chaos.executions counts executions per request id
  chat   chat.* : a pool of chat agents (sessions on disk, streamed turns, tools); see meshctl chat`,
		Args:      cobra.ExactArgs(1),
		ValidArgs: []string{"echo", "kv", "chaos", "chat"},
		RunE: func(cmd *cobra.Command, args []string) error {
			log, err := telemetry.NewLogger(g.stderr, logLevel)
			if err != nil {
				return usageErr("%v", err)
			}
			if id == "" {
				id = envelope.NewID()
			}
			tlsCfg, err := g.tls()
			if err != nil {
				return err
			}
			tp, err := telemetry.NewProvider(cmd.Context(), telemetry.TracingConfig{ServiceName: "agent-" + args[0], InstanceID: id, Version: envelope.Version}, log)
			if err != nil {
				return usageErr("%v", err)
			}
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = tp.Shutdown(ctx) // flush the last spans
			}()
			var metrics *telemetry.Metrics
			if metricsAddr != "" {
				metrics = telemetry.NewMetrics(nil)
				stop, err := serveMetrics(metricsAddr, metrics, log)
				if err != nil {
					return withCode(ExitError, err)
				}
				defer stop()
			}
			if instances < 1 || instances > 10000 {
				return usageErr("--instances must be within 1..10000")
			}
			if args[0] == "chat" && instances > 1 {
				return usageErr("--instances: one chat runtime per process (it holds the whole pool)")
			}
			var failCodeV envelope.Code
			if args[0] == "chaos" {
				if failCode != "" {
					c, ok := envelope.ParseCode(failCode)
					if !ok || c == envelope.CodeOK {
						return usageErr("--fail-code %q is not an error code", failCode)
					}
					failCodeV = c
				}
				if chaos.FailRate < 0 || chaos.FailRate > 1 || chaos.HangRate < 0 || chaos.HangRate > 1 {
					return usageErr("--fail-rate and --hang-rate must be within 0..1")
				}
			}
			var closers []func()
			defer func() {
				for _, c := range closers {
					c()
				}
			}()
			newAgent := func(id string) (*agents.Agent, error) {
				opts := []agents.Option{agents.WithLogger(log), agents.WithDrainTimeout(drain), agents.WithID(id), agents.WithToken(g.token),
					agents.WithTelemetry(telemetry.New(tp, metrics)), agents.WithConnConfig(link.Config{PingInterval: linkPing, TLS: tlsCfg})}
				switch args[0] {
				case "echo":
					return agents.NewEcho(opts...), nil
				case "kv":
					return agents.NewKV(opts...), nil
				case "chaos":
					cfg := chaos
					if failCodeV != envelope.CodeOK {
						cfg.FailCode = failCodeV
					}
					cfg.Crash = func() {
						log.Error("chaos: crashing on purpose (--crash-after)")
						os.Exit(ExitError)
					}
					if chaosLedger != "" {
						// One line per execution, appended by one write(2):
						// it survives a SIGKILL of this process.
						f, err := os.OpenFile(chaosLedger, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
						if err != nil {
							return nil, usageErr("--ledger: %v", err)
						}
						closers = append(closers, func() { _ = f.Close() })
						cfg.Ledger = f
					}
					return agents.NewChaos(cfg, opts...), nil
				case "chat":
					chatAgent, closeChat, err := g.newChatAgent(&chatFlags, log, telemetry.New(tp, metrics), opts...)
					if err != nil {
						return nil, err
					}
					closers = append(closers, closeChat)
					return chatAgent, nil
				}
				return nil, usageErr("unknown agent %q: want echo, kv, chaos or chat", args[0])
			}

			// --instances N runs N agents in this process, each with its
			// own link and registration: "<id>-0" … "<id>-N-1".
			list := make([]*agents.Agent, 0, instances)
			for k := range instances {
				aid := id
				if instances > 1 {
					aid = fmt.Sprintf("%s-%d", id, k)
				}
				a, err := newAgent(aid)
				if err != nil {
					return err
				}
				list = append(list, a)
			}
			metrics.RegisterPending("agent", func() int {
				n := 0
				for _, a := range list {
					n += a.Pending()
				}
				return n
			})
			if len(list) == 1 {
				return list[0].Run(cmd.Context(), g.hubList()...)
			}
			errs := make([]error, len(list))
			var wg sync.WaitGroup
			for k, a := range list {
				wg.Go(func() { errs[k] = a.Run(cmd.Context(), g.hubList()...) })
			}
			wg.Wait()
			return errors.Join(errs...)
		},
	}
	f := run.Flags()
	f.StringVar(&id, "id", "", "agent instance id (default: a new UUIDv7)")
	f.StringVar(&metricsAddr, "metrics-addr", "", "serve Prometheus /metrics on this address, e.g. 127.0.0.1:9465 (default: off)")
	f.StringVar(&logLevel, "log-level", envOr("MESH_LOG_LEVEL", "info"), "debug, info, warn or error")
	f.DurationVar(&drain, "drain-timeout", 5*time.Second, "how long to wait for handlers in flight on shutdown")
	f.DurationVar(&linkPing, "link-ping", 5*time.Second, "WebSocket ping interval of the hub link; silent for 2 intervals, it is dead and redialled")
	f.Float64Var(&chaos.FailRate, "fail-rate", 0, "chaos: share of calls that fail (0..1)")
	f.StringVar(&failCode, "fail-code", "UNAVAILABLE", "chaos: the code of injected failures")
	f.DurationVar(&chaos.Latency, "latency", 0, "chaos: latency added to every call")
	f.DurationVar(&chaos.Jitter, "jitter", 0, "chaos: up to this much more latency, at random")
	f.Float64Var(&chaos.HangRate, "hang-rate", 0, "chaos: share of calls that never answer (0..1)")
	f.IntVar(&instances, "instances", 1, "run this many agent instances in this process, each with its own link (ids <id>-0 … <id>-N-1)")
	f.StringVar(&chaosLedger, "ledger", "", "chaos: append the request id of every execution of chaos.echo to this file (for duplicate checks across crashes)")
	f.IntVar(&chaos.CrashAfter, "crash-after", 0, "chaos: exit abruptly after this many executions (0: never)")
	chatFlags.register(run)
	agent.AddCommand(run)
	return agent
}

// serveMetrics serves /metrics on addr until stop is called.
func serveMetrics(addr string, m *telemetry.Metrics, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() { _ = srv.Serve(ln); close(done) }()
	log.Info("metrics listening", "addr", ln.Addr().String())
	return func() { _ = srv.Close(); <-done }, nil
}
