package mesh

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
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/deadline"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/reliability"
	"github.com/agentmesh/agentmesh/telemetry"
)

func ptr[T any](v T) *T { return &v }

// Breakers returns the client's per-method breakers (nil without reliability).
func (c *Client) Breakers() *reliability.Breakers { return c.breakers }

// DefaultCallTimeout bounds a call whose context has no deadline.
const DefaultCallTimeout = 10 * time.Second

type clientConfig struct {
	timeout      time.Duration
	origin       string
	token        string
	log          *slog.Logger
	conn         link.Config
	httpClient   *http.Client
	waitForReady bool
	middleware   []envelope.Middleware
	reliability  *reliability.Config // nil: no reliability chain
	transport    envelope.Invoker    // replaces ws/http when set
	tel          *telemetry.Telemetry
}

// ClientOption configures a Client.
type ClientOption func(*clientConfig)

// WithTimeout sets the timeout of calls whose context has no deadline
// (default 10 s).
func WithTimeout(d time.Duration) ClientOption { return func(c *clientConfig) { c.timeout = d } }

// WithTLS sets the TLS configuration for wss:// and https:// hubs
// (ClientTLS).
func WithTLS(cfg *tls.Config) ClientOption { return func(c *clientConfig) { c.conn.TLS = cfg } }

// WithToken sets the bearer token presented to the hub (meshd --auth-key).
func WithToken(tok string) ClientOption { return func(c *clientConfig) { c.token = tok } }

// WithOrigin sets the origin written into requests (default "client").
func WithOrigin(o string) ClientOption { return func(c *clientConfig) { c.origin = o } }

// WithClientLogger sets the client's logger.
func WithClientLogger(l *slog.Logger) ClientOption { return func(c *clientConfig) { c.log = l } }

// WithConnConfig tunes the client's WebSocket.
func WithConnConfig(cc link.Config) ClientOption { return func(c *clientConfig) { c.conn = cc } }

// WithHTTPClient sets the HTTP client of an http:// client.
func WithHTTPClient(hc *http.Client) ClientOption { return func(c *clientConfig) { c.httpClient = hc } }

// WithWaitForReady makes calls wait for a connection until their deadline
// even after a dial failed. By default a call fails at once with
// UNAVAILABLE while the client cannot reach any hub (gRPC's fail-fast).
func WithWaitForReady() ClientOption { return func(c *clientConfig) { c.waitForReady = true } }

// WithReliability sets the client's policies, per-method breakers,
// bulkheads and retry budget (default: reliability.DefaultConfig()).
func WithReliability(rc reliability.Config) ClientOption {
	return func(c *clientConfig) { c.reliability = &rc }
}

// WithoutReliability sends calls straight to the transport: no breaker,
// bulkhead, retry or policy timeout. For measurements and tests.
func WithoutReliability() ClientOption { return func(c *clientConfig) { c.reliability = nil } }

// WithTransport replaces the network with an invoker (see meshtest.Transport):
// the client dials nothing and sends every attempt to inv.
func WithTransport(inv envelope.Invoker) ClientOption {
	return func(c *clientConfig) { c.transport = inv }
}

// WithClientTelemetry instruments the client: a CLIENT span per call, a
// child per attempt whose context travels in the headers, and the client
// metrics when t has them.
func WithClientTelemetry(t *telemetry.Telemetry) ClientOption {
	return func(c *clientConfig) { c.tel = t }
}

// WithMiddleware adds middlewares around the transport, outermost first,
// inside the call's telemetry span and outside its reliability chain.
func WithMiddleware(m ...envelope.Middleware) ClientOption {
	return func(c *clientConfig) { c.middleware = append(c.middleware, m...) }
}

