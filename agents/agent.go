package agents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/registry"
	"github.com/agentmesh/agentmesh/stream"
	"github.com/agentmesh/agentmesh/telemetry"
)

// HandlerFunc serves one method. params is the request's raw JSON; the
// returned value is marshalled with encoding/json (a json.RawMessage is
// sent as is). Return an *envelope.Error to choose the code; any other
// error becomes RPC_ERROR with its text. ctx carries the request's
// deadline and is cancelled when the caller gives up or the link drops.
type HandlerFunc func(ctx context.Context, params json.RawMessage) (any, error)

// Option configures an Agent.
type Option func(*Agent)

// WithID sets the agent's instance id (default: a new UUIDv7). The id is
// kept across reconnects.
func WithID(id string) Option { return func(a *Agent) { a.id = id } }

// WithLogger sets the agent's logger.
func WithLogger(l *slog.Logger) Option { return func(a *Agent) { a.log = l } }

// WithConnConfig tunes the agent's WebSocket.
func WithConnConfig(c link.Config) Option { return func(a *Agent) { a.conn = c } }

// WithMetadata sets the metadata sent with agent.register.
func WithMetadata(m map[string]any) Option { return func(a *Agent) { a.metadata = m } }

// WithTelemetry instruments the agent: a SERVER span per call, continuing
// the caller's trace, and the server metrics when t has them.
func WithTelemetry(t *telemetry.Telemetry) Option { return func(a *Agent) { a.tel = t } }

// WithToken sets the bearer token the agent presents to its hubs; its
// serve patterns must cover the agent's methods.
func WithToken(tok string) Option { return func(a *Agent) { a.token = tok } }

// WithDrainTimeout bounds how long Run waits for handlers in flight after
// deregistering (default 5 s).
func WithDrainTimeout(d time.Duration) Option { return func(a *Agent) { a.drain = d } }

// Agent serves methods on the mesh. Register handlers with Handle before
// Run; Run blocks until ctx ends.
type Agent struct {
	name     string
	id       string                 // proposed at New; the hub's answer goes in assigned
	token    string                 // bearer token for the hubs (WithToken)
	assigned atomic.Pointer[string] // the id the hub registered us under
	log      *slog.Logger
	conn     link.Config
	metadata map[string]any
	drain    time.Duration
	tel      *telemetry.Telemetry

	mu        sync.RWMutex
	exact     map[string]HandlerFunc
	patterns  []pattern
	schemas   map[string]control.MethodSchema // declared at agent.register (SetSchema, HandleTyped)
	streaming map[string]bool                 // methods served with HandleStream (declared in their schemas)
	inline    map[string]bool                 // methods served on the link's reader (HandleInline)

	inflight atomic.Int64
	links    sync.Map       // *link.Link -> struct{}: open links (current, and draining after a goaway)
	drains   sync.WaitGroup // links draining after a goaway
	regMu    sync.Mutex
	regCh    chan struct{} // closed while registered; replaced on loss
	beat     atomic.Int64  // the heartbeat interval the last hub assigned (ns)
}

type pattern struct {
	prefix string
	h      HandlerFunc
}

// New returns an agent with a logical name (a safe metric label, e.g. "echo").
func New(name string, opts ...Option) *Agent {
	a := &Agent{
		name:  name,
		log:   slog.New(slog.DiscardHandler),
		exact: map[string]HandlerFunc{},
		drain: 5 * time.Second,
		regCh: make(chan struct{}),
	}
	for _, o := range opts {
		o(a)
	}
	if a.id == "" {
		a.id = envelope.NewID()
	}
	return a
}

// ID returns the agent's instance id (the one the hub assigned, once
// registered).
func (a *Agent) ID() string {
	if p := a.assigned.Load(); p != nil {
		return *p
	}
	return a.id
}

// Name returns the agent's logical name.
func (a *Agent) Name() string { return a.name }

