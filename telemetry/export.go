package telemetry

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentmesh/agentmesh/envelope"
)

// ClientSpan is a client call already made, whose span is written after
// the fact: a load generator that put a trace context of its own on every
// call (traceparent with SpanID as the parent) keeps the ones worth
// looking at (the slowest: tail sampling) and exports only those. The
// hub's and agents' spans of the call hang under it: it is the trace's
// root, kind CLIENT (the one attempt whose child is the hub's SERVER span).
type ClientSpan struct {
	TraceID, SpanID string // hex, 32 and 16 digits
	Method          string
	RequestID       string
	Start, End      time.Time
	Code            envelope.Code // CodeOK on success
}

// ExportClientSpans exports spans as service cfg.ServiceName to cfg's
// OTLP receiver (cfg.Endpoint, else OTEL_EXPORTER_OTLP_*; cfg.Exporter
// replaces it), in one try. It does nothing when the SDK is disabled.
func ExportClientSpans(ctx context.Context, cfg TracingConfig, spans []ClientSpan) error {
	if len(spans) == 0 || Disabled() {
		return nil
	}
	exp := cfg.Exporter
	if exp == nil {
		endpoint := cfg.Endpoint
		if endpoint == "" {
			endpoint, _ = CLIEndpoint()
		}
		protocol := cfg.Protocol
		if protocol == "" {
			protocol = envFirst("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
		}
		var err error
		if exp, err = newExporter(ctx, endpoint, protocol, true); err != nil {
			return err
		}
	}
	defer func() { _ = exp.Shutdown(context.WithoutCancel(ctx)) }()
	res, err := newResource(ctx, cfg)
	if err != nil {
		return err
	}
	out := make([]sdktrace.ReadOnlySpan, 0, len(spans))
	for _, s := range spans {
		tid, err1 := trace.TraceIDFromHex(s.TraceID)
		sid, err2 := trace.SpanIDFromHex(s.SpanID)
		if err1 != nil || err2 != nil {
			return fmt.Errorf("telemetry: client span %q/%q: not a trace id and span id", s.TraceID, s.SpanID)
		}
		stub := tracetest.SpanStub{
			Name:        s.Method,
			SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled}),
			SpanKind:    trace.SpanKindClient,
			StartTime:   s.Start,
			EndTime:     s.End,
			Attributes:  []attribute.KeyValue{keySystem.String(System), keyMethod.String(s.Method), keyRequestID.String(s.RequestID)},
			Resource:    res,
		}
		if s.Code != envelope.CodeOK {
			sc := statusCode(s.Code)
			stub.Attributes = append(stub.Attributes, keyStatusCode.String(sc), keyErrorType.String(sc), keyCode.String(s.Code.String()))
			stub.Status = sdktrace.Status{Code: codes.Error, Description: s.Code.String()}
		}
		out = append(out, stub.Snapshot())
	}
	return exp.ExportSpans(ctx, out)
}

// NewSpanIDs returns a random trace id and span id in hex, for a call
// whose client span may be written later (ClientSpan).
func NewSpanIDs() (traceID, spanID string) {
	var b [24]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:16]), hex.EncodeToString(b[16:])
}
