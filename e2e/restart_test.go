package e2e_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/reliability"
)

// TestHubRestartNoMethodNotFound (M9 F): meshd is killed with SIGKILL
// and started again on the same address, twice, under a steady stream of
// calls from clients (the SDK's default retries) to three methods, each
// served by an agent process of its own that reconnects by itself. No
// call to any of them may get METHOD_NOT_FOUND, which every client takes
// as final: the restarted hub answers a method no agent has registered
// yet UNAVAILABLE (retryable) for its warm-up, two heartbeat intervals.
// Failures during the outage and just after are expected and counted;
// the load ends with every method served again. Leak check (leak_test.go)
// after the load: nothing pending on the hub, the agents or the clients;
// the agents' and the test process's goroutines within bounds (the hub is
// a new process: its pending only).
func TestHubRestartNoMethodNotFound(t *testing.T) {
	const heartbeat = time.Second
	addr := freeAddrs(t, 1)[0]
	ws, base := "ws://"+addr+"/ws", "http://"+addr
	runHub := func() *proc {
		p := start(t, "meshd", "--listen", addr, "--heartbeat", heartbeat.String())
		waitFor(t, "hub ready", 10*time.Second, func() bool {
			return httpStatus(&http.Client{Timeout: time.Second}, base+"/readyz") == http.StatusOK
		})
		return p
	}
	h := runHub()
	methods := []struct {
		agent, method, params string
	}{
		{"echo", "echo.echo", `1`},
		{"kv", "memory.get", `{"key":"k"}`},
		{"chaos", "chaos.echo", `1`},
	}
	var agentLeaks []leakProc
	for _, m := range methods {
		p := start(t, "meshctl", "agent", "run", m.agent, "--id", m.agent+"-1", "--hub", ws, "--metrics-addr", "127.0.0.1:0")
		agentLeaks = append(agentLeaks, leakAgent(t, m.agent, p))
	}
	servedAll := func() bool {
		hubs, err := agentHubs(context.Background(), base)
		return err == nil && len(hubs) == len(methods)
	}
	waitFor(t, "3 agents registered", 10*time.Second, servedAll)

	// The clients' own breakers would answer for the hub after a few
	// calls lost with it: out of the way, so that every answer is the hub's.
	rc := reliability.DefaultConfig()
	rc.CircuitBreaker.FailureThreshold = 1 << 30
	const nClients = 8
	var clients []*mesh.Client
	for range nClients {
		c, err := mesh.NewClient([]string{ws}, mesh.WithReliability(rc))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	for _, c := range clients {
		for _, m := range methods {
			if err := c.Call(t.Context(), m.method, []byte(m.params), nil); err != nil {
				t.Fatalf("warm-up call %s: %v", m.method, err)
			}
		}
	}
	leaks := leakBaseline(t, agentLeaks...)

	type outcome struct {
		method string
		code   envelope.Code
		at     time.Time
		msg    string
	}
	var mu sync.Mutex
	var outcomes []outcome
	ctx, stop := context.WithCancel(t.Context())
	var load sync.WaitGroup
	for i, c := range clients {
		load.Go(func() {
			for n := i; ctx.Err() == nil; n++ {
				m := methods[n%len(methods)]
				err := c.Call(ctx, m.method, []byte(m.params), nil, mesh.CallTimeout(3*time.Second))
				if ctx.Err() != nil {
					return
				}
				o := outcome{method: m.method, code: envelope.CodeOf(err), at: time.Now()}
				if err != nil {
					o.msg = err.Error()
				}
				mu.Lock()
				outcomes = append(outcomes, o)
				mu.Unlock()
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
	var restarts []time.Time
	for range 2 {
		time.Sleep(1500 * time.Millisecond)
		_ = h.cmd.Process.Kill()
		<-h.done
		time.Sleep(time.Second)
		h = runHub()
		restarts = append(restarts, time.Now())
		waitFor(t, "3 agents registered again", 15*time.Second, servedAll)
		time.Sleep(2 * heartbeat) // past the warm-up, under load
	}
	stop()
	load.Wait()

	byCode := map[string]int{}
	notFound := 0
	for _, o := range outcomes {
		byCode[o.code.String()]++
		if o.code == envelope.CodeMethodNotFound {
			if notFound++; notFound <= 5 {
				t.Errorf("%s got METHOD_NOT_FOUND %v after the last restart before it: %s",
					o.method, o.at.Sub(lastBefore(restarts, o.at)).Round(time.Millisecond), o.msg)
			}
		}
	}
	t.Logf("%d calls over 2 hub restarts: %v", len(outcomes), byCode)
	if notFound > 0 {
		t.Errorf("%d calls got METHOD_NOT_FOUND for methods served before the restart; want 0", notFound)
	}
	if byCode["OK"] < len(outcomes)/2 {
		t.Errorf("only %d of %d calls succeeded: the load did not run", byCode["OK"], len(outcomes))
	}
	for _, m := range methods {
		if err := clients[0].Call(t.Context(), m.method, []byte(m.params), nil); err != nil {
			t.Errorf("%s after the restarts: %v", m.method, err)
		}
	}
	leaks.pendingOnly(leakHub(t, "hub", h), "a new process since the baseline")
	leaks.check(t, 2*3*time.Second, clients...)
}

func lastBefore(ts []time.Time, at time.Time) time.Time {
	last := time.Time{}
	for _, t := range ts {
		if t.Before(at) {
			last = t
		}
	}
	return last
}