// Handle registers h for a method name or a "prefix.*" pattern. It panics
// on an invalid name, as http.ServeMux does.
func (a *Agent) Handle(method string, h HandlerFunc) {
	if err := registry.ValidCapability(method); err != nil {
		panic("agents: " + err.Error())
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if strings.HasSuffix(method, "*") {
		a.patterns = append(a.patterns, pattern{strings.TrimSuffix(method, "*"), h})
		sort.Slice(a.patterns, func(i, j int) bool { return len(a.patterns[i].prefix) > len(a.patterns[j].prefix) })
		return
	}
	a.exact[method] = h
	delete(a.inline, method) // served by a worker, unless HandleInline says otherwise
}

// HandleInline registers h for an exact method name, to run on the
// link's reader goroutine instead of a worker (link.WithInline): for a
// handler that answers from memory and never blocks (no I/O, no lock
// held for long, no wait on ctx), such as echo or a lookup in a map. It
// saves a goroutine hand-off per call, about a third of an echo agent's
// CPU. While it runs the link reads nothing else: a handler that blocks
// holds up every call on the link, and a caller's cancel reaches it
// only after it returned (ctx still carries the request's deadline).
// Telemetry, panics and errors are handled as for Handle.
func (a *Agent) HandleInline(method string, h HandlerFunc) {
	if strings.HasSuffix(method, "*") {
		panic("agents: HandleInline takes an exact method name, not a pattern")
	}
	a.Handle(method, h)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.inline == nil {
		a.inline = map[string]bool{}
	}
	a.inline[method] = true
}

// isInline reports whether method is served on the reader (HandleInline).
func (a *Agent) isInline(method string) bool {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.inline[method]
}

// Methods lists the registered methods and patterns, sorted.
func (a *Agent) Methods() []string {
	a.mu.RLock()
	defer a.mu.RUnlock()
	out := make([]string, 0, len(a.exact)+len(a.patterns))
	for m := range a.exact {
		out = append(out, m)
	}
	for _, p := range a.patterns {
		out = append(out, p.prefix+"*")
	}
	sort.Strings(out)
	return out
}

func (a *Agent) handler(method string) HandlerFunc {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if h, ok := a.exact[method]; ok {
		return h
	}
	for _, p := range a.patterns {
		if strings.HasPrefix(method, p.prefix) {
			return p.h
		}
	}
	return nil
}

// Registered returns a channel that is closed while the agent is
// registered with a hub (a new one is handed out after each loss).
func (a *Agent) Registered() <-chan struct{} {
	a.regMu.Lock()
	defer a.regMu.Unlock()
	return a.regCh
}

func (a *Agent) setRegistered(on bool) {
	a.regMu.Lock()
	defer a.regMu.Unlock()
	select {
	case <-a.regCh:
		if !on {
			a.regCh = make(chan struct{})
		}
	default:
		if on {
			close(a.regCh)
		}
	}
}

// Run connects to the hubs (tried in turn), registers, heartbeats and
// serves until ctx ends; after a lost link it reconnects after a jittered
// delay (link.Redial) and registers again. A hub's goaway (it is draining)
// moves the agent to the next hub at once: it registers there, then
// deregisters from the draining hub and closes that link once the requests
// it serves there are answered. When ctx ends it deregisters,
// waits for handlers in flight (at most the drain timeout) and returns nil.
func (a *Agent) Run(ctx context.Context, hubs ...string) error {
	if len(hubs) == 0 {
		hubs = []string{link.DefaultHubURL}
	}
	if len(a.Methods()) == 0 {
		return errors.New("agents: no handlers registered")
	}
	var bo link.Redial
	t := time.NewTimer(0)
	<-t.C
	defer t.Stop()
	defer a.drains.Wait()
	var prev *oldLink // the link of a draining hub, until registered elsewhere
	defer func() {
		if prev != nil {
			a.retire(ctx, prev, "")
		}
	}()
	for i := 0; ; i++ {
		hub := hubs[i%len(hubs)]
		registered, next, err := a.session(ctx, hub, prev)
		if registered {
			prev = nil // session retired it
			bo.Reset()
		}
		if ctx.Err() != nil {
			return nil
		}
		if next != nil {
			// The hub is draining (goaway): register on the next hub at
			// once; the old link is retired once that succeeded.
			a.log.Info("hub is draining (goaway); moving to the next hub", "hub", hub)
			if prev != nil {
				a.retire(ctx, prev, hub)
			}
			prev = next
			continue
		}
		if c := envelope.CodeOf(err); c == envelope.CodeUnauthenticated || c == envelope.CodePermissionDenied {
			// Trying again with the same token cannot succeed.
			a.log.Error("the hub refused this agent's credentials", "hub", hub, "error", err)
			return err
		}
		d := bo.Next()
		if registered && len(hubs) > 1 {
			// Lost a hub while others are listed: try the next one,
			// spread so that the links of the lost hub do not all
			// arrive at once (S03): over link.RedialSpread, or one
			// heartbeat interval when that is shorter, so that the
			// agent is registered elsewhere within about two intervals.
			// With a single hub the Redial delay spreads the storm on
			// the restarting hub (S04).
			spread := link.RedialSpread
			if b := time.Duration(a.beat.Load()); b > 0 && b < spread {
				spread = b
			}
			d = rand.N(spread)
		}
		a.log.Warn("hub link lost; reconnecting", "hub", hub, "error", err, "in", d)
		t.Reset(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil
		}
	}
}

// oldLink is the link of a hub that sent goaway, kept while the agent
// registers elsewhere: a keeper goroutine goes on heartbeating over it, so
// that the draining hub does not expire the agent (and fail the requests
// it still serves there) before the move is done.
type oldLink struct {
	l    *link.Link
	stop chan struct{}
	done chan struct{}
}

func (a *Agent) keep(ctx context.Context, l *link.Link, interval time.Duration) *oldLink {
	o := &oldLink{l: l, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(o.done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-o.stop:
				return
			case <-l.Done():
				return
			case <-ctx.Done():
				return
			case <-tick.C:
				_ = a.heartbeat(ctx, l, interval)
			}
		}
	}()
	return o
}

