package telemetry

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentmesh/agentmesh/envelope"
)

// Telemetry instruments one process's calls: spans (when tracing is on)
// and metrics (when Metrics is set). The zero value and a nil *Telemetry
// do nothing. Safe for concurrent use.
type Telemetry struct {
	tracer  trace.Tracer
	tracing bool
	M       *Metrics
	system  string
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

// Client wraps a client's logical call: one CLIENT span covering every
// attempt, and the client duration histogram.
func (t *Telemetry) Client(next envelope.Invoker) envelope.Invoker {
	if t == nil || (!t.tracing && t.M == nil) {
		return next
	}
	return func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
		start := time.Now()
		label := t.label(req.Method)
		var span trace.Span
		if t.tracing {
			ctx, span = t.tracer.Start(ctx, label, trace.WithSpanKind(trace.SpanKindClient))
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
			t.M.clientDur.WithLabelValues(t.system, label, statusCode(envelope.CodeOf(err))).Observe(time.Since(start).Seconds())
		}
		if span != nil {
			end(span, err)
		}
		return res, err
	}
}

// Attempt wraps one attempt of a call (inside the retry loop): a child
// span per attempt carrying the attempt number, whose context is injected
// into the request's headers so the next hop's server span hangs under the
// attempt that reached it. The seed's traceId header is the W3C trace id.
func (t *Telemetry) Attempt(next envelope.Invoker) envelope.Invoker {
	if t == nil || !t.tracing {
		return next
	}
	return func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
		ctx, span := t.StartAttempt(ctx, req)
		res, err := next(ctx, req)
		end(span, err)
		return res, err
	}
}

// StartAttempt is Attempt's start, for a caller that completes the
// attempt elsewhere (EndAttempt): the attempt's span, its context, and
// the request's headers carrying it. Without tracing it returns ctx and
// a nil span.
func (t *Telemetry) StartAttempt(ctx context.Context, req *envelope.Request) (context.Context, trace.Span) {
	if t == nil || !t.tracing {
		return ctx, nil
	}
	label := t.label(req.Method)
	ctx, span := t.tracer.Start(ctx, label+" attempt", trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		span.SetAttributes(append(t.startAttrs(req, label), keyAttempt.Int(req.Headers.RetryCount))...)
	}
	Propagator.Inject(ctx, &req.Headers)
	req.Headers.TraceID = span.SpanContext().TraceID().String()
	return ctx, span
}

// EndAttempt ends an attempt StartAttempt began (span may be nil).
func EndAttempt(span trace.Span, err error) {
	if span != nil {
		end(span, err)
	}
}

// ServerCall is a call being served, as StartServer began it: End it
// once with the outcome.
type ServerCall struct {
	t     *Telemetry
	start time.Time
	label string
	span  trace.Span
}

// StartServer is Server's start, for a caller that completes the call
// elsewhere (ServerCall.End): the trace context taken from the headers,
// the SERVER span, the in-flight gauge.
func (t *Telemetry) StartServer(ctx context.Context, req *envelope.Request) (context.Context, ServerCall) {
	if t == nil || (!t.tracing && t.M == nil) {
		return ctx, ServerCall{}
	}
	sc := ServerCall{t: t, start: time.Now(), label: t.label(req.Method)}
	if t.tracing {
		ctx = Propagator.Extract(ctx, &req.Headers)
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
	if t.M != nil {
		t.M.inflightServer.Inc()
	}
	return ctx, sc
}

// End records the call's outcome: the duration histogram, the gauge, the
// span's status.
func (sc *ServerCall) End(err error) {
	if sc.t == nil {
		return
	}
	if m := sc.t.M; m != nil {
		m.inflightServer.Dec()
		m.serverDur.WithLabelValues(sc.t.system, sc.label, statusCode(envelope.CodeOf(err))).Observe(time.Since(sc.start).Seconds())
	}
	if sc.span != nil {
		end(sc.span, err)
	}
}

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

// TraceID returns the trace id of the span in ctx, or "".
func TraceID(ctx context.Context) string {
	if sc := trace.SpanContextFromContext(ctx); sc.HasTraceID() {
		return sc.TraceID().String()
	}
	return ""
}