// Client is the unified client: the same Call over a WebSocket link
// (ws://…/ws, many calls multiplexed on one connection) or over HTTP
// (http://…/rpc, JSON-RPC 2.0). It is safe for concurrent use.
//
// A WebSocket client dials in the background from NewClient on, and
// redials with backoff after a loss; calls pending on a lost connection
// fail at once with UNAVAILABLE. Close stops it.
type Client struct {
	cfg      clientConfig
	hubs     []string
	useWS    bool
	invoke   envelope.Invoker
	policies *reliability.PolicySet // nil without reliability
	breakers *reliability.Breakers

	mu       sync.Mutex
	link     *link.Link
	lastErr  error
	changed  chan struct{}           // closed and replaced on every state change
	draining map[*link.Link]struct{} // links whose hub sent a goaway, until their calls end

	httpSeq atomic.Uint64
	stop    context.CancelFunc
	done    chan struct{}
	closed  sync.Once
}

// NewClient returns a client for the given hub URLs (tried in turn on
// failure). All must be WebSocket (ws://, wss://) or all HTTP (http://,
// https://). It does no I/O; a WebSocket client starts one goroutine.
func NewClient(hubs []string, opts ...ClientOption) (*Client, error) {
	c := &Client{
		cfg: clientConfig{
			timeout: DefaultCallTimeout, origin: "client", log: slog.New(slog.DiscardHandler),
			httpClient:  &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second}},
			reliability: ptr(reliability.DefaultConfig()),
		},
		changed:  make(chan struct{}),
		done:     make(chan struct{}),
		draining: map[*link.Link]struct{}{},
	}
	defHTTP := c.cfg.httpClient
	for _, o := range opts {
		o(&c.cfg)
	}
	if c.cfg.conn.TLS != nil && c.cfg.httpClient == defHTTP {
		defHTTP.Transport.(*http.Transport).TLSClientConfig = c.cfg.conn.TLS
	}
	if len(hubs) == 0 {
		hubs = []string{link.DefaultHubURL}
	}
	if c.cfg.transport != nil {
		hubs = []string{"http://in-memory"}
	}
	hubs = slices.Clone(hubs)
	for i, h := range hubs {
		ws := strings.HasPrefix(h, "ws://") || strings.HasPrefix(h, "wss://")
		hp := strings.HasPrefix(h, "http://") || strings.HasPrefix(h, "https://")
		if !ws && !hp {
			return nil, fmt.Errorf("mesh: hub URL %q must start with ws://, wss://, http:// or https://", h)
		}
		if i == 0 {
			c.useWS = ws
		} else if ws != c.useWS {
			return nil, errors.New("mesh: hub URLs must all be WebSocket or all HTTP")
		}
		if ws {
			u, err := link.WSURL(h)
			if err != nil {
				return nil, err
			}
			hubs[i] = u
		} else if _, err := url.Parse(h); err != nil {
			return nil, fmt.Errorf("mesh: bad hub URL %q: %w", h, err)
		}
	}
	c.hubs = hubs
	transport := c.httpInvoke
	if c.useWS {
		transport = c.wsInvoke
	}
	if c.cfg.transport != nil {
		transport = c.cfg.transport
	}
	// The chain: the call's span, the caller's middlewares (inside it, so
	// they see the trace), then breaker, bulkhead, retry, and a span per
	// attempt next to the transport.
	tel := c.cfg.tel
	mws := append([]envelope.Middleware{tel.Client}, c.cfg.middleware...)
	if rc := c.cfg.reliability; rc != nil {
		if err := rc.Validate(); err != nil {
			return nil, err
		}
		c.policies, _ = rc.PolicySet()
		var onChange func(k reliability.BreakerKey, from, to string)
		if tel != nil && tel.M != nil {
			m := tel.M
			onChange = func(k reliability.BreakerKey, from, to string) {
				m.BreakerChanged(k.Method, from, to)
			}
		}
		c.breakers = reliability.NewBreakers(rc.CircuitBreaker, onChange)
		// The breaker sits outside the retry loop, so that a rejection is
		// never retried; the retry loop retries only what failed on the
		// way to the hub (the hub's router retries what failed beyond it).
		var onRetry, onSkip func(method, reason string)
		if tel != nil && tel.M != nil {
			onRetry, onSkip = tel.M.Retry, tel.M.RetrySkipped
		}
		mws = append(mws, c.breakers.Middleware,
			reliability.NewBulkheads(rc.Bulkhead).Middleware,
			reliability.Retry(c.policies, reliability.RetryOptions{
				Budget: reliability.NewBudget(rc.RetryBudget), Latency: reliability.NewLatency(), OnRetry: onRetry, OnSkip: onSkip,
			}))
	}
	mws = append(mws, tel.Attempt)
	c.invoke = transport
	if len(mws) > 0 {
		c.invoke = envelope.Chain(mws[0], mws[1:]...)(transport)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.stop = cancel
	if c.useWS {
		go c.maintain(ctx)
	} else {
		close(c.done)
	}
	return c, nil
}

