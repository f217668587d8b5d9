package hub_test

import (
	"fmt"
	"slices"
	"testing"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	oteltrace "go.opentelemetry.io/otel/trace"
)

// spanShapes lists the spans of one trace as "name/kind/status", sorted,
// and checks that its server span is a child of the caller's span parent:
// what the tests comparing a surface's trace with the native call's
// compare.
func spanShapes(t *testing.T, exp *tracetest.InMemoryExporter, trace, parent string) []string {
	t.Helper()
	var out []string
	for _, sp := range exp.GetSpans() {
		if sp.SpanContext.TraceID().String() != trace {
			continue
		}
		out = append(out, fmt.Sprintf("%s/%s/%s", sp.Name, sp.SpanKind, sp.Status.Code))
		if sp.SpanKind == oteltrace.SpanKindServer && sp.Parent.SpanID().String() != parent {
			t.Errorf("trace %s: server span's parent %s; want the caller's %s", trace, sp.Parent.SpanID(), parent)
		}
	}
	slices.Sort(out)
	return out
}
