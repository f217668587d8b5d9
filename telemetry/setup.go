package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// TracingConfig says where spans go. Every field has a standard OTEL_*
// variable that fills it when empty; flags override them.
type TracingConfig struct {
	ServiceName string // OTEL_SERVICE_NAME; else the program's default
	InstanceID  string // service.instance.id
	Version     string // service.version
	// Endpoint of the OTLP receiver (OTEL_EXPORTER_OTLP[_TRACES]_ENDPOINT),
	// e.g. http://127.0.0.1:4318. Empty with no variable set: tracing off.
	Endpoint string
	// Protocol: http/protobuf (default) or grpc (OTEL_EXPORTER_OTLP[_TRACES]_PROTOCOL).
	Protocol string
	// SampleRatio, when in (0, 1], samples that share of new traces
	// (parent-based); 0 leaves it to OTEL_TRACES_SAMPLER (default: always).
	SampleRatio float64
	// Force builds a recording provider even with no endpoint (spans are
	// made, not exported): for printing a trace id, and for tests.
	Force bool
	// Exporter, when set, replaces the OTLP exporter (tests).
	Exporter sdktrace.SpanExporter
	// Interactive exports as a command-line tool must: one try within 3 s
	// (the OTLP exporter's default retries for a minute, and a CLI waits
	// for its spans before it exits).
	Interactive bool
}

// Disabled reports whether OTEL_SDK_DISABLED turns the SDK off.
func Disabled() bool { return strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") }

// DefaultEndpoint is the OTLP receiver the OpenTelemetry SDKs export to
// when no endpoint is configured (OTLP/HTTP's, or OTLP/gRPC's with
// protocol "grpc").
func DefaultEndpoint(protocol string) string {
	if protocol == "grpc" {
		return "http://localhost:4317"
	}
	return "http://localhost:4318"
}

// CLIEndpoint is where a command-line tool exports the spans it was asked
// for (meshctl call --trace, meshctl bench): the configured endpoint
// (OTEL_EXPORTER_OTLP[_TRACES]_ENDPOINT), else the SDKs' default; isDefault
// says it is the default, so that the tool can say where its spans went.
func CLIEndpoint() (endpoint string, isDefault bool) {
	if e := envFirst("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"); e != "" {
		return e, false
	}
	return DefaultEndpoint(envFirst("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")), true
}

// Provider is a configured tracer provider; Shutdown flushes it.
type Provider struct {
	trace.TracerProvider
	Enabled  bool
	Endpoint string
	shutdown func(context.Context) error
	flush    func(context.Context) error
}

// ForceFlush exports every finished span now.
func (p *Provider) ForceFlush(ctx context.Context) error {
	if p.flush == nil {
		return nil
	}
	return p.flush(ctx)
}

// Shutdown flushes buffered spans and stops the exporter.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p.shutdown == nil {
		return nil
	}
	return p.shutdown(ctx)
}

func envFirst(keys ...string) string {
	for _, k := range keys {
		if v := os.Getenv(k); v != "" {
			return v
		}
	}
	return ""
}

