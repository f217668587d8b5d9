//go:build scenario

package scenario_test

import (
	"context"
	"encoding/json"
	"slices"
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

// TestS14BulkheadShedding is scenario S14: slow.work offered at 3x its
// capacity sheds the excess fast with OVERLOADED, keeps its goodput, and
// echo, in another pool, is not hurt.
func TestS14BulkheadShedding(t *testing.T) {
	rc := config("slow", reliability.Policy{Timeout: 5 * time.Second}, func(rc *reliability.Config) {
		rc.Bulkhead = reliability.BulkheadConfig{MaxConcurrent: 20, QueueSize: 100, QueueTimeout: 200 * time.Millisecond}
	})
	m := meshtest.Start(t, hub.Config{Reliability: rc})
	a := agents.New("slow")
	a.Handle("slow.work", func(ctx context.Context, p json.RawMessage) (any, error) {
		select {
		case <-time.After(100 * time.Millisecond):
			return p, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	m.RunAgent(t, a)
	m.RunAgent(t, agents.NewEcho())
	c := m.Client(t, mesh.WithoutReliability())

	echoP99 := func(d time.Duration) (time.Duration, int) {
		var lat []time.Duration
		errs := 0
		for range int(d.Seconds() * 100) {
			start := time.Now()
			if err := c.Call(t.Context(), "echo.echo", 1, nil); err != nil {
				errs++
			}
			lat = append(lat, time.Since(start))
			time.Sleep(10 * time.Millisecond)
		}
		slices.Sort(lat)
		return lat[len(lat)*99/100], errs
	}
	healthy, _ := echoP99(time.Second)

	d := dur(5*time.Second, 30*time.Second)
	led := scenario.NewLedger()
	var rejections []time.Duration
	var admitted []time.Duration
	done := make(chan struct{})
	var echoLoad time.Duration
	var echoErrs int
	go func() { echoLoad, echoErrs = echoP99(d); close(done) }()
	sent := scenario.Drive(t.Context(), 600, d, 5000, func(ctx context.Context, i int, intended time.Time) {
		led.Call(ctx, c.Invoke, "slow.work", true, i, intended)
	})
	<-done
	for _, o := range led.Outcomes() {
		lat := o.End.Sub(o.Intended)
		switch o.Code {
		case envelope.CodeOK:
			admitted = append(admitted, lat)
		case envelope.CodeOverloaded:
			rejections = append(rejections, lat)
		default:
			t.Errorf("unexpected outcome %s", o.Code)
		}
	}
	s := led.Summarize("S14", sent)
	report(t, s)
	goodput := float64(len(admitted)) / d.Seconds()
	slices.Sort(admitted)
	var fast, queued []time.Duration
	for _, r := range rejections {
		if r < 100*time.Millisecond {
			fast = append(fast, r)
		} else {
			queued = append(queued, r)
		}
	}
	slices.Sort(fast)
	t.Logf("goodput %.0f/s; %d fast rejections (p99 %v), %d after queueing; admitted p99 %v; echo p99 %v under load vs %v healthy, %d errors",
		goodput, len(fast), p99(fast), len(queued), p99(admitted), echoLoad, healthy, echoErrs)
	if goodput < 180 {
		t.Errorf("goodput %.0f/s; want >= 180", goodput)
	}
	if p99(fast) > 5*time.Millisecond {
		t.Errorf("fast rejections p99 %v; want <= 5ms", p99(fast))
	}
	for _, q := range queued {
		if q < 180*time.Millisecond || q > 240*time.Millisecond {
			t.Errorf("a queued call was rejected after %v; want queueTimeout 200ms ± 20ms (+ hops)", q)
			break
		}
	}
	if p99(admitted) > 320*time.Millisecond {
		t.Errorf("admitted p99 %v; want <= 100ms + 200ms + 20ms", p99(admitted))
	}
	if echoErrs != 0 || echoLoad > 2*healthy+2*time.Millisecond {
		t.Errorf("echo under load: p99 %v (healthy %v), %d errors; want <= 2x and none", echoLoad, healthy, echoErrs)
	}
}

func p99(s []time.Duration) time.Duration {
	if len(s) == 0 {
		return 0
	}
	return s[len(s)*99/100]
}