// CallOption adjusts one call.
type CallOption func(*callOpts)

type callOpts struct {
	timeout     time.Duration
	destination string
	headers     func(*envelope.Headers)
	response    *envelope.Response
}

// CallTimeout sets this call's timeout (when ctx has no earlier deadline).
func CallTimeout(d time.Duration) CallOption { return func(o *callOpts) { o.timeout = d } }

// To routes the call to one agent instance.
func To(agentID string) CallOption { return func(o *callOpts) { o.destination = agentID } }

// WithHeaders edits the request's headers before it is sent.
func WithHeaders(f func(*envelope.Headers)) CallOption { return func(o *callOpts) { o.headers = f } }

// ResponseInto stores the whole response envelope (metrics, headers) in r.
func ResponseInto(r *envelope.Response) CallOption { return func(o *callOpts) { o.response = r } }

// Call calls method with params (marshalled with encoding/json unless it
// is a json.RawMessage or []byte) and decodes the result into result (a
// *json.RawMessage receives it raw; nil discards it). Errors are
// *envelope.Error values.
func (c *Client) Call(ctx context.Context, method string, params, result any, opts ...CallOption) error {
	var o callOpts
	if len(opts) > 0 {
		o = applyCallOpts(opts) // o itself does not escape: no allocation for a call without options
	}
	raw, err := marshalParams(params)
	if err != nil {
		return err
	}
	start := time.Now() // the timestamp, and the latency's start: one clock read
	req := &envelope.Request{
		ID: envelope.NewIDAt(start), Origin: c.cfg.origin, Destination: o.destination,
		Timestamp: start.UnixMilli(), Method: method, Params: raw, Version: envelope.Version,
	}
	if o.headers != nil {
		o.headers(&req.Headers)
	}
	// The deadline: this call's CallTimeout, else the caller's, else the
	// method's policy timeout, else the client's default. The policy
	// timeout also caps the first two (in the retry middleware).
	timeout := o.timeout
	if _, ok := ctx.Deadline(); !ok && timeout <= 0 {
		timeout = c.cfg.timeout
		if c.policies != nil {
			if pt := c.policies.For(method).Timeout; pt > 0 {
				timeout = pt
			}
		}
	}
	if err := ctx.Err(); err != nil {
		// Expired or cancelled before anything was sent: the caller's own
		// doing, which no breaker should count.
		return envelope.AsError(err).MarkNotSent()
	}
	if timeout > 0 {
		// Its timer is the link's (deadline.Ctx), unless something on
		// the way waits on its Done. It ends after ctx: not yet.
		dl := deadline.New(ctx, start.Add(timeout))
		defer dl.End()
		ctx = dl
	}
	res, err := c.invoke(ctx, req)
	if err != nil {
		return envelope.AsError(err)
	}
	res.Metrics.LatencyMs = ms(time.Since(start))
	if o.response != nil {
		*o.response = *res
	}
	return unmarshalResult(res.Result, result)
}

func applyCallOpts(opts []CallOption) callOpts {
	var o callOpts
	for _, f := range opts {
		f(&o)
	}
	return o
}

// Invoke sends a prepared request through the client's middleware and
// transport. It is the client's envelope.Invoker.
func (c *Client) Invoke(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
	return c.invoke(ctx, req)
}

func marshalParams(p any) (json.RawMessage, error) {
	switch v := p.(type) {
	case nil:
		return nil, nil
	case json.RawMessage:
		return v, nil
	case []byte:
		return v, nil
	}
	b, err := json.Marshal(p)
	if err != nil {
		return nil, envelope.Errorf(envelope.CodeInvalidParams, "cannot encode params: %v", err)
	}
	return b, nil
}