// retire leaves the link of a draining hub: it stops heartbeating there,
// deregisters there (the registration already moved to another hub, so
// this only drops the draining hub's binding) and closes the link once
// the requests it serves are answered.
func (a *Agent) retire(ctx context.Context, o *oldLink, hub string) {
	close(o.stop)
	<-o.done
	l := o.l
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	if err := callLink(dctx, l, "agent.deregister", control.DeregisterParams{AgentID: a.ID(), Reason: "hub draining"}, nil, 2*time.Second); err != nil && l.Err() == nil {
		a.log.Warn("deregister from the draining hub failed", "hub", hub, "error", err)
	}
	cancel()
	a.drains.Go(func() {
		// Bounded by the drain timeout, not by ctx: an agent stopping
		// still finishes the requests it serves there (as shutdown does).
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), a.drain)
		defer cancel()
		link.Drain(dctx, l, func() int { return l.Serving() + l.Pending() })
		a.links.Delete(l)
	})
}

// session runs one link's life: dial, register, heartbeat, serve. Once
// registered it retires prev, the link of a hub that sent goaway
// (make before break: the agent is never registered nowhere). On a goaway
// it returns the link as next, still open (and heartbeated) for the
// requests it serves.
func (a *Agent) session(ctx context.Context, hub string, prev *oldLink) (registered bool, next *oldLink, err error) {
	a.log.Debug("dialing hub", "hub", hub, "agent", a.ID())
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	cc := a.conn
	if a.tel != nil && a.tel.M != nil && cc.Bytes == nil {
		cc.Bytes = a.tel.M.Bytes // agentmesh_link_bytes_total of the agent's links
	}
	l, err := link.DialToken(dctx, hub, a.token, cc, link.WithHandler(a.tel.Server(a.serve)), link.WithInline(a.isInline), link.WithLogger(a.log))
	cancel()
	if err != nil {
		return false, nil, err
	}
	a.links.Store(l, struct{}{})
	defer func() {
		if next == nil {
			l.Close()
			a.links.Delete(l)
		}
	}()
	defer a.setRegistered(false)
	interval, linkLive, err := a.register(ctx, l)
	if err != nil {
		return false, nil, err
	}
	a.setRegistered(true)
	a.beat.Store(int64(interval))
	if prev != nil {
		a.retire(ctx, prev, "")
	}
	a.log.Info("registered", "hub", hub, "agent", a.ID(), "methods", a.Methods(), "heartbeat", interval.String(), "linkLiveness", linkLive)
	// This agent has no state or load of its own to report: where the
	// hub takes the link for its heartbeat, it sends none.
	tick := time.NewTicker(interval)
	defer tick.Stop()
	beats := tick.C
	if linkLive {
		tick.Stop()
		beats = nil
	}
	for {
		select {
		case <-l.Done():
			return true, nil, l.Err()
		case <-ctx.Done():
			a.shutdown(l)
			return true, nil, nil
		case <-l.GoAway():
			return true, a.keep(ctx, l, interval), nil
		case <-beats:
			if err := a.heartbeat(ctx, l, interval); err != nil {
				if errors.Is(err, envelope.ErrAgentNotFound) {
					// The hub expired us (a pause longer than the TTL):
					// register again on the same link.
					if interval, linkLive, err = a.register(ctx, l); err != nil {
						return true, nil, err
					}
					if linkLive {
						tick.Stop()
						beats = nil
					} else {
						tick.Reset(interval)
					}
					continue
				}
				a.log.Warn("heartbeat failed", "error", err)
			}
		}
	}
}

