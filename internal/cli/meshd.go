package cli

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/spf13/cobra"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/agents/chat"
	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/config"
	"github.com/agentmesh/agentmesh/internal/gcfloor"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/registry/etcd"
	"github.com/agentmesh/agentmesh/surface/all"
	"github.com/agentmesh/agentmesh/surface/console"
	"github.com/agentmesh/agentmesh/telemetry"
)

// NewMeshd returns the meshd command.
func NewMeshd(stdout, stderr io.Writer) *cobra.Command {
	var linkPing time.Duration // --link-ping
	var (
		linkWriteTimeout time.Duration // --link-write-timeout
		maxUnwrittenB    int           // --link-max-unwritten-bytes
		maxUnwrittenN    int           // --link-max-unwritten-calls
		gcMinHeap        int           // --gc-min-heap
	)
	var (
		listen, id, logLevel, conf  string
		logFormat, otlpEndpoint     string
		adminAddr                   string
		checkOnly                   bool
		regKind, etcdPrefix         string
		advertise                   string
		etcdEndpoints               []string
		etcdCreds                   etcdAuth // --etcd-username, --etcd-password-file, --etcd-cert, --etcd-key, --etcd-ca
		etcdMaxPerHub, etcdMaxTotal int
		onKeys                      func([]auth.Key) // told of reloaded keys once the hub took them (the etcd records' seal)
		sampleRatio                 float64
		demo, ui                    bool
		heartbeat, defTimeout, dur  time.Duration
		hubTTL                      time.Duration
		warmUp                      time.Duration
		authKeys                    []string
		allowRemote                 bool
		origins                     []string
		ratePerToken                float64
		burstPerToken               int
		maxConns                    int
		connRate                    float64
		connBurst                   int
		globalRate                  float64
		globalBurst                 int
		tlsCert, tlsKey             string
		clientCA, tlsCA             string
		peerHeartbeat               time.Duration
		chatDir                     string // --chat-data-dir: the demo chat agent's sessions
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
			var hb *hub.Hub
			labels := telemetry.NewLabeler(func(m string) bool { return hb != nil && hb.KnownMethod(m) })
			tel := telemetry.New(tp, telemetry.NewMetrics(labels))
			file, err := config.Load(conf)
			if err != nil {
				return usageErr("%v", err)
			}
			hubOpts := []hub.Option{hub.WithLogger(log), hub.WithTelemetry(tel)}
			sec := &hub.Security{Roles: file.Roles, Origins: origins, RatePerToken: ratePerToken, BurstPerToken: burstPerToken}
			if len(authKeys) > 0 {
				var missing []string
				if sec.Keys, missing, err = loadAuthKeys(authKeys); err != nil {
					return usageErr("--auth-key: %v", err)
				}
				if len(missing) > 0 {
					log.Warn("--auth-key: key files not found, skipped (SIGHUP reads them again)", "missing", missing)
				}
				sec.Key = sec.Keys[0].Secret
			}
			if len(file.Roles) > 0 && len(authKeys) == 0 {
				// Roles are checked against tokens: without a key the hub
				// authenticates nobody and the table would guard nothing.
				return usageErr("--config %s has roles, which are enforced only with --auth-key: without it the hub authenticates nobody and every method is open", conf)
			}
			if err := checkExposure(listen, allowRemote, len(authKeys) > 0); err != nil {
				return usageErr("%v", err)
			}
			if err := checkAdminExposure(adminAddr, allowRemote); err != nil {
				return usageErr("%v", err)
			}
			var srvTLS, peerTLS *tls.Config
			if tlsCert != "" || tlsKey != "" || clientCA != "" {
				if srvTLS, err = link.ServerTLS(tlsCert, tlsKey, clientCA); err != nil {
					return usageErr("%v", err)
				}
				// Peers (and the demo agents) are dialled over wss, verified
				// against --tls-ca (default: --client-ca, else the system's
				// roots), presenting this hub's certificate: for mutual TLS
				// between hubs it needs the clientAuth usage too.
				ca := tlsCA
				if ca == "" {
					ca = clientCA
				}
				if peerTLS, err = link.ClientTLS(ca, tlsCert, tlsKey); err != nil {
					return usageErr("%v", err)
				}
			}
			if regKind != "memory" && regKind != "etcd" {
				return usageErr("--registry must be memory or etcd, not %q", regKind)
			}
			etcdUser, etcdPassword, etcdTLS, err := etcdCreds.load(etcdEndpoints)
			if err != nil {
				return usageErr("%v", err)
			}
			if etcdUser != "" && slices.ContainsFunc(etcdEndpoints, func(e string) bool { return strings.HasPrefix(e, "http://") }) {
				log.Warn("--etcd-username over http:// endpoints: the password and etcd's token travel in clear text; use https:// (--etcd-ca)", "endpoints", etcdEndpoints)
			}
			if checkOnly {
				// Everything above read and validated (flags, environment,
				// policy file, key files, certificates): a deployment's
				// command line is known to start without starting it.
				fmt.Fprintf(stdout, "meshd: configuration OK (listen %s, registry %s, auth %v, tls %v, admin %q", listen, regKind, len(authKeys) > 0, srvTLS != nil, adminAddr)
				if regKind == "etcd" {
					fmt.Fprintf(stdout, ", etcd user %q, etcd tls %v", etcdUser, etcdTLS != nil)
				}
				fmt.Fprintln(stdout, ")")
				return nil
			}
			if gcMinHeap > 0 {
				defer gcfloor.Start(uint64(gcMinHeap)).Stop()
			}
			if hubID == "" {
				hubID = envelope.NewID() // the etcd registry needs it before the hub exists
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return withCode(ExitError, fmt.Errorf("listen on %s: %w", listen, err))
			}
			if advertise == "" {
				advertise = ln.Addr().String() // the real port, also with --listen :0
			}
			if regKind == "etcd" {
				if hubTTL <= 0 {
					hubTTL = max(3*heartbeat, 2*time.Second)
				}
				ecfg := etcd.Config{Endpoints: etcdEndpoints, Prefix: etcdPrefix, Hub: hubID, HubAddr: advertise, HubTTL: hubTTL,
					MaxInstancesPerHub: etcdMaxPerHub, MaxInstances: etcdMaxTotal, OnInvalid: tel.M.InvalidRecord,
					Username: etcdUser, Password: etcdPassword, TLS: etcdTLS}
				if etcdUser != "" || etcdTLS != nil {
					// Credentials are checked before serving: refused
					// ones stop meshd with etcd's reason, not a hub
					// forever not ready behind timeouts.
					if err := waitEtcdAccess(cmd.Context(), log, ecfg); err != nil || cmd.Context().Err() != nil {
						_ = ln.Close()
						return err
					}
				}
				if len(sec.Keys) > 0 {
					// Records are sealed with the auth key: one no hub of
					// this mesh wrote is refused, whoever can write etcd.
					sealer, err := auth.NewSealer(sec.Keys)
					if err != nil {
						_ = ln.Close()
						return usageErr("--auth-key: %v", err)
					}
					ecfg.Sealer = sealer
				}
				tel.M.InitInvalidRecords(etcd.Reasons)
				reg, err := etcd.New(ecfg, log)
				if err != nil {
					_ = ln.Close()
					if etcdUser == "" {
						return usageErr("%v", err)
					}
					// With a user, etcd.New authenticates at once.
					log.Error("registry: etcd refused or did not answer this hub's credentials; not starting", "endpoints", etcdEndpoints, "user", etcdUser, "error", err)
					return withCode(ExitError, err)
				}
				if sealer, ok := ecfg.Sealer.(*auth.Sealer); ok {
					onKeys = func(keys []auth.Key) {
						// The new first key seals this hub's records,
						// written again now: the old key can then go.
						if err := sealer.SetKeys(keys); err != nil {
							log.Error("SIGHUP: the registry's seal keeps the old keys", "error", err)
							return
						}
						ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
						defer cancel()
						if err := reg.Reseal(ctx); err != nil {
							log.Error("SIGHUP: this hub's etcd records were not all sealed again", "error", err)
						}
					}
				}
				defer reg.Close()
				hubOpts = append(hubOpts, hub.WithRegistry(reg))
				log.Info("registry: etcd", "endpoints", etcdEndpoints, "prefix", etcdPrefix, "hubTTL", hubTTL.String(),
					"user", etcdUser, "clientCert", len(etcdCreds.cert) > 0, "tls", etcdTLS != nil)
			}
			hb, err = hub.New(hub.Config{
				ID: hubID, HeartbeatInterval: heartbeat, DefaultTimeout: defTimeout, DrainTimeout: dur,
				Reliability: &file.Config, Advertise: advertise, Security: sec, MaxConns: maxConns, ConnRate: connRate, ConnBurst: connBurst, GlobalRate: globalRate, GlobalBurst: globalBurst, PeerHeartbeat: peerHeartbeat,
				Conn: link.Config{PingInterval: linkPing, WriteTimeout: linkWriteTimeout,
					MaxUnwrittenBytes: maxUnwrittenB, MaxUnwrittenCalls: maxUnwrittenN},
				TLS: srvTLS, PeerTLS: peerTLS,
				WarmUp: hubWarmUp(warmUp),
			}, hubOpts...)
			if err != nil {
				_ = ln.Close()
				return usageErr("%v", err)
			}
			all.Mount(hb) // the protocol surfaces: agentick, OpenAI, Multica, NEXUS3, MCP
			if ui {
				console.Mount(hb, console.Config{JaegerURL: os.Getenv("MESH_JAEGER_URL")}) // /ui/
			}
			ctx := cmd.Context()
			if adminAddr != "" {
				stop, err := serveAdmin(adminAddr, hb, tel.M, log, srvTLS)
				if err != nil {
					_ = ln.Close()
					_ = hb.Shutdown(context.Background())
					return withCode(ExitError, err)
				}
				defer stop()
			}
			var demoAgents []*agents.Agent
			var chatDemo *demoChat // the demo chat agent (chat.go)
			var chatTel *telemetry.Telemetry
			if demo {
				opts := []agents.Option{agents.WithLogger(log), agents.WithDrainTimeout(dur)}
				// Each demo agent traces as a service of its own
				// (agent-echo, agent-kv, agent-chat, as meshctl agent run
				// names them): a provider per agent, exporting where
				// meshd's does (OTEL_SERVICE_NAME, when set, names them
				// all). Their spans carry no metrics: their server
				// durations would count each call a second time in the
				// hub's families of this registry. The chat runtime's
				// GenAI histograms go to it.
				var demoTPs []*telemetry.Provider
				defer func() {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
					defer cancel()
					for _, p := range demoTPs {
						_ = p.Shutdown(ctx) // flush the last spans
					}
				}()
				demoTP := func(name string) (*telemetry.Provider, error) {
					if !tp.Enabled {
						return tp, nil
					}
					p, err := telemetry.NewProvider(cmd.Context(), telemetry.TracingConfig{
						ServiceName: "agent-" + name, InstanceID: id, Version: envelope.Version, Endpoint: otlpEndpoint, SampleRatio: sampleRatio,
					}, nil)
					if err == nil {
						demoTPs = append(demoTPs, p)
					}
					return p, err
				}
				tps := map[string]*telemetry.Provider{}
				for _, name := range []string{"echo", "kv", "chat"} {
					p, err := demoTP(name)
					if err != nil {
						_ = ln.Close()
						_ = hb.Shutdown(context.Background())
						return usageErr("%v", err)
					}
					tps[name] = p
				}
				with := func(name string) []agents.Option {
					return append(slices.Clip(opts), agents.WithTelemetry(telemetry.New(tps[name], nil)))
				}
				var err error
				if chatDemo, err = newDemoChat(chatDir, with("chat")...); err != nil {
					_ = ln.Close()
					_ = hb.Shutdown(context.Background())
					return withCode(ExitError, err)
				}
				defer chatDemo.close()
				chatTel = telemetry.New(tps["chat"], tel.M)
				chatDemo.rt.SetTelemetry(chatTel)
				demoAgents = []*agents.Agent{agents.NewEcho(with("echo")...), agents.NewKV(with("kv")...), chatDemo.agent}
				for _, a := range demoAgents {
					if sec.Key != nil {
						// The hub vouches for its own demo agents.
						tok, err := auth.Issue(sec.Key, auth.Claims{Subject: "demo." + a.Methods()[0], Serve: a.Methods()}, 365*24*time.Hour)
						if err != nil {
							_ = ln.Close()
							_ = hb.Shutdown(context.Background())
							return withCode(ExitError, err)
						}
						agents.WithToken(tok)(a)
					}
				}
			}
			var wg sync.WaitGroup
			if len(authKeys) > 0 {
				// SIGHUP reloads the key files (rotation without a
				// restart): an operator's explicit, atomic step (write
				// the new files, then signal), as nginx and others do;
				// polling the files would pick up a half-written one.
				hup := make(chan os.Signal, 1)
				signal.Notify(hup, syscall.SIGHUP)
				hctx, stopHUP := context.WithCancel(context.Background())
				var hwg sync.WaitGroup
				defer func() { stopHUP(); signal.Stop(hup); hwg.Wait() }()
				hwg.Go(func() {
					for {
						select {
						case <-hctx.Done():
							return
						case <-hup:
							reloadAuthKeys(log, hb, onKeys, authKeys)
						}
					}
				})
			}
			actx, stopAgents := context.WithCancel(context.Background())
			if demo {
				url := "ws://" + ln.Addr().String() + "/ws"
				if srvTLS != nil {
					url = "wss://" + ln.Addr().String() + "/ws"
				}
				if err := chatDemo.connect(url, peerTLS, sec.Key, chatTel); err != nil {
					log.Error("demo chat agent: no mesh_call tool", "error", err)
				}
				for _, a := range demoAgents {
					if peerTLS != nil {
						agents.WithConnConfig(link.Config{TLS: peerTLS})(a)
					}
					wg.Go(func() { _ = a.Run(actx, url) })
				}
				log.Info("demo agents started", "agents", []string{"echo", "kv", "chat"}, "chatDataDir", chatDir)
			}
			// On shutdown the hub stops taking calls at once; the demo agents
			// then finish what they have, deregister and leave (within
			// --drain-timeout), and the hub completes its drain.
			srvCtx, stopSrv := context.WithCancel(context.Background())
			served := make(chan struct{})
			go func() {
				select {
				case <-ctx.Done():
					hb.BeginDrain()
					_, _ = daemon.SdNotify(false, daemon.SdNotifyStopping)
				case <-served:
				}
				stopAgents()
				wg.Wait()
				stopSrv()
			}()
			// systemd Type=notify: the socket is bound and the hub serves
			// from here on; with WatchdogSec, keep-alives every half of it.
			_, _ = daemon.SdNotify(false, daemon.SdNotifyReady)
			if wd, _ := daemon.SdWatchdogEnabled(false); wd > 0 {
				go func() {
					t := time.NewTicker(wd / 2)
					defer t.Stop()
					for {
						select {
						case <-served:
							return
						case <-t.C:
							_, _ = daemon.SdNotify(false, daemon.SdNotifyWatchdog)
						}
					}
				}()
			}
			err = hb.Serve(srvCtx, ln)
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
	f.StringVar(&listen, "listen", envOr("MESH_LISTEN", hub.DefaultListen), "address to listen on (loopback by default) [$MESH_LISTEN]")
	f.BoolVar(&demo, "demo", false, "also run the echo, kv and chat (scripted provider) agents in this process")
	f.BoolVar(&ui, "ui", true, "serve the live console at /ui/ (with --auth-key it needs an admin-role token)")
	f.StringVar(&chatDir, "chat-data-dir", envOr("MESH_CHAT_DATA_DIR", chat.DefaultDataDir()), "with --demo: session files of the chat agent [$MESH_CHAT_DATA_DIR]")
	f.StringVar(&conf, "config", envOr("MESH_CONFIG", ""), "YAML file with policies, circuitBreaker, bulkhead, retryBudget [$MESH_CONFIG]")
	f.StringVar(&id, "id", "", "hub id (default: a new UUIDv7)")
	f.StringVar(&logLevel, "log-level", envOr("MESH_LOG_LEVEL", "info"), "debug, info, warn or error [$MESH_LOG_LEVEL]")
	f.StringVar(&regKind, "registry", envOr("MESH_REGISTRY", "memory"), "memory (one hub) or etcd (a cluster of hubs) [$MESH_REGISTRY]")
	f.StringSliceVar(&etcdEndpoints, "etcd-endpoints", splitList(envOr("MESH_ETCD_ENDPOINTS", "http://127.0.0.1:2379")), "etcd URLs, comma separated [$MESH_ETCD_ENDPOINTS]")
	f.StringVar(&etcdPrefix, "etcd-prefix", envOr("MESH_ETCD_PREFIX", "/agentmesh/"), "key prefix of this mesh in etcd [$MESH_ETCD_PREFIX]")
	f.IntVar(&etcdMaxPerHub, "etcd-max-instances-per-hub", etcd.DefaultMaxInstancesPerHub, "with --registry etcd: at most this many instances of one other hub are kept; records past it are refused, logged and counted (agentmesh_registry_invalid_records_total{reason=\"over_limit\"})")
	f.IntVar(&etcdMaxTotal, "etcd-max-instances", etcd.DefaultMaxInstances, "with --registry etcd: at most this many instances of other hubs in all")
	f.StringVar(&etcdCreds.user, "etcd-username", envOr("MESH_ETCD_USERNAME", ""), "with --registry etcd: etcd user (etcd's RBAC; deploy/etcd-rbac.md), needs --etcd-password-file [$MESH_ETCD_USERNAME]")
	f.StringVar(&etcdCreds.passwordFile, "etcd-password-file", envOr("MESH_ETCD_PASSWORD_FILE", ""), "file holding --etcd-username's password (mode 0600 or stricter; one trailing newline is ignored) [$MESH_ETCD_PASSWORD_FILE]")
	f.StringVar(&etcdCreds.cert, "etcd-cert", envOr("MESH_ETCD_CERT", ""), "client certificate (PEM) presented to etcd; with etcd's --client-cert-auth its CN is the user (https:// endpoints) [$MESH_ETCD_CERT]")
	f.StringVar(&etcdCreds.key, "etcd-key", envOr("MESH_ETCD_KEY", ""), "key of --etcd-cert [$MESH_ETCD_KEY]")
	f.StringVar(&etcdCreds.ca, "etcd-ca", envOr("MESH_ETCD_CA", ""), "CA bundle etcd's certificate must chain to (default: the system's roots; https:// endpoints) [$MESH_ETCD_CA]")
	f.DurationVar(&hubTTL, "hub-ttl", 0, "with --registry etcd: TTL of this hub's session lease, under which it writes itself and its agents; when the hub dies the others drop its agents after it (default 3 × --heartbeat, at least 2s; etcd rounds up to whole seconds)")
	f.StringSliceVar(&authKeys, "auth-key", splitList(envOr("MESH_AUTH_KEY", "")), "HMAC key file (meshctl token keygen): every surface and peer link then requires a token. Repeat it (or a comma list) for several keys during a rotation: all verify tokens, the first signs the hub's peer tokens; LABEL=FILE also knows the key by the kid LABEL (meshctl token issue --kid). SIGHUP reloads the files, skipping those that do not exist (at least one must load) [$MESH_AUTH_KEY]")
	f.BoolVar(&allowRemote, "allow-remote", false, "allow --listen on a non-loopback address (requires --auth-key)")
	f.StringSliceVar(&origins, "allowed-origins", splitList(envOr("MESH_ALLOWED_ORIGINS", "")), "browser origins allowed to open a WebSocket, e.g. https://console.example,https://*.example.com (default: none) [$MESH_ALLOWED_ORIGINS]")
	f.Float64Var(&ratePerToken, "rate-limit", 0, "calls per second allowed per identity (a token's subject: every token issued to one name shares it), past which calls get OVERLOADED with a retry-after hint (0: no limit; needs --auth-key)")
	f.IntVar(&burstPerToken, "rate-burst", 0, "burst allowed per identity above --rate-limit (default 2 × --rate-limit)")
	f.StringVar(&advertise, "advertise", envOr("MESH_ADVERTISE", ""), "host:port other hubs reach this one at (default: --listen) [$MESH_ADVERTISE]")
	f.BoolVar(&checkOnly, "check", false, "validate the flags, environment, policy file, key files and certificates, then exit without listening (0: would start)")
	f.StringVar(&adminAddr, "admin-addr", envOr("MESH_ADMIN_ADDR", ""), "also serve /metrics, /livez, /readyz and /debug/pprof on this address, away from the gateway port (e.g. 127.0.0.1:9464; beyond loopback it needs --allow-remote) [$MESH_ADMIN_ADDR]")
	f.StringVar(&logFormat, "log-format", envOr("MESH_LOG_FORMAT", "json"), "json or text [$MESH_LOG_FORMAT]")
	f.StringVar(&otlpEndpoint, "otlp-endpoint", "", "OTLP receiver for traces, e.g. http://127.0.0.1:4318 (default $OTEL_EXPORTER_OTLP_ENDPOINT; none: tracing off)")
	f.Float64Var(&sampleRatio, "trace-sample-ratio", 0, "share of new traces sampled, 0..1 (default: $OTEL_TRACES_SAMPLER, else all)")
	f.DurationVar(&heartbeat, "heartbeat", 5*time.Second, "heartbeat interval assigned to agents (they expire after 3 missed)")
	f.DurationVar(&warmUp, "warm-up", -1, "after the hub starts, and after it lists etcd again, methods no agent has registered yet answer UNAVAILABLE (retryable) rather than METHOD_NOT_FOUND for this long, while agents reconnect (default 2 × --heartbeat; 0: none)")
	f.DurationVar(&linkPing, "link-ping", 5*time.Second, "WebSocket ping interval of every link; a link silent for 2 intervals is dead, and a peer pinging faster than once a second (or this interval, if shorter) is cut off")
	f.DurationVar(&linkWriteTimeout, "link-write-timeout", 10*time.Second, "a WebSocket peer that takes none of the bytes written to it for this long is closed (1008 slow consumer, counted in agentmesh_link_slow_consumers_total)")
	f.IntVar(&maxUnwrittenB, "link-max-unwritten-bytes", 4<<20, "per client WebSocket: bytes of requests being served plus answers not yet written, past which the hub stops reading it until they fall (negative: no bound)")
	f.IntVar(&maxUnwrittenN, "link-max-unwritten-calls", 4096, "per client WebSocket: calls whose answers are not yet written, past which the hub stops reading it until they fall (negative: no bound)")
	f.IntVar(&gcMinHeap, "gc-min-heap", gcfloor.DefaultFloor, "bytes of heap the garbage collector may grow by past the live heap before it collects, when GOGC would allow less (a hub's live heap is small and its allocation fast: at GOGC alone it collected 40 times a second at 100,000 calls/s); 0: GOGC alone. Ignored when GOGC is set in the environment")
	f.DurationVar(&peerHeartbeat, "peer-heartbeat", time.Second, "ping interval of links to other hubs; a peer silent for 2.5 intervals is dead and its calls fail over")
	f.DurationVar(&defTimeout, "default-timeout", 30*time.Second, "timeout of calls that carry no ttl")
	f.StringVar(&tlsCert, "tls-cert", envOr("MESH_TLS_CERT", ""), "serve TLS with this certificate (PEM); also presented to peer hubs [$MESH_TLS_CERT]")
	f.StringVar(&tlsKey, "tls-key", envOr("MESH_TLS_KEY", ""), "key of --tls-cert [$MESH_TLS_KEY]")
	f.StringVar(&clientCA, "client-ca", envOr("MESH_CLIENT_CA", ""), "require client certificates chaining to this CA bundle: mutual TLS [$MESH_CLIENT_CA]")
	f.StringVar(&tlsCA, "tls-ca", envOr("MESH_TLS_CA", ""), "CA bundle peer hubs' certificates must chain to (default: --client-ca, else the system's roots) [$MESH_TLS_CA]")
	f.Float64Var(&connRate, "conn-rate-limit", 0, "calls per second allowed per connection (WebSocket link, HTTP keep-alive connection, Multica or agentick socket), past which calls get OVERLOADED with a retry-after hint; with or without --auth-key (0: no limit)")
	f.IntVar(&connBurst, "conn-rate-burst", 0, "burst allowed per connection above --conn-rate-limit (default 2 × --conn-rate-limit)")
	f.Float64Var(&globalRate, "global-rate-limit", 0, "calls per second the whole hub admits, every caller together, after the per-identity and per-connection limits; past it calls get OVERLOADED with a retry-after hint (0: no limit)")
	f.IntVar(&globalBurst, "global-rate-burst", 0, "burst allowed above --global-rate-limit (default 2 × --global-rate-limit)")
	f.IntVar(&maxConns, "max-conns", 10000, "open connections allowed; past it new ones get 503 at once (keep under ulimit -n)")
	f.DurationVar(&dur, "drain-timeout", 10*time.Second, "how long to wait for calls in flight on shutdown")
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	return cmd
}

// serveAdmin serves the admin endpoints (metrics, probes, pprof) on their
// own listener until stop is called.
func serveAdmin(addr string, hb *hub.Hub, m *telemetry.Metrics, log *slog.Logger, tlsCfg *tls.Config) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("admin listener: %w", err)
	}
	if tlsCfg != nil {
		// TLS, but a client certificate only if given: probes and the
		// scraper reach this port without one (bind it to loopback or a
		// private network).
		c := tlsCfg.Clone()
		if c.ClientAuth == tls.RequireAndVerifyClientCert {
			c.ClientAuth = tls.VerifyClientCertIfGiven
		}
		ln = tls.NewListener(ln, c)
	}
	mux := http.NewServeMux()
	h := hb.Handler()
	for _, p := range []string{"/livez", "/healthz", "/readyz"} {
		mux.Handle(p, h)
	}
	if m != nil {
		// The scraper's port: metrics without a token even when the
		// gateway port asks one (bind it to loopback or a private net).
		mux.Handle("/metrics", m.Handler())
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

// checkExposure refuses to listen beyond loopback unless told to, and
// beyond loopback without authentication at all.
func checkExposure(listen string, allowRemote, auth bool) error {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("--listen %q: %v", listen, err)
	}
	loopback := host == "localhost"
	if ip := net.ParseIP(host); ip != nil {
		loopback = ip.IsLoopback()
	}
	if loopback {
		return nil
	}
	if !allowRemote {
		return fmt.Errorf("--listen %s is not a loopback address: pass --allow-remote (with --auth-key) to accept connections from other hosts", listen)
	}
	if !auth {
		return fmt.Errorf("--allow-remote needs --auth-key: a hub reachable from other hosts must authenticate them")
	}
	return nil
}

