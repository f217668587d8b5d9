package e2e_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/internal/scenario"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/reliability"
)

// TestS01AgentCrashLoop is a short, one-hub variant of scenario S01: four
// echo agent processes, one killed with SIGKILL every 1.5 s and started
// again 0.5 s later, under an open-loop load of 200 calls/s. Pass: lost =
// 0, misdelivered = 0, idempotent success >= 99.9 %.
func TestS01AgentCrashLoop(t *testing.T) {
	cfgFile := filepath.Join(t.TempDir(), "mesh.yaml")
	if err := os.WriteFile(cfgFile, []byte(`policies:
  "echo.*": { timeout: 3s, retries: 2, idempotent: true, backoff: { strategy: exponential, initial: 10ms, max: 200ms, jitter: true } }
`), 0o600); err != nil {
		t.Fatal(err)
	}
	h := startHub(t, "--config", cfgFile)
	agents := make([]*proc, 4)
	run := func(i int) *proc {
		return start(t, "meshctl", "agent", "run", "echo", "--id", fmt.Sprintf("echo-%d", i), "--hub", h.ws)
	}
	for i := range agents {
		agents[i] = run(i)
	}
	rc := reliability.DefaultConfig()
	rc.Policies["echo.*"] = reliability.Policy{Timeout: 3 * time.Second, Retries: 2, Idempotent: true,
		Backoff: reliability.BackoffConfig{Strategy: reliability.Exponential, Initial: 10 * time.Millisecond, Max: 200 * time.Millisecond, Jitter: true}}
	c, err := mesh.NewClient([]string{h.ws}, mesh.WithReliability(rc))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	waitFor(t, "four agents", 10*time.Second, func() bool {
		var list []mesh.AgentInfo
		return c.Call(t.Context(), "mesh.agents", nil, &list) == nil && len(list) == 4
	})
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan int)
	go func() {
		kills := 0
		t := time.NewTicker(1500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				done <- kills
				return
			case <-t.C:
			}
			i := rand.IntN(len(agents))
			_ = agents[i].cmd.Process.Kill()
			kills++
			time.Sleep(500 * time.Millisecond)
			agents[i] = run(i)
		}
	}()
	led := scenario.NewLedger()
	sent := scenario.Drive(context.Background(), 200, 9*time.Second, 500, func(ctx context.Context, i int, intended time.Time) {
		led.Call(ctx, c.Invoke, "echo.echo", true, i, intended)
	})
	stop()
	kills := <-done
	s := led.Summarize("S01-short", sent)
	s.Print(os.Stdout)
	t.Logf("S01 short: %d agent kills, %d calls, %d ok, failed %v, p99 %.1f ms, max %.1f ms", kills, sent, s.Succeeded, s.Failed, s.P99Ms, s.MaxMs)
	if s.Lost != 0 || s.Misdelivered != 0 {
		t.Errorf("lost %d, misdelivered %d; want 0", s.Lost, s.Misdelivered)
	}
	if rate := float64(s.Succeeded) / float64(sent); rate < 0.999 {
		t.Errorf("idempotent success %.2f%%; want >= 99.9%%", 100*rate)
	}
}