// NewProvider builds the tracer provider. With nothing configured, or with
// OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none (which the Go SDK
// does not read itself), it returns a no-op provider that costs almost
// nothing. It does no I/O: the exporter connects on first export.
func NewProvider(ctx context.Context, cfg TracingConfig, log *slog.Logger) (*Provider, error) {
	off := &Provider{TracerProvider: noop.NewTracerProvider()}
	if Disabled() {
		return off, nil
	}
	endpoint := cfg.Endpoint
	if endpoint == "" {
		endpoint = envFirst("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	exporterKind := strings.ToLower(os.Getenv("OTEL_TRACES_EXPORTER"))
	if exporterKind == "none" || (endpoint == "" && cfg.Exporter == nil && exporterKind != "otlp" && !cfg.Force) {
		return off, nil
	}
	protocol := cfg.Protocol
	if protocol == "" {
		protocol = envFirst("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	exp := cfg.Exporter
	if exp == nil && (endpoint != "" || exporterKind == "otlp") {
		var err error
		if exp, err = newExporter(ctx, endpoint, protocol, cfg.Interactive); err != nil {
			return nil, err
		}
	}
	res, err := newResource(ctx, cfg)
	if err != nil {
		return nil, err
	}
	name := serviceName(cfg)
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if cfg.SampleRatio > 0 && cfg.SampleRatio <= 1 {
		opts = append(opts, sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(cfg.SampleRatio))))
	}
	if exp != nil {
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	if log != nil && exp != nil {
		log.Info("tracing on", "otlp_endpoint", endpoint, "protocol", orDefault(protocol, "http/protobuf"), "service", name)
	}
	return &Provider{TracerProvider: tp, Enabled: true, Endpoint: endpoint, shutdown: tp.Shutdown, flush: tp.ForceFlush}, nil
}

// newExporter makes the OTLP exporter of endpoint ("" with
// OTEL_TRACES_EXPORTER=otlp: the SDK's own default) and protocol.
func newExporter(ctx context.Context, endpoint, protocol string, interactive bool) (sdktrace.SpanExporter, error) {
	var exp sdktrace.SpanExporter
	var err error
	switch protocol {
	case "grpc":
		var opts []otlptracegrpc.Option
		if endpoint != "" {
			opts = append(opts, otlptracegrpc.WithEndpointURL(endpoint))
		}
		if interactive {
			opts = append(opts, otlptracegrpc.WithTimeout(3*time.Second), otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{Enabled: false}))
		}
		exp, err = otlptracegrpc.New(ctx, opts...)
	case "", "http/protobuf":
		var opts []otlptracehttp.Option
		if endpoint != "" {
			u := endpoint
			if !strings.Contains(strings.TrimPrefix(strings.TrimPrefix(u, "http://"), "https://"), "/") {
				u = strings.TrimSuffix(u, "/") + "/v1/traces"
			}
			if !strings.Contains(u, "://") {
				return nil, fmt.Errorf("telemetry: OTLP endpoint %q needs a scheme (http:// or https://)", endpoint)
			}
			opts = append(opts, otlptracehttp.WithEndpointURL(u))
		}
		if interactive {
			opts = append(opts, otlptracehttp.WithTimeout(3*time.Second), otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: false}))
		}
		exp, err = otlptracehttp.New(ctx, opts...)
	default:
		return nil, fmt.Errorf("telemetry: OTLP protocol %q is not http/protobuf or grpc", protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry: OTLP exporter: %w", err)
	}
	return exp, nil
}

// newResource describes the process: cfg's service name (or
// OTEL_SERVICE_NAME), instance and version, OTEL_RESOURCE_ATTRIBUTES.
func newResource(ctx context.Context, cfg TracingConfig) (*resource.Resource, error) {
	attrs := []resource.Option{resource.WithFromEnv(), resource.WithTelemetrySDK(),
		resource.WithAttributes(semconv.ServiceName(serviceName(cfg)))}
	if cfg.InstanceID != "" {
		attrs = append(attrs, resource.WithAttributes(semconv.ServiceInstanceID(cfg.InstanceID)))
	}
	if cfg.Version != "" {
		attrs = append(attrs, resource.WithAttributes(semconv.ServiceVersion(cfg.Version)))
	}
	res, err := resource.New(ctx, attrs...)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	return res, nil
}

// serviceName is cfg's, or OTEL_SERVICE_NAME's when set.
func serviceName(cfg TracingConfig) string {
	if v := os.Getenv("OTEL_SERVICE_NAME"); v != "" {
		return v
	}
	return cfg.ServiceName
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// Propagator is W3C trace context plus baggage, the default of
// OTEL_PROPAGATORS.
var Propagator propagation.TextMapPropagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
