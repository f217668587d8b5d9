package telemetry

import (
	"context"
	"net"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/attemptinfo"
)

// Telemetry instruments one process's calls: spans (when tracing is on)
// and metrics (when Metrics is set). The zero value and a nil *Telemetry
// do nothing. Safe for concurrent use.
type Telemetry struct {
	tracer  trace.Tracer
	tracing bool
	M       *Metrics
	system  string
	control atomic.Pointer[func(method string) bool] // control-plane methods (SetControl)
}

// SetControl names the control-plane methods (a hub's built-ins:
// registration, heartbeats, probes, introspection). Their server calls
// are not traced unless the caller's own trace is sampled (a heartbeat
// every few seconds per agent would bury the user calls in a trace
// search), and their durations go to agentmesh_control_call_duration_seconds,
// out of the user calls' rpc_server_call_duration_seconds. Call it before
// the first call. (Several hubs of a test may share a Telemetry: they
// name the same built-ins.)
func (t *Telemetry) SetControl(control func(method string) bool) {
	if t != nil {
		t.control.Store(&control)
	}
}

// New returns a Telemetry over provider p (nil: no tracing) and m (nil:
// no metrics).
func New(p *Provider, m *Metrics) *Telemetry {
	t := &Telemetry{M: m, system: System}
	if p != nil && p.Enabled {
		t.tracer = p.Tracer("github.com/agentmesh/agentmesh")
		t.tracing = true
	}
	return t
}

// Tracing reports whether spans are made.
func (t *Telemetry) Tracing() bool { return t != nil && t.tracing }

func (t *Telemetry) label(method string) string {
	if t.M == nil {
		return method
	}
	return t.M.Method(method)
}

// startAttrs describe the call. They are set just after the span starts,
// and only on recording spans: the samplers in use (always, ratio,
// parent-based) do not read attributes, and unsampled calls then build none.
func (t *Telemetry) startAttrs(req *envelope.Request, label string) []attribute.KeyValue {
	a := []attribute.KeyValue{keySystem.String(t.system), keyMethod.String(label), keyRequestID.String(req.ID)}
	if label != req.Method {
		a = append(a, keyMethodOriginal.String(req.Method))
	}
	return a
}

// end records the outcome on span: error status with the symbolic code in
// the description and the numeric code in rpc.response.status_code.
func end(span trace.Span, err error) {
	if err != nil {
		e := envelope.AsError(err)
		sc := statusCode(e.Code)
		span.SetAttributes(keyStatusCode.String(sc), keyErrorType.String(sc), keyCode.String(e.Code.String()))
		if e.NotSent() {
			span.SetAttributes(keyNotSent.Bool(true))
		}
		span.SetStatus(codes.Error, e.Code.String()+": "+e.Message)
	}
	span.End()
}

// Span kinds. A logical call is an INTERNAL span covering its attempts,
// their backoff and the client's own work; each attempt is a CLIENT span,
// the parent of the next hop's SERVER span. gRPC's OpenTelemetry tracing
// likewise makes a call span with an attempt span per attempt (gRFC A72,
// after A45); the kinds are chosen here so that span-metrics tools
// (Jaeger SPM, Tempo's metrics generator), which count CLIENT and SERVER
// spans and pair a CLIENT parent with its SERVER child for the service
// graph, count each hop of a call once, retries as the extra attempts
// they are. The metrics follow the spans: rpc_client_call_duration_seconds
// is an attempt's (the span the semconv metric shadows), and
// agentmesh_client_call_duration_seconds the logical call's.

// Client wraps a client's logical call: one INTERNAL span covering every
// attempt, and agentmesh_client_call_duration_seconds.
func (t *Telemetry) Client(next envelope.Invoker) envelope.Invoker {
	if t == nil || (!t.tracing && t.M == nil) {
		return next
	}
	return func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
		start := time.Now()
		label := t.label(req.Method)
		var span trace.Span
		if t.tracing {
			ctx, span = t.tracer.Start(ctx, label, trace.WithSpanKind(trace.SpanKindInternal))
			if span.IsRecording() { // unsampled calls skip building attributes
				span.SetAttributes(t.startAttrs(req, label)...)
			}
		}
		if t.M != nil {
			t.M.inflightClient.Inc()
		}
		res, err := next(ctx, req)
		if t.M != nil {
			t.M.inflightClient.Dec()
			observe(t.M.durOf(t.M.callDur, t.system, label, envelope.CodeOf(err)), time.Since(start), span, &t.M.exCall)
		}
		if span != nil {
			end(span, err)
		}
		return res, err
	}
}

// Attempt wraps one attempt of a call (inside the retry loop): a CLIENT
// span per attempt carrying the attempt number, whose context is injected
// into the request's headers so the next hop's server span hangs under the
// attempt that reached it, and rpc_client_call_duration_seconds. The
// seed's traceId header is the W3C trace id.
func (t *Telemetry) Attempt(next envelope.Invoker) envelope.Invoker {
	if t == nil || (!t.tracing && t.M == nil) {
		return next
	}
	return func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
		ctx, a := t.StartAttempt(ctx, req)
		res, err := next(ctx, req)
		a.End(err)
		return res, err
	}
}