func unmarshalResult(raw json.RawMessage, result any) error {
	switch v := result.(type) {
	case nil:
		return nil
	case *json.RawMessage:
		*v = append((*v)[:0], raw...)
		return nil
	}
	if err := json.Unmarshal(raw, result); err != nil {
		return envelope.Errorf(envelope.CodeInternal, "cannot decode result: %v", err)
	}
	return nil
}

// wsInvoke waits for a link (until ctx ends, or at once when the last dial
// failed and WithWaitForReady is not set) and calls over it.
func (c *Client) wsInvoke(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
	for redirects := 0; ; {
		c.mu.Lock()
		l, lastErr, changed := c.link, c.lastErr, c.changed
		c.mu.Unlock()
		if l != nil {
			telemetry.AnnotateServer(ctx, l.Remote)
			res, err := l.Call(ctx, req)
			// The hub sent goaway while this call was on its way and
			// refused it unexecuted: it goes to the next hub, once the
			// client has moved there. That is a redirect, not a retry.
			if err == nil || !l.GoingAway() || !envelope.AsError(err).NotSent() || redirects >= len(c.hubs)-1 {
				return res, err
			}
			c.mu.Lock()
			if c.link == l {
				changed = c.changed
				c.mu.Unlock()
				select {
				case <-changed:
				case <-ctx.Done():
					return res, err
				}
			} else {
				c.mu.Unlock()
			}
			redirects++
			continue
		}
		if lastErr != nil && !c.cfg.waitForReady {
			return nil, lastErr
		}
		select {
		case <-changed:
		case <-ctx.Done():
			if lastErr != nil {
				return nil, lastErr
			}
			return nil, envelope.WrapError(envelope.CodeOf(ctx.Err()), "no connection to a hub before the deadline", ctx.Err()).MarkNotSent()
		}
	}
}

func (c *Client) setState(l *link.Link, err error) {
	c.mu.Lock()
	c.link, c.lastErr = l, err
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

// maintain keeps one link up. It tries the hubs in turn; after every hub
// failed once it waits a link.Redial delay (jittered, at least 100 ms). A lost
// link is redialled at once when it is the only hub, else the next hub
// after LostDelay (spread, S03). A hub's goaway (it is
// draining) moves new calls to the next hub at once, while the old link
// stays open until the calls pending on it are answered.
func (c *Client) maintain(ctx context.Context) {
	defer close(c.done)
	var drains sync.WaitGroup
	defer drains.Wait()
	var bo link.Redial
	t := time.NewTimer(0)
	defer t.Stop()
	<-t.C
	fails := 0
	for i := 0; ; i++ {
		hub := c.hubs[i%len(c.hubs)]
		c.cfg.log.Debug("dialing hub", "hub", hub)
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		l, err := link.DialToken(dctx, hub, c.cfg.token, c.cfg.conn, link.WithLogger(c.cfg.log))
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				c.setState(nil, envelope.NewError(envelope.CodeUnavailable, "client closed").MarkNotSent())
				return
			}
			c.cfg.log.Debug("hub dial failed", "hub", hub, "error", err)
			c.setState(nil, err)
			if fails++; fails%len(c.hubs) != 0 {
				continue // another hub has not been tried in this round
			}
			t.Reset(bo.Next())
			select {
			case <-t.C:
				continue
			case <-ctx.Done():
				c.setState(nil, envelope.NewError(envelope.CodeUnavailable, "client closed").MarkNotSent())
				return
			}
		}
		fails = 0
		bo.Reset()
		c.setState(l, nil)
		select {
		case <-l.Done():
			c.cfg.log.Debug("hub link lost", "hub", hub, "error", l.Err())
			if c.cfg.tel != nil {
				c.cfg.tel.M.Reconnected("client")
			}
			c.setState(nil, nil)
			l.Close()
			if len(c.hubs) == 1 {
				i-- // redial it at once; if refused, the link.Redial schedule
				continue
			}
			// Another hub is listed: go there, after a spread delay so
			// that the links of a lost hub do not arrive in one wave.
			t.Reset(link.LostDelay())
			select {
			case <-t.C:
			case <-ctx.Done():
				c.setState(nil, envelope.NewError(envelope.CodeUnavailable, "client closed").MarkNotSent())
				return
			}
		case <-l.GoAway():
			c.cfg.log.Debug("hub is draining (goaway); moving to the next hub", "hub", hub)
			c.setState(nil, nil)
			c.mu.Lock()
			c.draining[l] = struct{}{}
			c.mu.Unlock()
			drains.Go(func() {
				link.Drain(ctx, l, l.Pending)
				c.mu.Lock()
				delete(c.draining, l)
				c.mu.Unlock()
			})
		case <-ctx.Done():
			c.setState(nil, envelope.NewError(envelope.CodeUnavailable, "client closed").MarkNotSent())
			l.Close()
			return
		}
	}
}

