package cli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/config"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/registry/etcd"
	"github.com/agentmesh/agentmesh/telemetry"
)

// NewMeshd returns the meshd command.
func NewMeshd(stdout, stderr io.Writer) *cobra.Command {
	var (
		listen, id, logLevel, conf string
		logFormat, otlpEndpoint    string
		adminAddr                  string
		regKind, etcdPrefix        string
		advertise                  string
		etcdEndpoints              []string
		sampleRatio                float64
		demo                       bool
		heartbeat, defTimeout, dur time.Duration
		peerHeartbeat              time.Duration
	)
	cmd := &cobra.Command{
		Use:   "meshd",
		Short: "Run an agentmesh hub",
		Long: `meshd runs a hub: agents register with it and clients call methods through it.

It serves POST /rpc (JSON-RPC 2.0), GET /ws (WebSocket: native envelope frames
with subprotocol agentmesh.v1, or plain JSON-RPC 2.0), /healthz, /livez and /readyz.
On SIGINT or SIGTERM it stops taking calls, drains the ones in flight
(--drain-timeout) and exits.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := telemetry.NewLoggerFormat(stderr, logLevel, logFormat)
			if err != nil {
				return usageErr("%v", err)
			}
			if id == "" {
				id = envelope.NewID()
			}
			tp, err := telemetry.NewProvider(cmd.Context(), telemetry.TracingConfig{
				ServiceName: "meshd", InstanceID: id, Version: envelope.Version, Endpoint: otlpEndpoint, SampleRatio: sampleRatio,
			}, log)
			if err != nil {
				return usageErr("%v", err)
			}
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = tp.Shutdown(ctx) // flush the last spans
			}()
			hubID := id
			var hub *mesh.Hub
			labels := telemetry.NewLabeler(func(m string) bool { return hub != nil && hub.KnownMethod(m) })
			tel := telemetry.New(tp, telemetry.NewMetrics(labels))
			file, err := config.Load(conf)
			if err != nil {
				return usageErr("%v", err)
			}
			hubOpts := []mesh.HubOption{mesh.WithLogger(log), mesh.WithTelemetry(tel)}
			switch regKind {
			case "memory":
			case "etcd":
				reg, err := etcd.New(etcd.Config{Endpoints: etcdEndpoints, Prefix: etcdPrefix}, log)
				if err != nil {
					return usageErr("%v", err)
				}
				defer reg.Close()
				hubOpts = append(hubOpts, mesh.WithRegistry(reg))
				log.Info("registry: etcd", "endpoints", etcdEndpoints, "prefix", etcdPrefix)
			default:
				return usageErr("--registry must be memory or etcd, not %q", regKind)
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return withCode(ExitError, fmt.Errorf("listen on %s: %w", listen, err))
			}
			if advertise == "" {
				advertise = ln.Addr().String() // the real port, also with --listen :0
			}
			hub, err = mesh.NewHub(mesh.HubConfig{
				ID: hubID, HeartbeatInterval: heartbeat, DefaultTimeout: defTimeout, DrainTimeout: dur,
				Reliability: &file.Config, Advertise: advertise, PeerHeartbeat: peerHeartbeat,
			}, hubOpts...)
			if err != nil {
				_ = ln.Close()
				return usageErr("%v", err)
			}
			ctx := cmd.Context()
			if adminAddr != "" {
				stop, err := serveAdmin(adminAddr, hub, tel.M, log)
				if err != nil {
					_ = ln.Close()
					_ = hub.Shutdown(context.Background())
					return withCode(ExitError, err)
				}
				defer stop()
			}
			var wg sync.WaitGroup
			actx, stopAgents := context.WithCancel(context.Background())
			if demo {
				url := "ws://" + ln.Addr().String() + "/ws"
				opts := []agents.Option{agents.WithLogger(log), agents.WithDrainTimeout(dur)}
				for _, a := range []*agents.Agent{agents.NewEcho(opts...), agents.NewKV(opts...)} {
					wg.Go(func() { _ = a.Run(actx, url) })
				}
				log.Info("demo agents started", "agents", []string{"echo", "kv"})
			}
			// On shutdown the hub stops taking calls at once; the demo agents
			// then finish what they have, deregister and leave (within
			// --drain-timeout), and the hub completes its drain.
			srvCtx, stopSrv := context.WithCancel(context.Background())
			served := make(chan struct{})
			go func() {
				select {
				case <-ctx.Done():
					hub.BeginDrain()
				case <-served:
				}
				stopAgents()
				wg.Wait()
				stopSrv()
			}()
			err = hub.Serve(srvCtx, ln)
			close(served)
			stopAgents()
			wg.Wait()
			stopSrv()
			if err != nil && ctx.Err() == nil {
				return withCode(ExitError, err)
			}
			log.Info("hub stopped")
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&listen, "listen", envOr("MESH_LISTEN", mesh.DefaultListen), "address to listen on (loopback by default) [$MESH_LISTEN]")
	f.BoolVar(&demo, "demo", false, "also run the echo and kv agents in this process")
	f.StringVar(&conf, "config", envOr("MESH_CONFIG", ""), "YAML file with policies, circuitBreaker, bulkhead, retryBudget [$MESH_CONFIG]")
	f.StringVar(&id, "id", "", "hub id (default: a new UUIDv7)")
	f.StringVar(&logLevel, "log-level", envOr("MESH_LOG_LEVEL", "info"), "debug, info, warn or error [$MESH_LOG_LEVEL]")
	f.StringVar(&regKind, "registry", envOr("MESH_REGISTRY", "memory"), "memory (one hub) or etcd (a cluster of hubs) [$MESH_REGISTRY]")
	f.StringSliceVar(&etcdEndpoints, "etcd-endpoints", splitList(envOr("MESH_ETCD_ENDPOINTS", "http://127.0.0.1:2379")), "etcd URLs, comma separated [$MESH_ETCD_ENDPOINTS]")
	f.StringVar(&etcdPrefix, "etcd-prefix", envOr("MESH_ETCD_PREFIX", "/agentmesh/"), "key prefix of this mesh in etcd [$MESH_ETCD_PREFIX]")
	f.StringVar(&advertise, "advertise", envOr("MESH_ADVERTISE", ""), "host:port other hubs reach this one at (default: --listen) [$MESH_ADVERTISE]")
	f.StringVar(&adminAddr, "admin-addr", "", "also serve /metrics, /livez, /readyz and /debug/pprof on this address, away from the gateway port (e.g. 127.0.0.1:9464)")
	f.StringVar(&logFormat, "log-format", envOr("MESH_LOG_FORMAT", "json"), "json or text [$MESH_LOG_FORMAT]")
	f.StringVar(&otlpEndpoint, "otlp-endpoint", "", "OTLP receiver for traces, e.g. http://127.0.0.1:4318 (default $OTEL_EXPORTER_OTLP_ENDPOINT; none: tracing off)")
	f.Float64Var(&sampleRatio, "trace-sample-ratio", 0, "share of new traces sampled, 0..1 (default: $OTEL_TRACES_SAMPLER, else all)")
	f.DurationVar(&heartbeat, "heartbeat", 5*time.Second, "heartbeat interval assigned to agents (they expire after 3 missed)")
	f.DurationVar(&peerHeartbeat, "peer-heartbeat", time.Second, "ping interval of links to other hubs; a peer silent for 2.5 intervals is dead and its calls fail over")
	f.DurationVar(&defTimeout, "default-timeout", 30*time.Second, "timeout of calls that carry no ttl")
	f.DurationVar(&dur, "drain-timeout", 10*time.Second, "how long to wait for calls in flight on shutdown")
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	return cmd
}

// serveAdmin serves the admin endpoints (metrics, probes, pprof) on their
// own listener until stop is called.
func serveAdmin(addr string, hub *mesh.Hub, m *telemetry.Metrics, log *slog.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin listener: %w", err)
	}
	mux := http.NewServeMux()
	h := hub.Handler()
	for _, p := range []string{"/metrics", "/livez", "/healthz", "/readyz"} {
		mux.Handle(p, h)
	}
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() { _ = srv.Serve(ln); close(done) }()
	log.Info("admin listening", "addr", ln.Addr().String())
	return func() { _ = srv.Close(); <-done }, nil
}