// AttemptCall is an attempt StartAttempt began: End it once. Span is its
// span (nil without tracing), for the caller's attributes.
type AttemptCall struct {
	t     *Telemetry
	start time.Time
	label string
	Span  trace.Span
}

// StartAttempt is Attempt's start, for a caller that completes the
// attempt elsewhere (AttemptCall.End): the attempt's span, its context,
// and the request's headers carrying it.
func (t *Telemetry) StartAttempt(ctx context.Context, req *envelope.Request) (context.Context, AttemptCall) {
	return t.StartAttemptAt(ctx, req, time.Now())
}

// StartAttemptAt is StartAttempt at now, a clock reading the caller
// already took (one read fewer per call on the hub's forward path).
func (t *Telemetry) StartAttemptAt(ctx context.Context, req *envelope.Request, now time.Time) (context.Context, AttemptCall) {
	if t == nil || (!t.tracing && t.M == nil) {
		return ctx, AttemptCall{}
	}
	a := AttemptCall{t: t, start: now, label: t.label(req.Method)}
	if t.tracing {
		ctx, a.Span = t.tracer.Start(ctx, a.label+" attempt", trace.WithSpanKind(trace.SpanKindClient))
		if a.Span.IsRecording() {
			a.Span.SetAttributes(append(t.startAttrs(req, a.label), keyAttempt.Int(req.Headers.RetryCount))...)
			if why, ok := attemptinfo.From(ctx); ok {
				// Why this attempt is a retry, and the wait before it.
				a.Span.AddEvent("retry", trace.WithAttributes(keyRetryReason.String(why.Reason),
					keyRetryBackoff.Float64(float64(why.Backoff.Microseconds())/1000)))
			}
		}
		Propagator.Inject(ctx, &req.Headers)
		req.Headers.TraceID = a.Span.SpanContext().TraceID().String()
	}
	return ctx, a
}

// Recording reports whether the attempt's span records (attributes are
// worth building).
func (a *AttemptCall) Recording() bool { return a.Span != nil && a.Span.IsRecording() }

// End records the attempt's outcome: its duration, its span's status.
func (a *AttemptCall) End(err error) { a.EndAt(err, time.Now()) }

// EndAt is End at now, a clock reading the caller already took.
func (a *AttemptCall) EndAt(err error, now time.Time) {
	if a.t == nil {
		return
	}
	if m := a.t.M; m != nil {
		observe(m.durOf(m.clientDur, a.t.system, a.label, envelope.CodeOf(err)), now.Sub(a.start), a.Span, &m.exClient)
	}
	if a.Span != nil {
		end(a.Span, err)
	}
}

// ServerCall is a call being served, as StartServer began it: End it
// once with the outcome.
type ServerCall struct {
	t       *Telemetry
	start   time.Time
	label   string
	span    trace.Span
	control bool
}

// StartServer is Server's start, for a caller that completes the call
// elsewhere (ServerCall.End): the trace context taken from the headers,
// the SERVER span, the in-flight gauge. A control-plane call (SetControl)
// gets a span only when its caller's trace is sampled.
func (t *Telemetry) StartServer(ctx context.Context, req *envelope.Request) (context.Context, ServerCall) {
	return t.StartServerAt(ctx, req, time.Now())
}

// StartServerAt is StartServer at now, a clock reading the caller
// already took.
func (t *Telemetry) StartServerAt(ctx context.Context, req *envelope.Request, now time.Time) (context.Context, ServerCall) {
	if t == nil || (!t.tracing && t.M == nil) {
		return ctx, ServerCall{}
	}
	sc := ServerCall{t: t, start: now, label: t.label(req.Method)}
	if f := t.control.Load(); f != nil {
		sc.control = (*f)(req.Method)
	}
	if t.tracing {
		ctx = Propagator.Extract(ctx, &req.Headers)
		if !sc.control || trace.SpanContextFromContext(ctx).IsSampled() {
			ctx, sc.span = t.tracer.Start(ctx, sc.label, trace.WithSpanKind(trace.SpanKindServer))
			if sc.span.IsRecording() {
				sc.span.SetAttributes(t.startAttrs(req, sc.label)...)
				if req.Headers.TTL > 0 {
					sc.span.SetAttributes(keyTTL.Int64(req.Headers.TTL))
				}
			}
			if req.Headers.TraceID == "" {
				req.Headers.TraceID = sc.span.SpanContext().TraceID().String()
			}
		}
	}
	if t.M != nil && !sc.control {
		t.M.inflightServer.Inc()
	}
	return ctx, sc
}

// End records the call's outcome: the duration histogram (the control
// plane's for a control-plane call), the gauge, the span's status.
func (sc *ServerCall) End(err error) { sc.EndAt(err, time.Now()) }

