// Package console is meshd's live web console (issue [M14]), served by
// the hub at /ui/: the mesh's agents, methods (instances, calls/s, error
// ratio, p50/p99 over the last minute, breakers), the failed and slow calls
// as they happen, and a form to call any method.
//
//	GET  /ui/             the page (embedded: no CDN, works offline)
//	GET  /ui/api/stream   the live view, as server-sent events (one "view"
//	                      event per second while the page is open)
//	POST /ui/api/call     {method, params} → {result | error, durationMs, traceId}
//	                      (params checked first against the method's declared schema)
//	GET  /ui/api/schema   ?method=M → its description and params schema
//
// The page is plain HTML, CSS and one ES module (no framework, no build
// step): the console is three tables, a tail and a form, redrawn from one
// JSON view a second, which the DOM API does in a few hundred lines;
// a framework would be a dependency to vendor and a build to check for
// a page that small (Linkerd viz and NATS surveyor ship far more).
//
// The view comes from what the hub already keeps, not from Prometheus:
// the registry's snapshot (agents, methods, heartbeats), the breakers
// (mesh.breakers), and the hub's own rpc_server_call_duration_seconds
// (rates, error ratios, quantiles over a sliding minute), so the console
// works with no other service running. Nothing is computed while no page
// is open. In a cluster, each hub's registry holds the whole mesh: every
// hub's console shows every agent; rates are the calls this hub served.
//
// Authentication: with a key, every API request needs an admin-role
// bearer token in its Authorization header (the page asks for it once and
// keeps it in sessionStorage; the stream is read with fetch, which sends
// the header, so no token rides in a URL and no cookie authenticates
// anything). The page itself holds no data and is served to anyone the
// origin policy admits.
package console

import (
	"context"
	"embed"
	"encoding/json"
	"io/fs"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/surface"
	"github.com/agentmesh/agentmesh/telemetry"
)

//go:embed static
var static embed.FS

// Config is the console's: JaegerURL, when set, makes trace ids links
// ($MESH_JAEGER_URL); Tick is how often the view is pushed (default 1 s);
// SlowAfter is the duration from which a call is in the tail of slow
// calls (default 500 ms; failed calls always are).
type Config struct {
	JaegerURL string
	Tick      time.Duration
	SlowAfter time.Duration
}

// Mount serves the console on h at /ui/.
func Mount(h surface.Host, cfg Config) {
	if cfg.Tick <= 0 {
		cfg.Tick = time.Second
	}
	if cfg.SlowAfter <= 0 {
		cfg.SlowAfter = 500 * time.Millisecond
	}
	c := &console{h: h, cfg: cfg}
	c.view = newViewer(h, cfg.Tick)
	c.tail = newTail(h, cfg.SlowAfter, 100)
	sub, _ := fs.Sub(static, "static")
	files := http.StripPrefix("/ui/", http.FileServer(http.FS(sub)))
	h.Handle("GET /ui/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	}))
	h.Handle("GET /ui/api/info", http.HandlerFunc(c.info))
	h.Handle("GET /ui/api/whoami", http.HandlerFunc(c.whoami))
	h.Handle("GET /ui/api/stream", http.HandlerFunc(c.stream))
	h.Handle("GET /ui/api/schema", http.HandlerFunc(c.schema))
	h.Handle("POST /ui/api/call", http.HandlerFunc(c.call))
	h.Track(c)
}

// console is the console mounted on one hub.
type console struct {
	h    surface.Host
	cfg  Config
	view *viewer
	tail *tail

	mu     sync.Mutex
	closed bool
	stop   []context.CancelFunc
}

// Close ends the open streams (the hub shuts down).
func (c *console) Close() {
	c.mu.Lock()
	c.closed = true
	stop := c.stop
	c.stop = nil
	c.mu.Unlock()
	for _, f := range stop {
		f()
	}
	c.view.close()
	c.tail.close()
}

// sameOrigin admits the page's own requests (a module script and a POST
// carry an Origin: this hub's own host), requests with no Origin, and
// those of an origin the hub allows; a page of another site is refused
// (403), so it cannot read or call through a logged-in console.
func (c *console) sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	if u, err := url.Parse(o); err == nil && u.Host == r.Host {
		return true
	}
	return c.h.CheckOrigin(r)
}

// admit checks a console API request: the origin, then, with a key, an
// admin-role token. On refusal it has answered w.
func (c *console) admit(w http.ResponseWriter, r *http.Request) (*auth.Principal, bool) {
	h := c.h
	if !c.sameOrigin(r) {
		http.Error(w, "origin not allowed", http.StatusForbidden)
		return nil, false
	}
	if !h.AuthOn() {
		return nil, true
	}
	who, err := h.Authenticate(r)
	if err != nil {
		h.Refuse(w, err)
		return nil, false
	}
	if who == nil || !who.HasRole(auth.RoleAdmin) {
		h.Refuse(w, envelope.NewError(envelope.CodePermissionDenied, "the console needs a token with the admin role"))
		return nil, false
	}
	return who, true
}

// info is GET /ui/api/info: whether a token is needed (no data: the
// page asks it first, so that it never makes a request to be refused).
func (c *console) info(w http.ResponseWriter, r *http.Request) {
	if !c.sameOrigin(r) {
		http.Error(w, "origin not allowed", http.StatusForbidden)
		return
	}
	writeJSON(w, map[string]any{"hub": c.h.ID(), "authRequired": c.h.AuthOn()})
}

