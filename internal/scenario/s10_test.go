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

// TestS10RetryBudget is scenario S10: during a slowdown of every instance
// the retry budget keeps attempts per request at or under 1.25, where the
// same run without a budget makes about 4.
func TestS10RetryBudget(t *testing.T) {
	rate := 300.0
	total := dur(8*time.Second, 40*time.Second)
	slowFrom, slowTo := total/4, total*5/8
	run := func(t *testing.T, budget bool) (ratio float64, s scenario.Summary, recovered float64) {
		rc := config("s10", reliability.Policy{Timeout: time.Second, PerTryTimeout: 100 * time.Millisecond, Retries: 3, Idempotent: true,
			Backoff: reliability.BackoffConfig{Strategy: reliability.Fixed, Initial: 5 * time.Millisecond}}, func(rc *reliability.Config) {
			if budget {
				rc.RetryBudget = reliability.BudgetConfig{Ratio: 0.2, MinPerSecond: 10, Window: 2 * time.Second}
			}
		})
		m := meshtest.Start(t, hub.Config{Reliability: rc})
		var slow atomic.Bool
		var mu sync.Mutex
		var execAt []time.Time
		for i := range 4 {
			a := agents.New("s10", agents.WithID(fmt.Sprintf("s10-%d", i)))
			a.Handle("s10.work", func(ctx context.Context, p json.RawMessage) (any, error) {
				mu.Lock()
				execAt = append(execAt, time.Now())
				mu.Unlock()
				d := 5 * time.Millisecond
				if slow.Load() {
					d = 150 * time.Millisecond
				}
				select {
				case <-time.After(d):
					return p, nil
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			})
			m.RunAgent(t, a)
		}
		c := m.Client(t, mesh.WithoutReliability())
		led := scenario.NewLedger()
		start := time.Now()
		go func() {
			time.Sleep(slowFrom)
			slow.Store(true)
			time.Sleep(slowTo - slowFrom)
			slow.Store(false)
		}()
		sent := scenario.Drive(t.Context(), rate, total, 2000, func(ctx context.Context, i int, intended time.Time) {
			led.Call(ctx, c.Invoke, "s10.work", true, i, intended)
		})
		// Attempts and requests while every instance was slow (the first
		// half second of the slowdown is left out: requests sent before it
		// still finish fast).
		from, to := start.Add(slowFrom+500*time.Millisecond), start.Add(slowTo)
		attempts, requests, okAfter, after := 0, 0, 0, 0
		mu.Lock()
		for _, at := range execAt {
			if at.After(from) && at.Before(to) {
				attempts++
			}
		}
		mu.Unlock()
		for _, o := range led.Outcomes() {
			if o.Intended.After(from) && o.Intended.Before(to) {
				requests++
			}
			if o.Intended.After(start.Add(slowTo + time.Second)) {
				after++
				if o.Code == envelope.CodeOK {
					okAfter++
				}
			}
		}
		s = led.Summarize(map[bool]string{true: "S10", false: "S10-control"}[budget], sent)
		report(t, s)
		if requests == 0 || after == 0 {
			t.Fatalf("no requests measured (%d during, %d after)", requests, after)
		}
		return float64(attempts) / float64(requests), s, float64(okAfter) / float64(after)
	}
	var control float64
	t.Run("control without a budget", func(t *testing.T) {
		control, _, _ = run(t, false)
		t.Logf("without a budget: %.2f attempts per request during the slowdown", control)
	})
	t.Run("with the budget", func(t *testing.T) {
		ratio, _, recovered := run(t, true)
		t.Logf("with the budget: %.2f attempts per request during the slowdown (control %.2f); success after recovery %.1f%%", ratio, control, 100*recovered)
		if ratio > 1.25 {
			t.Errorf("attempts per request during the slowdown = %.2f; want <= 1.25", ratio)
		}
		if control > 0 && control < 3 {
			t.Errorf("the control run made only %.2f attempts per request; the fault did not bite", control)
		}
		if recovered < 0.99 {
			t.Errorf("success after the slowdown ended = %.1f%%; want >= 99%%", 100*recovered)
		}
	})
}