// EndAt is End at now, a clock reading the caller already took.
func (sc *ServerCall) EndAt(err error, now time.Time) {
	if sc.t == nil {
		return
	}
	if m := sc.t.M; m != nil {
		if sc.control {
			m.controlDur.WithLabelValues(sc.label, statusCode(envelope.CodeOf(err))).Observe(now.Sub(sc.start).Seconds())
		} else {
			m.inflightServer.Dec()
			observe(m.durOf(m.serverDur, sc.t.system, sc.label, envelope.CodeOf(err)), now.Sub(sc.start), sc.span, &m.exServer)
		}
	}
	if sc.span != nil {
		end(sc.span, err)
	}
}

// observe records d on o, with the span's trace and span ids as an
// exemplar when the span is sampled and the family's exemplar slot is
// free (exemplarEvery): a latency bucket in Grafana then links to a
// trace of a call that fell in it (OpenMetrics scrape). Prometheus keeps
// one exemplar per bucket, so one every few milliseconds per family is
// as good as one per call, without a label map and a dto.Exemplar per
// call (45 more allocations per traced hop, measured).
func observe(o prometheus.Observer, d time.Duration, span trace.Span, slot *atomic.Int64) {
	if span != nil && slot != nil {
		if sc := span.SpanContext(); sc.IsSampled() {
			if eo, ok := o.(prometheus.ExemplarObserver); ok {
				now := time.Now().UnixNano()
				if last := slot.Load(); now-last >= int64(exemplarEvery) && slot.CompareAndSwap(last, now) {
					eo.ObserveWithExemplar(d.Seconds(), prometheus.Labels{"trace_id": sc.TraceID().String(), "span_id": sc.SpanID().String()})
					return
				}
			}
		}
	}
	o.Observe(d.Seconds())
}

// exemplarEvery is the least time between two exemplars of one family.
const exemplarEvery = 10 * time.Millisecond

// Server wraps the serving of a call (hub ingress, agent handler): the
// trace context is taken from the request's headers, a SERVER span covers
// the work, and the server duration histogram and in-flight gauge move.
// The span records the ttl header as received (agentmesh.ttl_ms), so that
// a trace shows how the deadline shrank hop by hop (S07 checks it).
func (t *Telemetry) Server(next envelope.Invoker) envelope.Invoker {
	if t == nil || (!t.tracing && t.M == nil) {
		return next
	}
	return func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
		ctx, sc := t.StartServer(ctx, req)
		res, err := next(ctx, req)
		sc.End(err)
		return res, err
	}
}

// Annotate adds attributes to the span in ctx, if any (the router names
// the instance an attempt went to).
func Annotate(ctx context.Context, kv ...attribute.KeyValue) {
	if s := trace.SpanFromContext(ctx); s.IsRecording() {
		s.SetAttributes(kv...)
	}
}

// AnnotateInstance adds the instance an attempt went to to the span in
// ctx, if it records: Annotate's variadic attributes cost an allocation
// per call even when no span records.
func AnnotateInstance(ctx context.Context, id string) {
	if s := trace.SpanFromContext(ctx); s.IsRecording() {
		s.SetAttributes(InstanceAttr(id))
	}
}

// Recording reports whether the span in ctx records (an attribute is
// worth computing).
func Recording(ctx context.Context) bool { return trace.SpanFromContext(ctx).IsRecording() }

// AnnotateServer names, on the span in ctx (a CLIENT attempt), the
// server it went to (semconv server.address and server.port), from its
// host:port.
func AnnotateServer(ctx context.Context, hostport string) {
	if s := trace.SpanFromContext(ctx); s.IsRecording() && hostport != "" {
		s.SetAttributes(addrAttrs(keyServerAddress, keyServerPort, hostport)...)
	}
}

// Recording reports whether the call's span records (an attribute is
// worth computing).
func (sc *ServerCall) Recording() bool { return sc.span != nil && sc.span.IsRecording() }

// SetPeer names, on the call's SERVER span, the caller's end of the
// connection (semconv network.peer.address and network.peer.port).
func (sc *ServerCall) SetPeer(hostport string) {
	if sc.span != nil && sc.span.IsRecording() && hostport != "" {
		sc.span.SetAttributes(addrAttrs(keyPeerAddress, keyPeerPort, hostport)...)
	}
}

// SetServer is AnnotateServer for an attempt begun by StartAttempt.
func (a *AttemptCall) SetServer(hostport string) {
	if a.Recording() && hostport != "" {
		a.Span.SetAttributes(addrAttrs(keyServerAddress, keyServerPort, hostport)...)
	}
}

// addrAttrs splits host:port into an address and a port attribute (the
// address alone when there is no port).
func addrAttrs(addr, port attribute.Key, hostport string) []attribute.KeyValue {
	h, p, err := net.SplitHostPort(hostport)
	if err != nil {
		return []attribute.KeyValue{addr.String(hostport)}
	}
	if n, err := strconv.Atoi(p); err == nil {
		return []attribute.KeyValue{addr.String(h), port.Int(n)}
	}
	return []attribute.KeyValue{addr.String(h)}
}

// TraceID returns the trace id of the span in ctx, or "".
func TraceID(ctx context.Context) string {
	if sc := trace.SpanContextFromContext(ctx); sc.HasTraceID() {
		return sc.TraceID().String()
	}
	return ""
}