// Pending returns how many calls the client awaits answers to on its
// links (the current one and those draining after a goaway).
func (c *Client) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	if c.link != nil {
		n += c.link.Pending()
	}
	for l := range c.draining {
		n += l.Pending()
	}
	return n
}

// httpInvoke sends the request as JSON-RPC 2.0 over HTTP POST.
func (c *Client) httpInvoke(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
	if p := bytes.TrimSpace(req.Params); len(p) > 0 && p[0] != '{' && p[0] != '[' {
		// JSON-RPC 2.0 allows only structured params; say so here rather
		// than let the hub refuse the whole request.
		return nil, envelope.NewError(envelope.CodeInvalidParams,
			"JSON-RPC 2.0 params must be an object or an array; wrap the value, or call through a ws:// hub URL").MarkNotSent()
	}
	r := *req
	r.Headers.SetDeadline(ctx)
	id := strconv.AppendUint(nil, c.httpSeq.Add(1), 10)
	body := envelope.AppendJSONRPCRequest(nil, id, &r)
	hub := c.hubs[0]
	u := strings.TrimSuffix(hub, "/")
	if !strings.HasSuffix(u, "/rpc") {
		u += "/rpc"
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return nil, envelope.WrapError(envelope.CodeInvalidRequest, "bad hub URL", err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	if c.cfg.token != "" {
		hreq.Header.Set("Authorization", "Bearer "+c.cfg.token)
	}
	hres, err := c.cfg.httpClient.Do(hreq)
	if err != nil {
		if ctx.Err() != nil {
			return nil, envelope.AsError(ctx.Err())
		}
		e := envelope.WrapError(envelope.CodeUnavailable, "cannot reach hub "+u+": "+link.NetErrText(err), errors.Join(link.ErrHubUnreachable, err))
		var oe *net.OpError
		if errors.As(err, &oe) && oe.Op == "dial" {
			e.MarkNotSent()
		}
		return nil, e
	}
	defer hres.Body.Close()
	lim := envelope.DefaultLimits()
	data, err := io.ReadAll(io.LimitReader(hres.Body, int64(lim.MaxBytes)+1))
	if err != nil {
		return nil, envelope.WrapError(envelope.CodeUnavailable, "reading the hub's answer failed", err)
	}
	rep, derr := envelope.DecodeJSONRPCResponse(data, lim)
	if derr != nil {
		return nil, envelope.Errorf(envelope.CodeInternal, "hub answered HTTP %d with an undecodable body: %s", hres.StatusCode, derr.Message)
	}
	if rep.Err != nil {
		return nil, rep.Err
	}
	return &envelope.Response{ID: req.ID, Result: rep.Result, Timestamp: time.Now().UnixMilli(), Metrics: envelope.Metrics{Backend: "HTTP"}}, nil
}

// Close stops the client: its link closes, pending calls fail with
// UNAVAILABLE, and its goroutine exits. Idempotent.
func (c *Client) Close() error {
	c.closed.Do(func() {
		c.stop()
		<-c.done
		if !c.useWS {
			c.cfg.httpClient.CloseIdleConnections()
		}
	})
	return nil
}
