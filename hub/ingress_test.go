package hub_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/telemetry"
)

// The stages every call passes through the hub, outermost first: a call
// refused by one of them has been seen by every stage before it.
func ExampleHub_IngressOrder() {
	h, err := hub.New(hub.Config{})
	if err != nil {
		panic(err)
	}
	defer h.Shutdown(context.Background())
	fmt.Println(strings.Join(h.IngressOrder(), " → "))
	// Output: identify → telemetry → log → watch → drain → authenticate → limit → deadline → idempotency → dispatch
}

// TestRefusedCallTraced: a call the hub refuses at the ingress (here the
// role table: a reader calling a method for admins) still gets its server
// span, ended with an error status, and its rpc.server.call.duration
// observation under the refusal's code, as a served call does. (A
// built-in is the control plane's: untraced unless its caller traces.)
func TestRefusedCallTraced(t *testing.T) {
	exp, p := testkit.Tracing(t, "hub")
	metrics := telemetry.NewMetrics(nil)
	sec := hub.Security{Key: testkit.TestKey, Roles: map[string][]string{"billing.charge": {"admin"}}}
	m := meshtest.Start(t, hub.Config{Security: &sec}, hub.WithTelemetry(telemetry.New(p, metrics)))
	tok := testkit.Token(t, auth.Claims{Subject: "reader", Roles: []string{"reader"}}, time.Hour)
	c := testkit.MustClient(t, m.WS, mesh.WithToken(tok), mesh.WithoutReliability())
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	err := c.Call(ctx, "billing.charge", nil, nil)
	testkit.WantCode(t, "a reader calling billing.charge", err, envelope.CodePermissionDenied)
	if n := testkit.HistCount(t, metrics, "rpc_server_call_duration_seconds",
		map[string]string{"rpc_method": "billing.charge", "rpc_response_status_code": strconv.Itoa(envelope.CodePermissionDenied.JSONRPC())}); n != 1 {
		t.Errorf("rpc_server_call_duration_seconds{billing.charge, PERMISSION_DENIED} counted %d; want 1", n)
	}
	if err := p.ForceFlush(t.Context()); err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, sp := range exp.GetSpans() {
		if sp.Name == "billing.charge" && sp.SpanKind.String() == "server" {
			found = true
			if sp.Status.Code != codes.Error {
				t.Errorf("the refused call's server span ended %v; want Error", sp.Status.Code)
			}
		}
	}
	if !found {
		t.Errorf("no server span for the refused call; spans: %d", len(exp.GetSpans()))
	}
}
