package envelope

import (
	"context"
	"encoding/json"
	"time"
)

// Version is the envelope protocol version this build speaks.
const Version = "1.0"

// Request is the envelope of one call, with the fields of the kOS seed's
// RequestEnvelope. Params stays raw JSON from edge to handler.
type Request struct {
	// ID identifies the logical request end to end (a UUIDv7 made by the
	// first hop that saw none); it stays the same across retries.
	ID          string
	Origin      string // the caller's identifier, e.g. "meshctl" or an agent id
	Destination string // an agent instance id to route to; empty = any instance
	Timestamp   int64  // unix milliseconds when the request was made
	Method      string
	Params      json.RawMessage
	Headers     Headers
	Version     string
	// Stream marks a streaming call: the callee sends chunks before its
	// end (the kOS seed's stream(), agentick's streaming methods). On a
	// native link it travels as the request frame's "stream" member,
	// which carries the caller's initial credit.
	Stream bool
}

// Response is the envelope of a successful answer (the kOS seed's
// ResponseEnvelope without its error member: errors travel as *Error).
type Response struct {
	ID          string
	Origin      string // the instance that answered
	Destination string
	Timestamp   int64
	Result      json.RawMessage
	Metrics     Metrics
	Headers     Headers
}

// Metrics are the performance figures a response reports.
type Metrics struct {
	LatencyMs      float64 `json:"latencyMs"`
	Retries        int     `json:"retries"`
	Backend        string  `json:"backend,omitempty"`
	QueueTime      float64 `json:"queueTime,omitempty"`
	ProcessingTime float64 `json:"processingTime,omitempty"`
}

// Priority of a request.
const (
	PriorityLow      = "low"
	PriorityNormal   = "normal"
	PriorityHigh     = "high"
	PriorityCritical = "critical"
)

// MaxTTL bounds the ttl header: a larger value is refused as INVALID_REQUEST.
const MaxTTL = 24 * time.Hour

// Headers are the request metadata of the kOS seed plus W3C trace context.
// *Headers implements the OpenTelemetry TextMapCarrier interface (Get, Set,
// Keys) for traceparent, tracestate and baggage, without importing otel.
type Headers struct {
	TraceID       string `json:"traceId,omitempty"`
	Traceparent   string `json:"traceparent,omitempty"`
	Tracestate    string `json:"tracestate,omitempty"`
	Baggage       string `json:"baggage,omitempty"`
	AuthToken     string `json:"authToken,omitempty"`
	UserID        string `json:"userId,omitempty"`
	TTL           int64  `json:"ttl,omitempty"` // milliseconds left; 0 = not set
	Priority      string `json:"priority,omitempty"`
	RetryCount    int    `json:"retryCount,omitempty"`
	CorrelationID string `json:"correlationId,omitempty"`
	// Hops counts hub-to-hub forwards; a hub does not forward a request
	// that already crossed a peer link (no loops).
	Hops int `json:"hops,omitempty"`
	// IdempotencyKey makes a call safe to replay: the hub runs the first
	// call with a key and answers later ones with the same key (from the
	// same caller, within the hub's window) with its outcome; reusing the
	// key for a different call is INVALID_PARAMS. At most 255 bytes.
	IdempotencyKey string `json:"idempotencyKey,omitempty"`
}

var carrierKeys = []string{"traceparent", "tracestate", "baggage"}

// Get returns the value of a W3C propagation key.
func (h *Headers) Get(key string) string {
	switch key {
	case "traceparent":
		return h.Traceparent
	case "tracestate":
		return h.Tracestate
	case "baggage":
		return h.Baggage
	}
	return ""
}

// Set stores the value of a W3C propagation key; other keys are ignored.
func (h *Headers) Set(key, value string) {
	switch key {
	case "traceparent":
		h.Traceparent = value
	case "tracestate":
		h.Tracestate = value
	case "baggage":
		h.Baggage = value
	}
}

// Keys lists the propagation keys the carrier knows.
func (h *Headers) Keys() []string { return carrierKeys }

// SetDeadline writes the time left until ctx's deadline into TTL (at least
// 1 ms, so that an expiring deadline is not mistaken for none). Without a
// deadline TTL is left as it is.
func (h *Headers) SetDeadline(ctx context.Context) {
	if d, ok := ctx.Deadline(); ok {
		left := time.Until(d).Milliseconds()
		if left < 1 {
			left = 1
		}
		h.TTL = left
	}
}

// WithTTL returns a context that expires when the request's ttl runs out,
// or with def when it carries none (def <= 0: no deadline is added). A
// deadline already on ctx that is earlier wins.
func (r *Request) WithTTL(ctx context.Context, def time.Duration) (context.Context, context.CancelFunc) {
	d := def
	if r.Headers.TTL > 0 {
		d = time.Duration(r.Headers.TTL) * time.Millisecond
	}
	if d <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// Invoker handles one request. On return, the response is non-nil if and
// only if the error is nil; errors are *Error values (CodeOf maps others).
type Invoker func(ctx context.Context, req *Request) (*Response, error)

// Middleware decorates an Invoker.
type Middleware func(next Invoker) Invoker

// Chain composes middlewares so that the first is outermost: Chain(a, b)(h)
// runs a, then b, then h. Build chains once, not per call.
func Chain(outer Middleware, others ...Middleware) Middleware {
	return func(next Invoker) Invoker {
		for i := len(others) - 1; i >= 0; i-- {
			next = others[i](next)
		}
		return outer(next)
	}
}
