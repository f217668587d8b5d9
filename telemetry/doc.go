// Package telemetry owns observability: the JSON logger now; the tracer
// provider, trace propagation through envelope headers and the Prometheus
// collectors come with their issue. With nothing configured it costs
// almost nothing.
package telemetry
