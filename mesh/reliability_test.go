package mesh_test

import (
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/reliability"
)

// relConfig is the seed configuration with a chaos.* policy.
func relConfig(p reliability.Policy, mod func(*reliability.Config)) *reliability.Config {
	rc := reliability.DefaultConfig()
	rc.Policies["chaos.*"] = p
	if mod != nil {
		mod(&rc)
	}
	return &rc
}

func executions(t *testing.T, c *mesh.Client, agent string) (map[string]int, int) {
	t.Helper()
	var ex struct {
		Executions map[string]int `json:"executions"`
		Total      int            `json:"total"`
	}
	if err := c.Call(t.Context(), "chaos.executions", nil, &ex, mesh.To(agent)); err != nil {
		t.Fatalf("chaos.executions on %s: %v", agent, err)
	}
	return ex.Executions, ex.Total
}

// TestFailingInstanceRoutedAround: of two instances one always fails;
// every call succeeds, the bad instance's breaker opens after the
// threshold and is probed again after the recovery timeout.
func TestFailingInstanceRoutedAround(t *testing.T) {
	rc := relConfig(reliability.Policy{Timeout: 5 * time.Second, Retries: 2, Idempotent: true}, func(rc *reliability.Config) {
		// The recovery timeout must outlast the burst of calls below even
		// on a loaded machine, or a half-open probe adds a 6th execution.
		rc.CircuitBreaker = reliability.BreakerConfig{FailureThreshold: 5, RecoveryTimeout: 2 * time.Second, SuccessThreshold: 3}
	})
	m := meshtest.Start(t, hub.Config{Reliability: rc})
	m.RunAgent(t, agents.NewChaos(agents.ChaosConfig{}, agents.WithID("good")))
	m.RunAgent(t, agents.NewChaos(agents.ChaosConfig{FailRate: 1, FailCode: envelope.CodeUnavailable}, agents.WithID("bad")))
	c := m.Client(t, mesh.WithoutReliability())
	start := time.Now()
	for i := range 300 {
		var got int
		if err := c.Call(t.Context(), "chaos.echo", i, &got); err != nil || got != i {
			t.Fatalf("call %d = %d, %v; want every call to succeed", i, got, err)
		}
	}
	_, bad := executions(t, c, "bad")
	if bad != 5 {
		t.Errorf("the failing instance executed %d calls; want exactly the threshold, 5", bad)
	}
	var brk []reliability.BreakerInfo
	if err := c.Call(t.Context(), "mesh.breakers", nil, &brk); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(brk, func(b reliability.BreakerInfo) bool { return b.Instance == "bad" })
	if i < 0 || brk[i].State != "open" {
		t.Fatalf("mesh.breakers = %+v; want bad's breaker open", brk)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("300 calls took %v, longer than the recovery timeout: the counts below would not mean anything", d)
	}
	time.Sleep(time.Until(start.Add(2100 * time.Millisecond))) // past the recovery timeout
	for i := range 20 {
		if err := c.Call(t.Context(), "chaos.echo", i, nil); err != nil {
			t.Fatalf("call after recovery: %v", err)
		}
	}
	if _, after := executions(t, c, "bad"); after-bad < 1 || after-bad > 3 {
		t.Errorf("after the recovery timeout the bad instance got %d probes; want 1 to 3", after-bad)
	}
}

// TestTimeoutIsPrompt: a call to an agent that sleeps past the timeout
// gets TIMEOUT within 10 % of it, and the handler is cancelled.
func TestTimeoutIsPrompt(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	m.RunAgent(t, agents.NewEcho())
	c := m.Client(t)
	for _, timeout := range []time.Duration{200 * time.Millisecond, time.Second} {
		start := time.Now()
		err := c.Call(t.Context(), "echo.sleep", map[string]int{"ms": 10000}, nil, mesh.CallTimeout(timeout))
		took := time.Since(start)
		if envelope.CodeOf(err) != envelope.CodeTimeout {
			t.Errorf("error = %v; want TIMEOUT", err)
		}
		if took < timeout-timeout/10 || took > timeout+timeout/10 {
			t.Errorf("TIMEOUT after %v; want within 10%% of %v", took, timeout)
		}
	}
	// The handlers were cancelled: nothing is left in flight on the agent.
	meshtest.WaitFor(t, time.Second, func() bool {
		for _, in := range m.Hub.Registry().Snapshot().Instances() {
			if in.InFlight() != 0 {
				return false
			}
		}
		return true
	})
}