// Pending returns the agent's pending-map sizes summed over its links:
// requests it is serving and calls it awaits answers to.
func (a *Agent) Pending() int {
	n := 0
	a.links.Range(func(k, _ any) bool {
		l := k.(*link.Link)
		n += l.Serving() + l.Pending()
		return true
	})
	return n
}

// register registers the agent over l; it returns the heartbeat interval
// the hub assigned, and whether the hub takes the link for the
// heartbeat (control.LivenessLink).
func (a *Agent) register(ctx context.Context, l *link.Link) (time.Duration, bool, error) {
	p := control.RegisterParams{AgentID: a.ID(), Name: a.name, Capabilities: a.Methods(), Intents: []string{"serve"}, Schemas: a.Schemas()}
	md := map[string]any{"hostname": hostname(), "version": envelope.Version}
	for k, v := range a.metadata {
		md[k] = v
	}
	p.Metadata, _ = json.Marshal(md)
	var res control.RegisterResult
	err := callLink(ctx, l, "agent.register", p, &res, 10*time.Second)
	if p.Schemas != nil && envelope.CodeOf(err) == envelope.CodeInvalidParams && strings.Contains(err.Error(), "schemas") {
		// Schemas only describe the methods: a hub that refuses them (too
		// big, or a hub from before schemas) still gets the agent.
		a.log.Warn("the hub refused this agent's schemas; registering without them", "error", err)
		p.Schemas = nil
		err = callLink(ctx, l, "agent.register", p, &res, 10*time.Second)
	}
	if err != nil {
		return 0, false, err
	}
	if !res.Accepted {
		return 0, false, errors.New("agents: the hub did not accept the registration")
	}
	if res.AgentID != "" {
		a.assigned.Store(&res.AgentID)
	}
	iv := time.Duration(res.HeartbeatInterval * float64(time.Second))
	if iv <= 0 {
		iv = 5 * time.Second
	}
	return iv, res.Liveness == control.LivenessLink, nil
}

func (a *Agent) heartbeat(ctx context.Context, l *link.Link, interval time.Duration) error {
	p := control.HeartbeatParams{AgentID: a.ID(), Status: control.AgentStatus{
		State: registry.StateReady, QueuedRequests: int(a.inflight.Load()), LastActivity: time.Now().UnixMilli(),
	}}
	return callLink(ctx, l, "agent.heartbeat", p, nil, interval)
}

// shutdown deregisters and waits for handlers in flight.
func (a *Agent) shutdown(l *link.Link) {
	ctx, cancel := context.WithTimeout(context.Background(), a.drain)
	defer cancel()
	if err := callLink(ctx, l, "agent.deregister", control.DeregisterParams{AgentID: a.ID(), Reason: "shutdown"}, nil, 2*time.Second); err != nil {
		a.log.Warn("deregister failed", "error", err)
	}
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for a.inflight.Load() > 0 {
		select {
		case <-ctx.Done():
			a.log.Warn("drain timed out", "inflight", a.inflight.Load())
			return
		case <-t.C:
		}
	}
	// The handlers have returned, but their answers may still wait in the
	// link's queue: close the link only once they are written, or the
	// hub fails those calls with UNAVAILABLE.
	link.Drain(ctx, l, l.Serving)
}

func callLink(ctx context.Context, l *link.Link, method string, params, result any, timeout time.Duration) error {
	raw, err := json.Marshal(params)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	res, err := l.Call(ctx, &envelope.Request{ID: envelope.NewID(), Method: method, Params: raw, Timestamp: time.Now().UnixMilli(), Version: envelope.Version})
	if err != nil {
		return err
	}
	if result == nil {
		return nil
	}
	return json.Unmarshal(res.Result, result)
}

