//go:build scenario

package scenario_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/scenario"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/reliability"
)

// TestS13BreakerFlapping is scenario S13: one of five instances alternates
// 1 s failing and 1 s healthy. Its breaker cycles at most once per
// recovery timeout, each half-open admits at most 3 probes, and callers
// of the idempotent method see >= 99.9 % success.
func TestS13BreakerFlapping(t *testing.T) {
	d := dur(16*time.Second, 120*time.Second)
	recovery := 3 * time.Second
	if d > time.Minute {
		recovery = 30 * time.Second
	}
	rate := 100.0
	var mu sync.Mutex
	state := "closed"
	opens := 0
	probes, maxProbes := 0, 0
	hook := func(k reliability.BreakerKey, from, to string) {
		if k.Instance != "flappy" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if from == "half-open" {
			maxProbes = max(maxProbes, probes)
			probes = 0
		}
		if to == "open" {
			opens++
		}
		state = to
	}
	rc := config("s13", reliability.Policy{Timeout: 5 * time.Second, Retries: 2, Idempotent: true,
		Backoff: reliability.BackoffConfig{Strategy: reliability.Fixed, Initial: time.Millisecond}}, func(rc *reliability.Config) {
		rc.CircuitBreaker = reliability.BreakerConfig{FailureThreshold: 5, RecoveryTimeout: recovery, SuccessThreshold: 3}
	})
	m := meshtest.Start(t, hub.Config{Reliability: rc}, hub.WithBreakerHook(hook))
	start := time.Now()
	var flappyCalls atomic.Int64
	for i := range 5 {
		id := fmt.Sprintf("s13-%d", i)
		if i == 4 {
			id = "flappy"
		}
		a := agents.New("s13", agents.WithID(id))
		a.Handle("s13.work", func(ctx context.Context, p json.RawMessage) (any, error) {
			if id == "flappy" {
				flappyCalls.Add(1)
				mu.Lock()
				if state == "half-open" {
					probes++
				}
				mu.Unlock()
				if int(time.Since(start)/time.Second)%2 == 0 {
					return nil, envelope.NewError(envelope.CodeUnavailable, "flapping")
				}
			}
			return p, nil
		})
		m.RunAgent(t, a)
	}
	c := m.Client(t, mesh.WithoutReliability())
	led := scenario.NewLedger()
	sent := scenario.Drive(t.Context(), rate, d, 1000, func(ctx context.Context, i int, intended time.Time) {
		led.Call(ctx, c.Invoke, "s13.work", true, i, intended)
	})
	s := led.Summarize("S13", sent)
	report(t, s)
	mu.Lock()
	defer mu.Unlock()
	limit := int(d/recovery) + 1
	t.Logf("flappy instance: %d opens (limit %d), at most %d probes in one half-open, %d calls", opens, limit, maxProbes, flappyCalls.Load())
	if opens == 0 || opens > limit {
		t.Errorf("the flapping instance's breaker opened %d times; want 1..%d", opens, limit)
	}
	if maxProbes > 3 {
		t.Errorf("a half-open breaker admitted %d probes; want <= 3", maxProbes)
	}
	if rate := float64(s.Succeeded) / float64(sent); rate < 0.999 {
		t.Errorf("success %.2f%%; want >= 99.9%%", 100*rate)
	}
}