// TestNonIdempotentNeverTwice: under injected failures a method that is
// not idempotent is never executed twice for one request.
func TestNonIdempotentNeverTwice(t *testing.T) {
	rc := relConfig(reliability.Policy{Timeout: 5 * time.Second, Retries: 3}, func(rc *reliability.Config) {
		rc.CircuitBreaker.FailureThreshold = 1000 // keep both instances in play
	})
	m := meshtest.Start(t, hub.Config{Reliability: rc})
	for _, id := range []string{"n1", "n2"} {
		m.RunAgent(t, agents.NewChaos(agents.ChaosConfig{FailRate: 0.5, FailCode: envelope.CodeUnavailable}, agents.WithID(id)))
	}
	c := m.Client(t, mesh.WithoutReliability())
	failed := 0
	for range 300 {
		if err := c.Call(t.Context(), "chaos.echo", 1, nil); err != nil {
			failed++
			if envelope.CodeOf(err) != envelope.CodeUnavailable {
				t.Fatalf("unexpected error %v", err)
			}
		}
	}
	total := 0
	for _, id := range []string{"n1", "n2"} {
		ex, n := executions(t, c, id)
		total += n
		for rid, k := range ex {
			if k > 1 {
				t.Errorf("request %s executed %d times on %s", rid, k, id)
			}
		}
	}
	if total != 300 {
		t.Errorf("%d executions for 300 requests; want exactly one each (no retry after a handler ran)", total)
	}
	if failed < 100 || failed > 200 {
		t.Errorf("%d of 300 failed; want about half (failures are not retried)", failed)
	}
}

// TestBulkheadCounts: 10 running + 20 queued under 200 simultaneous calls:
// exactly 30 served, 170 OVERLOADED.
func TestBulkheadCounts(t *testing.T) {
	rc := relConfig(reliability.Policy{Timeout: 10 * time.Second}, func(rc *reliability.Config) {
		rc.Bulkhead = reliability.BulkheadConfig{MaxConcurrent: 10, QueueSize: 20, QueueTimeout: 10 * time.Second}
	})
	m := meshtest.Start(t, hub.Config{Reliability: rc})
	m.RunAgent(t, agents.NewChaos(agents.ChaosConfig{Latency: 300 * time.Millisecond}))
	c := m.Client(t, mesh.WithoutReliability())
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[envelope.Code]int{}
	start := make(chan struct{})
	for range 200 {
		wg.Go(func() {
			<-start
			err := c.Call(t.Context(), "chaos.echo", 1, nil)
			mu.Lock()
			codes[envelope.CodeOf(err)]++
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	if codes[envelope.CodeOK] != 30 || codes[envelope.CodeOverloaded] != 170 {
		t.Errorf("outcomes = %v; want 30 OK and 170 OVERLOADED", codes)
	}
}

// TestRetryBudgetBoundsAttempts: with every instance failing, attempts
// stay within the retry budget.
func TestRetryBudgetBoundsAttempts(t *testing.T) {
	rc := relConfig(reliability.Policy{Timeout: 5 * time.Second, Retries: 3, Idempotent: true,
		Backoff: reliability.BackoffConfig{Strategy: reliability.Fixed}}, func(rc *reliability.Config) {
		rc.CircuitBreaker.FailureThreshold = 100000
		rc.RetryBudget = reliability.BudgetConfig{Ratio: 0.2, MinPerSecond: 0, Window: 10 * time.Second}
	})
	m := meshtest.Start(t, hub.Config{Reliability: rc})
	for _, id := range []string{"f1", "f2"} {
		m.RunAgent(t, agents.NewChaos(agents.ChaosConfig{FailRate: 1, FailCode: envelope.CodeUnavailable}, agents.WithID(id)))
	}
	c := m.Client(t, mesh.WithoutReliability())
	for range 200 {
		if err := c.Call(t.Context(), "chaos.echo", 1, nil); envelope.CodeOf(err) != envelope.CodeUnavailable {
			t.Fatalf("error = %v; want UNAVAILABLE", err)
		}
	}
	_, n1 := executions(t, c, "f1")
	_, n2 := executions(t, c, "f2")
	// Without a budget: 800 attempts. With 20 %: at most 240.
	if n1+n2 > 240 || n1+n2 < 200 {
		t.Errorf("%d attempts for 200 requests; want 200..240 under a 20%% budget", n1+n2)
	}
}

// TestHedgingCutsTail: one of two instances is slow; hedging after 10ms
// sends a second attempt elsewhere, cutting the p99.
func TestHedgingCutsTail(t *testing.T) {
	p99 := func(hedge time.Duration) time.Duration {
		pol := reliability.Policy{Timeout: 5 * time.Second, Retries: 1, Idempotent: true, HedgeAfter: hedge}
		// Half the calls hedge: far more than a retry budget allows (it
		// would rightly stop hedging), so the budget is off here.
		m := meshtest.Start(t, hub.Config{Reliability: relConfig(pol, func(rc *reliability.Config) { rc.RetryBudget.Window = 0 })})
		m.RunAgent(t, agents.NewChaos(agents.ChaosConfig{Latency: 150 * time.Millisecond}, agents.WithID("slow")))
		m.RunAgent(t, agents.NewChaos(agents.ChaosConfig{}, agents.WithID("fast")))
		c := m.Client(t, mesh.WithoutReliability())
		var lat []time.Duration
		for range 100 {
			start := time.Now()
			if err := c.Call(t.Context(), "chaos.echo", json.RawMessage(`1`), nil); err != nil {
				t.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		slices.Sort(lat)
		return lat[98]
	}
	without, with := p99(0), p99(10*time.Millisecond)
	t.Logf("p99 without hedging %v, with hedging after 10ms %v", without, with)
	if with*3 > without {
		t.Errorf("p99 with hedging %v is not well below %v without", with, without)
	}
}
