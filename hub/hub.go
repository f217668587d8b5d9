package hub

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub/callwatch"
	"github.com/agentmesh/agentmesh/hub/guard"
	"github.com/agentmesh/agentmesh/hub/peering"
	"github.com/agentmesh/agentmesh/internal/idempotency"
	"github.com/agentmesh/agentmesh/internal/ratelimit"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/registry"
	"github.com/agentmesh/agentmesh/registry/memory"
	"github.com/agentmesh/agentmesh/reliability"
	"github.com/agentmesh/agentmesh/telemetry"
)

// metrics returns the hub's metrics, or nil.
func (h *Hub) metrics() *telemetry.Metrics {
	if h.tel == nil {
		return nil
	}
	return h.tel.M
}

// state is what /metrics reports about the hub at scrape time.
func (h *Hub) state() telemetry.HubState {
	snap := h.reg.Snapshot()
	s := telemetry.HubState{AgentsByState: map[string]int{}, Links: map[string]int{"agent": 0, "client": 0, "peer": 0}}
	for _, in := range snap.Instances() {
		s.AgentsByState[in.State()]++
	}
	s.Methods = len(snap.Methods())
	agentLinks := map[*link.Link]bool{}
	h.bindings.Range(func(_, v any) bool { agentLinks[v.(*binding).link] = true; return true })
	peerLinks := h.peers.Links()
	h.mu.Lock()
	for c := range h.conns {
		l, ok := c.(*link.Link)
		switch {
		case ok && agentLinks[l]:
			s.Links["agent"]++
		case ok && peerLinks[l]:
			s.Links["peer"]++
		default:
			s.Links["client"]++
		}
		if ok {
			s.Pending += l.Pending()
		}
	}
	h.mu.Unlock()
	h.bulkheads.Each(func(m string, b *reliability.Bulkhead) {
		run, q := b.Active()
		s.Pools = append(s.Pools, telemetry.PoolState{Method: m, Running: run, Queued: q})
	})
	return s
}

// DefaultListen is where meshd listens unless told otherwise: loopback only.
const DefaultListen = "127.0.0.1:7700"