// whoami is GET /ui/api/whoami: whether the request's token may use the
// console, answered 200 {ok, error} either way (the page's check of a
// token typed in, without a refused request in the browser's log).
func (c *console) whoami(w http.ResponseWriter, r *http.Request) {
	if !c.sameOrigin(r) {
		http.Error(w, "origin not allowed", http.StatusForbidden)
		return
	}
	if !c.h.AuthOn() {
		writeJSON(w, map[string]any{"ok": true})
		return
	}
	who, err := c.h.Authenticate(r)
	switch {
	case err != nil:
		writeJSON(w, map[string]any{"ok": false, "error": err.Code.String() + ": " + err.Message})
	case who == nil || !who.HasRole(auth.RoleAdmin):
		writeJSON(w, map[string]any{"ok": false, "error": "PERMISSION_DENIED: the console needs a token with the admin role"})
	default:
		writeJSON(w, map[string]any{"ok": true, "subject": who.Subject})
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	b, _ := json.Marshal(v)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b)
}

// stream is GET /ui/api/stream: a "hello" event, then a "view" event per
// tick and a "call" event per failed or slow call, until the page goes.
func (c *console) stream(w http.ResponseWriter, r *http.Request) {
	who, ok := c.admit(w, r)
	if !ok {
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		http.Error(w, "hub is shutting down", http.StatusServiceUnavailable)
		return
	}
	c.stop = append(c.stop, cancel)
	c.mu.Unlock()
	ctx = c.h.WithCaller(ctx, who, "")
	hdr := w.Header()
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	send := func(event string, data []byte) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(10 * time.Second))
		b := make([]byte, 0, len(data)+32)
		b = append(b, "event: "...)
		b = append(b, event...)
		b = append(b, "\ndata: "...)
		b = append(b, data...)
		b = append(b, "\n\n"...)
		if _, err := w.Write(b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	hello, _ := json.Marshal(map[string]any{"hub": c.h.ID(), "jaegerUrl": c.cfg.JaegerURL, "tickMs": c.cfg.Tick.Milliseconds()})
	if !send("hello", hello) {
		return
	}
	views := c.view.subscribe(ctx, who)
	calls := c.tail.subscribe(ctx)
	for _, rec := range c.tail.recentCalls() {
		if !send("call", rec) {
			return
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case v, ok := <-views:
			if !ok || !send("view", v) {
				return
			}
		case rec, ok := <-calls:
			if !ok || !send("call", rec) {
				return
			}
		}
	}
}

// callRequest is POST /ui/api/call's body.
type callRequest struct {
	Method string          `json:"method"`
	Params json.RawMessage `json:"params,omitempty"`
}

// call is POST /ui/api/call: the method called through the hub's ingress
// as the console's user (roles, policies, traces and metrics as any call),
// answered with its result or error, its duration and its trace id.
func (c *console) call(w http.ResponseWriter, r *http.Request) {
	who, ok := c.admit(w, r)
	if !ok {
		return
	}
	var body callRequest
	w.Header().Set("Cache-Control", "no-store")
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, int64(c.h.ConnConfig().Limits.MaxBytes)))
	if err := dec.Decode(&body); err != nil || body.Method == "" {
		c.h.Refuse(w, envelope.NewError(envelope.CodeInvalidRequest, `the body must be {"method": NAME, "params": JSON}`))
		return
	}
	if len(body.Params) > 0 && !json.Valid(body.Params) {
		c.h.Refuse(w, envelope.NewError(envelope.CodeParseError, "params are not valid JSON"))
		return
	}
	if e := c.checkParams(body.Method, body.Params); e != nil {
		writeJSON(w, map[string]any{"error": map[string]any{"code": e.Code.String(), "message": e.Message}, "checked": "schema"})
		return
	}
	_, conn := c.h.Caller(r.Context())
	ctx := c.h.WithCaller(r.Context(), who, conn)
	req := &envelope.Request{ID: envelope.NewID(), Method: body.Method, Params: body.Params, Origin: "console",
		Timestamp: time.Now().UnixMilli(), Version: envelope.Version}
	// The call's trace: the console's own client span is its root (written
	// after the call, as meshctl bench writes its spans, when an OTLP
	// endpoint is configured), the hub's server span its child.
	traceID, spanID := telemetry.NewSpanIDs()
	req.Headers.Traceparent, req.Headers.TraceID = "00-"+traceID+"-"+spanID+"-01", traceID
	start := time.Now()
	res, err := c.h.Invoke(ctx, req)
	end := time.Now()
	out := map[string]any{"durationMs": float64(end.Sub(start).Microseconds()) / 1000, "traceId": traceID, "requestId": req.ID}
	if err != nil {
		e := envelope.AsError(err)
		out["error"] = map[string]any{"code": e.Code.String(), "message": e.Message}
	} else {
		out["result"] = res.Result
	}
	defer c.exportSpan(r.Context(), telemetry.ClientSpan{TraceID: traceID, SpanID: spanID, Method: body.Method,
		RequestID: req.ID, Start: start, End: end, Code: envelope.CodeOf(err)})
	b, _ := json.Marshal(out)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// exportSpan writes the console call's client span, when the process
// exports traces (OTEL_EXPORTER_OTLP_ENDPOINT): the trace id the page
// shows then opens a trace rooted at it.
func (c *console) exportSpan(ctx context.Context, s telemetry.ClientSpan) {
	if endpoint, isDefault := telemetry.CLIEndpoint(); !isDefault && !telemetry.Disabled() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = telemetry.ExportClientSpans(ctx, telemetry.TracingConfig{ServiceName: "meshd-console", Endpoint: endpoint}, []telemetry.ClientSpan{s})
	}
}
