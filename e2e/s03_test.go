package e2e_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/internal/scenario"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
	"github.com/agentmesh/agentmesh/reliability"
)

// TestS03HubKillFailover is the short variant of scenario S03: three hubs
// on etcd, two echo agents per hub and one client per hub, all given
// every hub's URL; under an open-loop load hub B is killed with SIGKILL,
// then started again on the same address. Pass: lost = 0, idempotent
// success >= 99.5 %, B's agents re-registered elsewhere within 5 s.
func TestS03HubKillFailover(t *testing.T) {
	srv := etcdtest.Start(t)
	cfgFile := filepath.Join(t.TempDir(), "mesh.yaml")
	if err := os.WriteFile(cfgFile, []byte(`policies:
  "echo.*": { timeout: 3s, retries: 3, idempotent: true, backoff: { strategy: exponential, initial: 20ms, max: 300ms, jitter: true } }
`), 0o600); err != nil {
		t.Fatal(err)
	}
	addrs := map[string]string{}
	for _, n := range []string{"A", "B", "C"} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs[n] = ln.Addr().String()
		ln.Close()
	}
	ws := func(n string) string { return "ws://" + addrs[n] + "/ws" }
	runHub := func(n string) *proc {
		p := start(t, "meshd", "--listen", addrs[n], "--id", "hub-"+n, "--heartbeat", "500ms",
			"--registry", "etcd", "--etcd-endpoints", srv.Endpoint, "--etcd-prefix", "/s03/", "--config", cfgFile)
		waitFor(t, "hub "+n+" ready", 10*time.Second, func() bool {
			return httpStatus(&http.Client{Timeout: time.Second}, "http://"+addrs[n]+"/readyz") == http.StatusOK
		})
		return p
	}
	hubs := map[string]*proc{"A": runHub("A"), "B": runHub("B"), "C": runHub("C")}
	order := map[string][]string{"A": {"A", "B", "C"}, "B": {"B", "C", "A"}, "C": {"C", "A", "B"}}
	urls := func(n string) string {
		o := order[n]
		return ws(o[0]) + "," + ws(o[1]) + "," + ws(o[2])
	}
	for _, n := range []string{"A", "B", "C"} {
		for i := range 2 {
			start(t, "meshctl", "agent", "run", "echo", "--id", fmt.Sprintf("echo-%s%d", n, i), "--hub", urls(n))
		}
	}
	rc := reliability.DefaultConfig()
	rc.Policies["echo.*"] = reliability.Policy{Timeout: 3 * time.Second, Retries: 3, Idempotent: true,
		Backoff: reliability.BackoffConfig{Strategy: reliability.Exponential, Initial: 20 * time.Millisecond, Max: 300 * time.Millisecond, Jitter: true}}
	var clients []*mesh.Client
	for _, n := range []string{"A", "B", "C"} {
		o := order[n]
		c, err := mesh.NewClient([]string{ws(o[0]), ws(o[1]), ws(o[2])}, mesh.WithReliability(rc), mesh.WithWaitForReady())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	waitFor(t, "six agents registered", 15*time.Second, func() bool {
		var list []mesh.AgentInfo
		return clients[0].Call(t.Context(), "mesh.agents", nil, &list) == nil && len(list) == 6
	})

	led := scenario.NewLedger()
	total := 12 * time.Second
	var movedAfter, killedAt atomic.Int64 // nanoseconds; shared with the load's goroutines
	go func() {
		time.Sleep(4 * time.Second)
		killedAt.Store(time.Now().UnixNano())
		_ = hubs["B"].cmd.Process.Kill()
	}()
	sent := scenario.Drive(context.Background(), 200, total, 500, func(ctx context.Context, i int, intended time.Time) {
		c := clients[i%len(clients)]
		led.Call(ctx, c.Invoke, "echo.echo", true, i, intended)
		if k := killedAt.Load(); movedAfter.Load() == 0 && k != 0 && i%50 == 0 {
			var list []mesh.AgentInfo
			if clients[0].Call(ctx, "mesh.agents", nil, &list) == nil {
				onB := 0
				for _, ag := range list {
					if ag.Hub == "hub-B" {
						onB++
					}
				}
				if len(list) == 6 && onB == 0 {
					movedAfter.CompareAndSwap(0, time.Now().UnixNano()-k)
				}
			}
		}
	})
	s := led.Summarize("S03-short", sent)
	s.Print(os.Stdout)
	moved := time.Duration(movedAfter.Load())
	t.Logf("S03 short: %d calls, %d ok, failed %v; B's agents re-registered elsewhere %v after the kill; p99 %.1f ms",
		sent, s.Succeeded, s.Failed, moved.Round(time.Millisecond), s.P99Ms)
	if s.Lost != 0 || s.Misdelivered != 0 {
		t.Errorf("lost %d, misdelivered %d; want 0", s.Lost, s.Misdelivered)
	}
	if rate := float64(s.Succeeded) / float64(sent); rate < 0.995 {
		t.Errorf("idempotent success %.2f%%; want >= 99.5%%", 100*rate)
	}
	if moved == 0 || moved > 5*time.Second {
		t.Errorf("B's agents moved to other hubs after %v; want within 5 s", moved)
	}
	// B comes back on its address and takes agents again.
	hubs["B"] = runHub("B")
	if err := clients[1].Call(t.Context(), "echo.echo", 1, nil); err != nil {
		t.Errorf("call after B returned: %v", err)
	}
}