// Config is the hub's data configuration. The zero value takes the
// defaults of DefaultConfig.
type Config struct {
	// ID names the hub (default: a new UUIDv7).
	ID string
	// HeartbeatInterval is assigned to agents when they register; an agent
	// silent for three intervals expires (default 5 s).
	HeartbeatInterval time.Duration
	// DefaultTimeout bounds a request that carries no ttl (default 30 s).
	DefaultTimeout time.Duration
	// DrainTimeout bounds how long Serve waits for in-flight calls when its
	// context ends (default 10 s).
	DrainTimeout time.Duration
	// Conn tunes every WebSocket (pings, idle and write timeouts, limits).
	Conn link.Config
	// Advertise is the host:port other hubs reach this one at (peer
	// links); empty: this hub takes no forwarded calls' addresses.
	Advertise string
	// PeerHeartbeat is the ping interval of the links this hub dials to
	// other hubs; a peer silent for 2.5 intervals is dead, its link closed
	// and the calls in flight on it answered UNAVAILABLE (default 1 s: a
	// partitioned peer is detected within 2.5 s, S05's bound being 3 s). A
	// dial to a peer is bounded by 1.5 intervals.
	PeerHeartbeat time.Duration
	// Reliability holds the per-method policies, breakers, bulkheads and
	// retry budget the router applies (nil: reliability.DefaultConfig()).
	Reliability *reliability.Config
	// IdempotencyWindow is how long the outcome of a call with an
	// idempotency key is remembered (default 10 min); IdempotencyKeys
	// bounds how many are (default 100,000).
	IdempotencyWindow time.Duration
	IdempotencyKeys   int
	// TLS, when set, serves every surface over TLS (ServerTLS; with a
	// client CA, mutual TLS). PeerTLS, when set, is how this hub dials
	// its peers: over wss, presenting its client certificate if any.
	TLS     *tls.Config
	PeerTLS *tls.Config
	// MaxConns bounds the open connections; past it a new one gets 503
	// and is closed at once (default 10,000; keep it under ulimit -n).
	MaxConns int
	// Security: tokens, roles, allowed origins, rate limits (nil: no
	// authentication, browsers from no origin).
	Security *Security
	// ConnRate and ConnBurst bound the calls each connection may make
	// per second (burst default 2 × ConnRate); past them a call gets
	// OVERLOADED with a retry-after hint. 0: no limit. It holds with
	// authentication off too (connlimit.go).
	ConnRate  float64
	ConnBurst int
	// GlobalRate and GlobalBurst bound the calls the whole hub admits
	// per second, every caller together (burst default 2 × GlobalRate),
	// after the per-identity and per-connection limits; past them a call
	// gets OVERLOADED with a retry-after hint. 0: no limit.
	GlobalRate  float64
	GlobalBurst int
	// WarmUp is how long after the hub starts, and after its registry
	// lists its content again (an etcd watch lost and resynced), a method
	// no agent has registered yet is answered UNAVAILABLE (not sent,
	// retryable) rather than METHOD_NOT_FOUND: after a restart the agents
	// that served it reconnect within about a heartbeat interval, and a
	// METHOD_NOT_FOUND meanwhile is final to every client (default two
	// HeartbeatIntervals; negative: none).
	WarmUp time.Duration
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config {
	return Config{
		HeartbeatInterval: 5 * time.Second,  // the kOS seed's order of magnitude; TTL 15 s
		DefaultTimeout:    30 * time.Second, // JSON-RPC callers send no ttl; longer than any policy default but llm/media
		DrainTimeout:      10 * time.Second, // a rolling restart should not wait on a stuck call for ever
		Conn:              link.Config{}.WithDefaults(),
		PeerHeartbeat:     time.Second, // TCP notices a dead peer after ~15 min here; S05 wants <= 3 s
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.HeartbeatInterval < 10*time.Millisecond {
		return errors.New("mesh: heartbeat interval must be at least 10ms")
	}
	if c.PeerHeartbeat < 10*time.Millisecond {
		return errors.New("mesh: peer heartbeat must be at least 10ms")
	}
	if c.DefaultTimeout <= 0 || c.DrainTimeout < 0 {
		return errors.New("mesh: timeouts must be positive")
	}
	return nil
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.ID == "" {
		c.ID = envelope.NewID()
	}
	if c.HeartbeatInterval <= 0 {
		c.HeartbeatInterval = d.HeartbeatInterval
	}
	if c.DefaultTimeout <= 0 {
		c.DefaultTimeout = d.DefaultTimeout
	}
	if c.DrainTimeout <= 0 {
		c.DrainTimeout = d.DrainTimeout
	}
	if c.PeerHeartbeat <= 0 {
		c.PeerHeartbeat = d.PeerHeartbeat
	}
	c.Conn = c.Conn.WithDefaults()
	if c.MaxConns <= 0 {
		c.MaxConns = 10000
	}
	if c.IdempotencyWindow <= 0 {
		c.IdempotencyWindow = 10 * time.Minute
	}
	if c.IdempotencyKeys <= 0 {
		c.IdempotencyKeys = 100000
	}
	if c.WarmUp == 0 {
		c.WarmUp = 2 * c.HeartbeatInterval
	}
	return c
}

// peerConn is the configuration of the links this hub dials to its peers:
// the hub's, with the peer heartbeat.
func (c Config) peerConn() link.Config {
	pc := c.Conn
	pc.TLS = c.PeerTLS
	pc.PingInterval = c.PeerHeartbeat
	pc.IdleTimeout = c.PeerHeartbeat * 5 / 2
	return pc
}

// Option wires a code dependency into the hub.
type Option func(*Hub)

// WithRegistry sets the registry (default: a new memory registry, which
// the hub then owns and closes).
func WithRegistry(r registry.Registry) Option { return func(h *Hub) { h.reg = r } }

// WithBreakerHook is told of every state change of the hub's per-instance
// breakers ("closed", "half-open", "open"). It runs under the breaker's
// lock: it may count or log, never call into the hub.
func WithBreakerHook(f func(k reliability.BreakerKey, from, to string)) Option {
	return func(h *Hub) { h.breakerHook = f }
}

// WithTelemetry instruments the hub: a SERVER span per call received, a
// CLIENT span per forward attempt, and, with metrics, /metrics.
func WithTelemetry(t *telemetry.Telemetry) Option { return func(h *Hub) { h.tel = t } }

// WithLogger sets the hub's logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(h *Hub) { h.log = l } }

// Hub is the mesh's router: it accepts agents and clients over /ws and
// /rpc, answers the built-in methods and forwards every other call to a
// ready agent instance serving the method.
//
// New starts one goroutine that follows the registry; Shutdown stops it.
// A Hub is safe for concurrent use.
type Hub struct {
	cfg       Config
	connCfg   *link.Config // cfg.Conn with its defaults, shared by the links this hub accepts
	reg       registry.Registry
	ownsReg   bool
	log       *slog.Logger
	upgrader  websocket.Upgrader
	guard     *guard.Guard
	connLimit *ratelimit.Limiter // per connection (connlimit.go); nil: none
	global    *ratelimit.Limiter // the whole hub's (connlimit.go); nil: none
	idem      *idempotency.Cache
	builtins  map[string]builtin
	in        envelope.Invoker // the ingress chain (ingress.go), built once by New
	routed    envelope.Invoker // bulkhead → retry → attempt, for routed calls
	retried   envelope.Invoker // retry → attempt: routed, its bulkhead slot taken
	attempts  envelope.Invoker // one attempt, with its span
	retry     *reliability.RetryOptions
	forwarded envelope.Invoker // bulkhead → attempt, for calls forwarded by a peer hub

	breakerHook func(k reliability.BreakerKey, from, to string)
	tel         *telemetry.Telemetry
	policies    *reliability.PolicySet
	breakers    *reliability.Breakers // per (method, instance)
	bulkheads   *reliability.Bulkheads

	bindings sync.Map      // instance id -> *binding (agents attached here)
	peers    *peering.Pool // links to the other hubs of a cluster

	mu          sync.Mutex
	conns       map[closer]struct{}
	connsClosed bool
	srv         *http.Server

	draining atomic.Bool
	inflight atomic.Int64
	watches  callwatch.List // WatchCalls: the console's tail
	// fastTaken counts the calls the forward path took (fast.go), for
	// tests.
	fastTaken atomic.Int64
	started   atomic.Int64 // unix ns: New, then Serve; the warm-up counts from it

	stop     context.CancelFunc
	done     chan struct{}
	shutOnce sync.Once

	routes   []route   // mounted by surfaces (Handle); under mu
	rpcHooks []rpcHook // surfaces' claims on /rpc calls (InterceptRPC); under mu

	// Bounds against slow or greedy clients, set by New; tests shorten
	// them (security_knobs_test.go).
	readHeaderTimeout time.Duration // http.Server.ReadHeaderTimeout: slowloris headers (S27)
	readTimeout       time.Duration // http.Server.ReadTimeout: a whole request, body included
	maxPending        int           // calls in flight per connection (native link or JSON-RPC WebSocket)
}

// The defaults of the bounds above.
const (
	defaultReadHeaderTimeout = 5 * time.Second  // S27: a header trickled byte by byte is cut here
	defaultReadTimeout       = 30 * time.Second // the NEXUS3 seed's bound for reading a request
	defaultMaxPending        = 10000
)

type closer interface{ Close() }

// binding attaches a registered instance to the link it came over.
type binding struct {
	link  *link.Link
	id    string
	ready atomic.Bool                       // set once the registry holds the instance
	inst  atomic.Pointer[registry.Instance] // the instance registered over link (once ready)
}

// New validates cfg and returns a hub. It does no I/O.
func New(cfg Config, opts ...Option) (*Hub, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	rc := reliability.DefaultConfig()
	if cfg.Reliability != nil {
		rc = *cfg.Reliability
	}
	if err := rc.Validate(); err != nil {
		return nil, err
	}
	ps, _ := rc.PolicySet()
	g, err := guard.New(cfg.Security)
	if err != nil {
		return nil, err
	}
	g.Self = cfg.ID
	if g.On() {
		// What the peer tokens it accepts must name, and the key its own
		// are signed with.
		g.Peers = auth.NewPeers(cfg.ID, cfg.Advertise, g.Verifier, g.Key.Load)
	}
	cl, err := guard.NewRateLimiter(cfg.ConnRate, cfg.ConnBurst, max(cfg.MaxConns, 1000))
	if err != nil {
		return nil, fmt.Errorf("mesh: connection rate limit: %w", err)
	}
	gl, err := guard.NewRateLimiter(cfg.GlobalRate, cfg.GlobalBurst, 1)
	if err != nil {
		return nil, fmt.Errorf("mesh: global rate limit: %w", err)
	}
	h := &Hub{
		idem:      idempotency.New(cfg.IdempotencyWindow, cfg.IdempotencyKeys),
		guard:     g,
		connLimit: cl,
		global:    gl,
		cfg:       cfg,
		log:       slog.New(slog.DiscardHandler),
		conns:     map[closer]struct{}{},
		done:      make(chan struct{}),

		readHeaderTimeout: defaultReadHeaderTimeout,
		readTimeout:       defaultReadTimeout,
		maxPending:        defaultMaxPending,
	}
	h.started.Store(time.Now().UnixNano())
	for _, o := range opts {
		o(h)
	}
	if h.reg == nil {
		h.reg = memory.New()
		h.ownsReg = true
	}
	if b, ok := h.reg.(interface{ SetHub(id, addr string) error }); ok {
		// A cluster registry writes its records in this hub's name and
		// at its address: other hubs route to its agents only through
		// them.
		if err := b.SetHub(cfg.ID, cfg.Advertise); err != nil {
			return nil, err
		}
	}
	h.upgrader = websocket.Upgrader{
		Subprotocols: []string{envelope.SubprotocolV2, envelope.Subprotocol, "jsonrpc"},
		// Browsers only from the allowed origins (no same-host fallback:
		// DNS rebinding makes a hostile page's Origin and Host agree).
		CheckOrigin: h.guard.Origins.Check,
		// A 256-byte read buffer (frame headers, small frames): larger
		// messages are read straight into their destination, and under
		// load readAhead takes up to 64 KiB per syscall beneath it, while
		// an idle link holds little (bench -idle). The link frames what it
		// writes (wsconn's wire); the pool keeps gorilla's writer empty.
		ReadBufferSize:  256,
		WriteBufferSize: 4 << 10,
		WriteBufferPool: &sync.Pool{},
	}
	h.builtins = h.builtinMethods()
	h.tel.SetControl(h.IsBuiltin)
	h.policies = ps
	m := h.metrics()
	hook := h.breakerHook
	h.breakers = reliability.NewBreakers(rc.CircuitBreaker, func(k reliability.BreakerKey, from, to string) {
		m.BreakerChanged(k.Method, from, to)
		if hook != nil {
			hook(k, from, to)
		}
	})
	h.bulkheads = reliability.NewBulkheads(rc.Bulkhead)
	var onRetry, onSkip func(method, reason string)
	if m != nil {
		h.bulkheads.OnReject = m.BulkheadRejected
		onRetry, onSkip = m.Retry, m.RetrySkipped
		h.cfg.Conn.Bytes = m.Bytes
		h.cfg.Conn.PingAbuse = m.PingAbuse
		h.cfg.Conn.SlowConsumer = m.SlowConsumer
		h.cfg.Conn.LateResponse = m.LateResponse
		h.cfg.Conn.InvalidFrame = m.InvalidFrame
		m.RegisterHubState(h.state)
	}
	h.connCfg = new(h.cfg.Conn.WithDefaults())
	ctx, cancel := context.WithCancel(context.Background())
	h.stop = cancel
	pc := peering.Config{Link: h.cfg.peerConn(), Log: h.log, Track: func(l *link.Link) bool { return h.track(l) },
		Untrack: func(l *link.Link) { h.untrack(l) }, Wanted: h.wantedPeer}
	if h.guard.On() {
		pc.Auth = h.guard.Peers
	}
	h.peers = peering.New(ctx, pc)
	h.retry = &reliability.RetryOptions{
		Budget:   reliability.NewBudget(rc.RetryBudget),
		Latency:  reliability.NewLatency(),
		UseTried: true,
		OnRetry:  onRetry,
		OnSkip:   onSkip,
	}
	h.attempts = h.tel.Attempt(h.attempt)
	h.retried = reliability.Retry(ps, *h.retry)(h.attempts)
	h.routed = h.bulkheads.Middleware(h.retried)
	h.forwarded = envelope.Chain(h.bulkheads.Middleware, h.tel.Attempt)(h.attempt)
	h.in = h.buildIngress()
	watch, err := h.reg.Watch(ctx)
	if err != nil {
		cancel()
		return nil, err
	}
	go h.follow(watch)
	return h, nil
}

// KnownMethod reports whether method is a built-in or served (now or
// recently) by some agent: what may appear as a metric label.
func (h *Hub) KnownMethod(method string) bool {
	if _, ok := h.builtins[method]; ok {
		return true
	}
	return h.reg.Snapshot().Known(method)
}

// ID returns the hub's id.
func (h *Hub) ID() string { return h.cfg.ID }

// Registry returns the hub's registry.
func (h *Hub) Registry() registry.Registry { return h.reg }

// Handler returns the hub's HTTP handler: /rpc, /ws, NEXUS3's / and /agent/{id}, agentick's WebSocket (an upgrade on GET /, or /agentick/ws), /events and /invoke, /healthz, /livez, /readyz, and the routes the surfaces mounted (Handle: /mcp, /multica, /v1 of OpenAI).
func (h *Hub) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/rpc", h.serveRPC)
	mux.HandleFunc("/ws", h.serveWS)
	live := func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("ok\n"))
	}
	if m := h.metrics(); m != nil {
		// On the gateway port, with authentication on, metrics need an
		// admin token (they name methods and agents); meshd --admin-addr
		// serves them on loopback for the scraper without one.
		mh := m.Handler()
		mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
			if h.guard.On() {
				who, err := h.guard.Authenticate(r)
				if err == nil && !guard.HasRole(who.Roles, auth.RoleAdmin) {
					err = envelope.NewError(envelope.CodePermissionDenied, "/metrics needs the admin role")
				}
				if err != nil {
					httpRefuse(w, err)
					return
				}
			}
			mh.ServeHTTP(w, r)
		})
	}
	h.mu.Lock()
	for _, rt := range h.routes {
		mux.Handle(rt.pattern, rt.h)
	}
	h.mu.Unlock()
	mux.HandleFunc("/healthz", live)
	mux.HandleFunc("/livez", live)
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if h.draining.Load() {
			http.Error(w, "draining", http.StatusServiceUnavailable)
			return
		}
		if s, ok := h.reg.(interface{ Synced() bool }); ok && !s.Synced() {
			http.Error(w, "registry not synced", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	return h.connContext(mux)
}

// maxHeaderBytes bounds a request's line and headers (431 past it; Go's
// server allows 4 KiB over). 16 KiB holds a bearer token with a long
// list of methods many times over, as nginx's 8 KiB line and Apache's
// 8 KiB field do; a 16 MiB header costs the hub the reading and parsing
// of 20 KiB, not the 68 KiB of the 64 KiB bound used before (S26: the
// parse grows its line buffer by doublings, garbage for the collector).
const maxHeaderBytes = 16 << 10

// Serve serves on ln until ctx ends, then drains (at most DrainTimeout)
// and returns. It returns early with the error if the listener fails.
func (h *Hub) Serve(ctx context.Context, ln net.Listener) error {
	ln = link.NewCapListener(ln, int64(h.cfg.MaxConns), func() { h.metrics().Refused("max_conns") })
	if h.cfg.TLS != nil {
		ln = tls.NewListener(ln, h.cfg.TLS)
	}
	srv := &http.Server{
		Handler:           h.Handler(),
		ReadHeaderTimeout: h.readHeaderTimeout, // slowloris: a header trickled byte by byte is cut here (S27)
		ReadTimeout:       h.readTimeout,       // reading a request, body included (the NEXUS3 seed's 30 s)
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(h.log.Handler(), slog.LevelWarn),
	}
	h.mu.Lock()
	h.srv = srv
	h.mu.Unlock()
	h.started.Store(time.Now().UnixNano()) // agents can register from now on
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	h.log.Info("hub listening", "addr", ln.Addr().String(), "hub", h.cfg.ID)
	select {
	case err := <-errc:
		_ = h.Shutdown(context.Background())
		return err
	case <-ctx.Done():
	}
	dctx, cancel := context.WithTimeout(context.Background(), h.cfg.DrainTimeout)
	defer cancel()
	err := h.Shutdown(dctx)
	<-errc
	return err
}

// BeginDrain starts draining without waiting: /readyz turns 503, new
// calls and WebSockets are refused (agents may still heartbeat and
// deregister), and every native link is sent a goaway frame, so that
// agents re-register on another hub and clients move their new calls
// there at once, while the calls already admitted here finish. Shutdown,
// or Serve when its context ends, finishes the drain.
func (h *Hub) BeginDrain() {
	if h.draining.Swap(true) {
		return
	}
	h.mu.Lock()
	links := make([]*link.Link, 0, len(h.conns))
	for c := range h.conns {
		if l, ok := c.(*link.Link); ok && l.IsAccepted() {
			links = append(links, l)
		}
	}
	h.mu.Unlock()
	for _, l := range links {
		l.SendGoAway()
	}
	h.log.Info("draining: goaway sent", "links", len(links))
}

// Shutdown drains the hub: /readyz turns 503, new calls are refused with
// UNAVAILABLE, calls in flight get until ctx ends to finish; then every
// link closes (their pending calls fail with UNAVAILABLE) and the hub's
// goroutines stop. It is idempotent; later calls wait for the first.
func (h *Hub) Shutdown(ctx context.Context) error {
	var err error
	h.shutOnce.Do(func() {
		h.BeginDrain()
		t := time.NewTicker(5 * time.Millisecond)
		for h.inflight.Load() > 0 {
			select {
			case <-ctx.Done():
				err = ctx.Err()
				h.log.Warn("drain timed out", "inflight", h.inflight.Load())
			case <-t.C:
				continue
			}
			break
		}
		t.Stop()
		if err == nil {
			h.lameDuck(ctx)
		}
		h.mu.Lock()
		srv := h.srv
		h.connsClosed = true
		conns := make([]closer, 0, len(h.conns))
		for c := range h.conns {
			conns = append(conns, c)
		}
		h.mu.Unlock()
		if srv != nil {
			sctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = srv.Shutdown(sctx) // hijacked WebSockets are ours to close, below
			cancel()
		}
		var wg sync.WaitGroup
		for _, c := range conns {
			wg.Go(c.Close)
		}
		wg.Wait()
		h.stop()
		h.peers.Shutdown() // background dials; a link they open now is closed at once
		<-h.done
		if h.ownsReg {
			_ = h.reg.Close()
		}
	})
	<-h.done
	return err
}

// lameDuckCap bounds how long a drained hub waits for its peers to close
// the links it sent goaway on.
const lameDuckCap = time.Second

// lameDuck runs once the calls in flight are done: it gives the parties
// told goaway time to close their links themselves, which they do once
// nothing is pending on them. Closing first would drop a request still in
// transit towards this hub (its caller would see the link lost instead of
// the "draining" refusal that it may safely retry) and answers still
// queued. It returns when no such link is left; after lameDuckCap, as soon
// as the remaining ones are quiet (nothing served, nothing to write); or
// when ctx ends.
func (h *Hub) lameDuck(ctx context.Context) {
	start := time.Now()
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	quiet := 0
	for {
		h.mu.Lock()
		left, busy := 0, false
		for c := range h.conns {
			if l, ok := c.(*link.Link); ok && l.IsAccepted() {
				left++
				busy = busy || !l.Quiet()
			}
		}
		h.mu.Unlock()
		if left == 0 {
			return
		}
		if busy {
			quiet = 0
		} else if quiet++; quiet >= 3 && time.Since(start) >= lameDuckCap {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// track records a connection for Shutdown to close; false once Shutdown
// has collected them (the caller then closes it itself).
func (h *Hub) track(c closer) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.connsClosed {
		return false
	}
	h.conns[c] = struct{}{}
	return true
}

func (h *Hub) untrack(c closer) {
	h.mu.Lock()
	delete(h.conns, c)
	h.mu.Unlock()
}