// serve is the link's handler: it runs the method's handler and builds
// the response envelope.
func (a *Agent) serve(ctx context.Context, req *envelope.Request) (res *envelope.Response, err error) {
	h := a.handler(req.Method)
	if h == nil {
		return nil, envelope.Errorf(envelope.CodeMethodNotFound, "agent %s does not serve %q", a.ID(), req.Method)
	}
	a.inflight.Add(1)
	defer a.inflight.Add(-1)
	ctx = context.WithValue(ctx, requestKey{}, req)
	start := time.Now()
	defer func() {
		if p := recover(); p != nil {
			a.log.Error("handler panicked", "method", req.Method, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			// A panic is the Go handler's throw: INTERNAL_ERROR with its
			// value's text, as the other SDKs answer an exception.
			res, err = nil, envelope.Errorf(envelope.CodeInternal, "handler for %s panicked: %v", req.Method, p)
		}
	}()
	v, err := h(ctx, req.Params)
	if err != nil {
		var e *envelope.Error
		if errors.As(err, &e) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return nil, envelope.AsError(err)
		}
		return nil, envelope.NewError(envelope.CodeRPCError, err.Error())
	}
	var raw json.RawMessage
	switch r := v.(type) {
	case json.RawMessage:
		raw = r
	default:
		if raw, err = json.Marshal(v); err != nil {
			return nil, envelope.Errorf(envelope.CodeInternal, "cannot encode the result of %s: %v", req.Method, err)
		}
	}
	d := time.Since(start)
	return &envelope.Response{
		ID: req.ID, Origin: a.ID(), Destination: req.Origin, Timestamp: start.Add(d).UnixMilli(), Result: raw,
		Metrics: envelope.Metrics{LatencyMs: float64(d.Microseconds()) / 1000, ProcessingTime: float64(d.Microseconds()) / 1000, Backend: "WebSocket"},
		Headers: envelope.Headers{TraceID: req.Headers.TraceID, CorrelationID: req.Headers.CorrelationID},
	}, nil
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}

type requestKey struct{}

// RequestFrom returns the request a handler is serving (its id, headers,
// origin); nil outside a handler.
func RequestFrom(ctx context.Context) *envelope.Request {
	r, _ := ctx.Value(requestKey{}).(*envelope.Request)
	return r
}

// Stream is what a streaming handler sends its chunks with (HandleStream).
type Stream struct{ s stream.Sender }

// Send sends v (encoded with encoding/json; a json.RawMessage as it is)
// as the stream's next chunk. It blocks while the caller has granted no
// credit for it (flow control: a caller that stops reading stops the
// handler here), and fails when ctx ends or the caller cancelled.
func (s *Stream) Send(ctx context.Context, v any) error {
	raw, ok := v.(json.RawMessage)
	if !ok {
		var err error
		if raw, err = json.Marshal(v); err != nil {
			return envelope.Errorf(envelope.CodeInternal, "cannot encode a chunk: %v", err)
		}
	}
	return s.s.Send(ctx, raw)
}

// Sent is how many chunks were sent so far (the last sequence number).
func (s *Stream) Sent() uint64 { return s.s.Sent() }

// StreamFunc serves a streaming method: it sends chunks with s and
// returns the stream's end (nil: a clean end; an error: its code ends
// the stream, after the chunks already sent).
type StreamFunc func(ctx context.Context, params json.RawMessage, s *Stream) error

// HandleStream registers a streaming method: callers read it with a
// stream (mesh.Client.Stream, a JSON-RPC call's chunk notifications, SSE,
// agentick's method:chunk events). A plain call to it is refused with
// INVALID_REQUEST. Its end carries {"chunks": N}.
func (a *Agent) HandleStream(method string, h StreamFunc) {
	a.Handle(method, func(ctx context.Context, params json.RawMessage) (any, error) {
		snd := stream.SenderFrom(ctx)
		if snd == nil {
			return nil, envelope.Errorf(envelope.CodeInvalidRequest, "%s is a streaming method: call it as a stream", method)
		}
		if err := h(ctx, params, &Stream{snd}); err != nil {
			return nil, err
		}
		return StreamEnd{Chunks: snd.Sent()}, nil
	})
	a.mu.Lock()
	if a.streaming == nil {
		a.streaming = map[string]bool{}
	}
	a.streaming[method] = true
	a.mu.Unlock()
}

// Streaming reports whether method is served with HandleStream.
func (a *Agent) Streaming(method string) bool {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.streaming[method]
}
