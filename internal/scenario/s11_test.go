//go:build scenario

package scenario_test

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/reliability"
)

// TestS11BreakerExactCounts is scenario S11 against a real agent (the
// state machine itself is also pinned under synctest in package
// reliability): five failures open the client's per-method breaker, the
// sixth call is refused without reaching the agent; after the recovery
// timeout three probes close it.
func TestS11BreakerExactCounts(t *testing.T) {
	rc := reliability.DefaultConfig()
	rc.Policies["s11.*"] = reliability.Policy{Timeout: 5 * time.Second} // no retries: counts stay exact
	rc.CircuitBreaker = reliability.BreakerConfig{FailureThreshold: 5, RecoveryTimeout: 500 * time.Millisecond, SuccessThreshold: 3}
	hubRC := rc
	hubRC.CircuitBreaker.FailureThreshold = 1 << 30 // only the client's breaker in play
	m := meshtest.Start(t, hub.Config{Reliability: &hubRC})
	var calls atomic.Int32
	var failing atomic.Bool
	failing.Store(true)
	a := agents.New("s11")
	a.Handle("s11.work", func(ctx context.Context, _ json.RawMessage) (any, error) {
		calls.Add(1)
		if failing.Load() {
			return nil, envelope.NewError(envelope.CodeUnavailable, "down")
		}
		return "ok", nil
	})
	m.RunAgent(t, a)
	c := m.Client(t, mesh.WithReliability(rc))
	call := func() envelope.Code { return envelope.CodeOf(c.Call(t.Context(), "s11.work", nil, nil)) }
	for i := range 5 {
		if got := call(); got != envelope.CodeUnavailable {
			t.Fatalf("call %d = %s; want UNAVAILABLE", i+1, got)
		}
	}
	if got := call(); got != envelope.CodeCircuitOpen || calls.Load() != 5 {
		t.Fatalf("6th call = %s with %d agent calls; want CIRCUIT_OPEN and the agent still at 5", got, calls.Load())
	}
	time.Sleep(600 * time.Millisecond)
	// Half-open: one failing probe opens it again at once.
	if got := call(); got != envelope.CodeUnavailable || calls.Load() != 6 {
		t.Fatalf("probe = %s (agent calls %d); want the probe to reach the agent", got, calls.Load())
	}
	if got := call(); got != envelope.CodeCircuitOpen || calls.Load() != 6 {
		t.Fatalf("after a failed probe = %s (agent calls %d); want CIRCUIT_OPEN again", got, calls.Load())
	}
	time.Sleep(600 * time.Millisecond)
	failing.Store(false)
	for i := range 3 {
		if got := call(); got != envelope.CodeOK {
			t.Fatalf("probe %d = %s; want OK", i+1, got)
		}
	}
	if st := c.Breakers().List()[0].State; st != "closed" {
		t.Errorf("after 3 good probes the breaker is %s; want closed", st)
	}
	// Caller errors neither trip nor heal it.
	failing.Store(true)
	for range 4 {
		call()
	}
	for range 10 {
		_ = c.Call(t.Context(), "s11.work", nil, nil, mesh.WithHeaders(func(h *envelope.Headers) {}), mesh.CallTimeout(time.Nanosecond))
	}
	if st := c.Breakers().List()[0].State; st != "closed" {
		t.Errorf("4 failures and 10 of the caller's own timeouts opened the breaker (%s)", st)
	}
}