// checkAdminExposure refuses an --admin-addr beyond loopback unless
// --allow-remote is given: the admin port serves /metrics, the probes and
// /debug/pprof with no token (probes and scrapers carry none), so taking
// it off loopback is a choice to make explicitly, as for the gateway.
func checkAdminExposure(admin string, allowRemote bool) error {
	if admin == "" || allowRemote {
		return nil
	}
	host, _, err := net.SplitHostPort(admin)
	if err != nil {
		return fmt.Errorf("--admin-addr %q: %v", admin, err)
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		return nil
	}
	return fmt.Errorf("--admin-addr %s is not a loopback address: it serves /metrics and /debug/pprof without a token; pass --allow-remote to expose it", admin)
}

// loadAuthKeys reads --auth-key values: FILE or LABEL=FILE. A file that
// does not exist is skipped (and named in missing) as long as one key
// loads: a rotation names both files from the start, the new one created
// later, the old one removed later, each followed by SIGHUP. Any other
// error (mode, size, a bad label) refuses the whole set.
func loadAuthKeys(specs []string) (keys []auth.Key, missing []string, err error) {
	for _, spec := range specs {
		label, path, ok := strings.Cut(spec, "=")
		if !ok {
			label, path = "", spec
		}
		secret, err := auth.LoadKey(path)
		if errors.Is(err, fs.ErrNotExist) {
			missing = append(missing, path)
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		keys = append(keys, auth.Key{ID: label, Secret: secret})
	}
	if len(keys) == 0 {
		return nil, nil, fmt.Errorf("no key file could be read (missing: %s)", strings.Join(missing, ", "))
	}
	// The set's own checks (labels, duplicates), before the hub has it.
	if _, err := auth.NewKeySetVerifier(keys); err != nil {
		return nil, nil, err
	}
	return keys, missing, nil
}

// reloadAuthKeys is SIGHUP: the key files are read again and replace the
// hub's keys; links whose token no longer verifies are closed, the
// others go on. If a file cannot be read the hub keeps its keys.
func reloadAuthKeys(log *slog.Logger, hb *hub.Hub, onKeys func([]auth.Key), specs []string) {
	keys, missing, err := loadAuthKeys(specs)
	if err != nil {
		log.Error("SIGHUP: auth keys not reloaded; keeping the current ones", "error", err)
		return
	}
	closed, err := hb.SetAuthKeys(keys)
	if err != nil {
		log.Error("SIGHUP: auth keys not reloaded; keeping the current ones", "error", err)
		return
	}
	if onKeys != nil {
		onKeys(keys)
	}
	ids := make([]string, len(keys))
	for i, k := range keys {
		ids[i] = auth.KeyID(k.Secret)
		if k.ID != "" {
			ids[i] = k.ID + "=" + ids[i]
		}
	}
	log.Info("SIGHUP: auth keys reloaded", "keys", ids, "missingFiles", missing, "closedConnections", closed)
}

// hubWarmUp maps --warm-up onto HubConfig.WarmUp: the flag's default (-1)
// is the hub's (two heartbeat intervals), 0 is none.
func hubWarmUp(flag time.Duration) time.Duration {
	switch {
	case flag < 0:
		return 0
	case flag == 0:
		return -1
	}
	return flag
}
