package mesh_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
)

func TestCallOverWebSocketAndHTTP(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	m.RunAgent(t, agents.NewEcho())
	m.RunAgent(t, agents.NewKV())
	for name, c := range map[string]*mesh.Client{"ws": m.Client(t), "http": m.HTTPClient(t)} {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			var got map[string]any
			if err := c.Call(ctx, "echo.echo", map[string]any{"hello": "mesh", "n": 1}, &got); err != nil {
				t.Fatalf("Call(echo.echo) error: %v", err)
			}
			if got["hello"] != "mesh" || got["n"] != 1.0 {
				t.Errorf("Call(echo.echo) = %v; want the params back", got)
			}
			key := "k-" + name
			if err := c.Call(ctx, "memory.put", map[string]any{"key": key, "value": []int{1, 2}}, nil); err != nil {
				t.Fatalf("memory.put: %v", err)
			}
			var kv struct {
				Found bool            `json:"found"`
				Value json.RawMessage `json:"value"`
			}
			if err := c.Call(ctx, "memory.get", map[string]string{"key": key}, &kv); err != nil {
				t.Fatalf("memory.get: %v", err)
			}
			if !kv.Found || string(kv.Value) != "[1,2]" {
				t.Errorf("memory.get = %+v; want found [1,2]", kv)
			}
			var pong map[string]any
			if err := c.Call(ctx, "mesh.ping", nil, &pong); err != nil || pong["pong"] != true || pong["hub"] != m.Hub.ID() {
				t.Errorf("mesh.ping = %v, %v; want pong from hub %s", pong, err, m.Hub.ID())
			}
			err := c.Call(ctx, "echo.nope", nil, nil)
			if envelope.CodeOf(err) != envelope.CodeMethodNotFound {
				t.Errorf("Call(echo.nope) error = %v; want METHOD_NOT_FOUND", err)
			}
			err = c.Call(ctx, "memory.get", map[string]int{"key": 5}, nil)
			if envelope.CodeOf(err) != envelope.CodeInvalidParams {
				t.Errorf("memory.get with a numeric key: error = %v; want INVALID_PARAMS", err)
			}
		})
	}
}

func TestMeshAgentsAndMethods(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	echo := agents.NewEcho(agents.WithID("echo-1"))
	m.RunAgent(t, echo)
	c := m.Client(t)
	var list []control.AgentInfo
	if err := c.Call(t.Context(), "mesh.agents", nil, &list); err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].AgentID != "echo-1" || list[0].Name != "echo" || list[0].Status != "ready" ||
		!slices.Equal(list[0].Methods, []string{"echo.echo", "echo.sleep", "echo.stream"}) || list[0].Hub != m.Hub.ID() {
		t.Errorf("mesh.agents = %+v; want echo-1 ready serving echo.echo, echo.sleep, echo.stream", list)
	}
	var methods []control.MethodInfo
	if err := c.Call(t.Context(), "mesh.methods", nil, &methods); err != nil {
		t.Fatal(err)
	}
	want := []control.MethodInfo{{Method: "echo.echo", Agents: []string{"echo-1"}, Ready: 1}, {Method: "echo.sleep", Agents: []string{"echo-1"}, Ready: 1}, {Method: "echo.stream", Agents: []string{"echo-1"}, Ready: 1}}
	if fmt.Sprint(methods) != fmt.Sprint(want) {
		t.Errorf("mesh.methods = %+v; want %+v", methods, want)
	}
}

func TestDestinationRouting(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	a1 := agents.NewChaos(agents.ChaosConfig{}, agents.WithID("c1"))
	a2 := agents.NewChaos(agents.ChaosConfig{}, agents.WithID("c2"))
	m.RunAgent(t, a1)
	m.RunAgent(t, a2)
	c := m.Client(t)
	for range 20 {
		if err := c.Call(t.Context(), "chaos.echo", 1, nil, mesh.To("c2")); err != nil {
			t.Fatal(err)
		}
	}
	var n1, n2 struct{ Total int }
	_ = c.Call(t.Context(), "chaos.executions", nil, &n1, mesh.To("c1"))
	_ = c.Call(t.Context(), "chaos.executions", nil, &n2, mesh.To("c2"))
	if n1.Total != 0 || n2.Total != 20 {
		t.Errorf("executions c1=%d c2=%d; want 0 and 20", n1.Total, n2.Total)
	}
	if err := c.Call(t.Context(), "chaos.echo", 1, nil, mesh.To("nobody")); envelope.CodeOf(err) != envelope.CodeAgentNotFound {
		t.Errorf("call to unknown destination: %v; want AGENT_NOT_FOUND", err)
	}
	if err := c.Call(t.Context(), "echo.echo", 1, nil, mesh.To("c1")); envelope.CodeOf(err) != envelope.CodeMethodNotFound {
		t.Errorf("call to a destination that does not serve the method: %v; want METHOD_NOT_FOUND", err)
	}
}

// TestConcurrentCallsMatch: 64 goroutines × 1,000 calls through one hub to
// two echo agents; every response must be its own request's.
func TestConcurrentCallsMatch(t *testing.T) {
	workers, calls := 64, 1000
	if testing.Short() {
		calls = 100
	}
	m := meshtest.Start(t, hub.Config{})
	m.RunAgent(t, agents.NewEcho())
	m.RunAgent(t, agents.NewEcho())
	c := m.Client(t)
	var wg sync.WaitGroup
	var bad, failed atomic.Int64
	for w := range workers {
		wg.Go(func() {
			for i := range calls {
				want := fmt.Sprintf(`{"w":%d,"i":%d,"pad":"%s"}`, w, i, strings.Repeat("x", i%64))
				var got json.RawMessage
				if err := c.Call(t.Context(), "echo.echo", json.RawMessage(want), &got); err != nil {
					if failed.Add(1) < 5 {
						t.Errorf("worker %d call %d: %v", w, i, err)
					}
					continue
				}
				if string(got) != want {
					if bad.Add(1) < 5 {
						t.Errorf("worker %d call %d = %s; want %s", w, i, got, want)
					}
				}
			}
		})
	}
	wg.Wait()
	if bad.Load() != 0 || failed.Load() != 0 {
		t.Fatalf("%d mismatched and %d failed responses out of %d", bad.Load(), failed.Load(), workers*calls)
	}
	// Both agents took part.
	var list []control.AgentInfo
	if err := c.Call(t.Context(), "mesh.agents", nil, &list); err != nil || len(list) != 2 {
		t.Fatalf("mesh.agents = %v, %v", list, err)
	}
}

// TestAgentLossFailsPendingAtOnce: a call in flight on an agent whose link
// drops fails with UNAVAILABLE at once, not at its timeout; the agent
// leaves the registry.
func TestAgentLossFailsPendingAtOnce(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	started := make(chan struct{}, 1)
	// A hand-made agent: it registers and never answers, so that we can
	// drop its link while a call is pending.
	l, err := link.Dial(t.Context(), m.WS, link.Config{}, link.WithHandler(
		func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
			started <- struct{}{}
			<-ctx.Done()
			return nil, ctx.Err()
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	reg, _ := json.Marshal(control.RegisterParams{AgentID: "hang-1", Capabilities: []string{"hang.*"}})
	if _, err := l.Call(t.Context(), &envelope.Request{Method: "agent.register", Params: reg}); err != nil {
		t.Fatal(err)
	}
	c := m.Client(t)
	errc := make(chan error, 1)
	go func() { errc <- c.Call(t.Context(), "hang.forever", nil, nil, mesh.CallTimeout(10*time.Second)) }()
	<-started
	killed := time.Now()
	l.Close()
	err = <-errc
	if took := time.Since(killed); took > time.Second {
		t.Errorf("pending call answered %v after the link dropped; want well under 1s", took)
	}
	if envelope.CodeOf(err) != envelope.CodeUnavailable {
		t.Errorf("pending call error = %v; want UNAVAILABLE", err)
	}
	meshtest.WaitFor(t, 2*time.Second, func() bool { return m.Hub.Registry().Snapshot().Instance("hang-1") == nil })
	// The method was served a moment ago: UNAVAILABLE, not METHOD_NOT_FOUND.
	if err := c.Call(t.Context(), "hang.forever", nil, nil); envelope.CodeOf(err) != envelope.CodeUnavailable {
		t.Errorf("call after the agent left = %v; want UNAVAILABLE", err)
	}
}

// TestExpiredAgentLosesLink: an agent that stops heartbeating expires
// after three intervals; its pending calls fail with UNAVAILABLE then.
func TestExpiredAgentLosesLink(t *testing.T) {
	m := meshtest.Start(t, hub.Config{HeartbeatInterval: 100 * time.Millisecond})
	l, err := link.Dial(t.Context(), m.WS, link.Config{}, link.WithHandler(
		func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	reg, _ := json.Marshal(control.RegisterParams{AgentID: "mute-1", Capabilities: []string{"mute.call"}})
	if _, err := l.Call(t.Context(), &envelope.Request{Method: "agent.register", Params: reg}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = m.Client(t).Call(t.Context(), "mute.call", nil, nil, mesh.CallTimeout(10*time.Second))
	took := time.Since(start)
	if envelope.CodeOf(err) != envelope.CodeUnavailable {
		t.Errorf("call to a silent agent = %v; want UNAVAILABLE when it expires", err)
	}
	if took < 300*time.Millisecond || took > 3*time.Second {
		t.Errorf("answered after %v; want about 3 heartbeat intervals (300ms), far before the 10s timeout", took)
	}
	select {
	case <-l.Done():
	case <-time.After(2 * time.Second):
		t.Error("the hub did not close the expired agent's link")
	}
}

// TestDeadlineAndCancelPropagate: the agent's handler context carries the
// caller's deadline, and is cancelled when the caller gives up.
func TestDeadlineAndCancelPropagate(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	type seen struct {
		left time.Duration
		err  error
	}
	got := make(chan seen, 1)
	a := agents.New("probe")
	a.Handle("probe.wait", func(ctx context.Context, _ json.RawMessage) (any, error) {
		d, _ := ctx.Deadline()
		left := time.Until(d)
		<-ctx.Done()
		got <- seen{left, ctx.Err()}
		return nil, ctx.Err()
	})
	m.RunAgent(t, a)
	c := m.Client(t)

	err := c.Call(t.Context(), "probe.wait", nil, nil, mesh.CallTimeout(400*time.Millisecond))
	if envelope.CodeOf(err) != envelope.CodeTimeout {
		t.Errorf("error = %v; want TIMEOUT", err)
	}
	s := <-got
	if s.left > 400*time.Millisecond || s.left < 200*time.Millisecond {
		t.Errorf("handler saw %v left; want a little under the caller's 400ms", s.left)
	}

	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- c.Call(ctx, "probe.wait", nil, nil, mesh.CallTimeout(10*time.Second)) }()
	time.Sleep(50 * time.Millisecond)
	cancel()
	if err := <-errc; envelope.CodeOf(err) != envelope.CodeCancelled {
		t.Errorf("cancelled call error = %v; want CANCELLED", err)
	}
	select {
	case s := <-got:
		if !errors.Is(s.err, context.Canceled) {
			t.Errorf("handler context ended with %v; want Canceled", s.err)
		}
	case <-time.After(2 * time.Second):
		t.Error("the handler was not cancelled when the caller gave up")
	}
}

// TestNoResponders (S22): a method nobody serves fails with
// METHOD_NOT_FOUND at once; one whose last instance just left fails with
// UNAVAILABLE at once. Never at the timeout.
func TestNoResponders(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	stop := m.RunAgent(t, agents.NewEcho())
	c := m.Client(t)
	stop() // deregisters: echo.* was served a moment ago
	cases := []struct {
		method string
		want   envelope.Code
	}{
		{"nobody.serves", envelope.CodeMethodNotFound},
		{"echo.echo", envelope.CodeUnavailable},
	}
	for _, tc := range cases {
		t.Run(tc.method, func(t *testing.T) {
			lat := make([]time.Duration, 0, 1000)
			for range 1000 {
				start := time.Now()
				err := c.Call(t.Context(), tc.method, nil, nil, mesh.CallTimeout(5*time.Second))
				lat = append(lat, time.Since(start))
				if envelope.CodeOf(err) != tc.want {
					t.Fatalf("Call(%s) error = %v; want %s", tc.method, err, tc.want)
				}
			}
			slices.Sort(lat)
			p99, max := lat[len(lat)*99/100], lat[len(lat)-1]
			t.Logf("%s: p50 %v p99 %v max %v (S22 asks p99 <= 5ms)", tc.method, lat[len(lat)/2], p99, max)
			if max > time.Second {
				t.Errorf("slowest answer took %v; a no-responder call must fail at once, never near the 5s timeout", max)
			}
		})
	}
}

// TestDrain: Shutdown lets calls in flight finish, refuses new ones with
// UNAVAILABLE and turns /readyz to 503.
func TestDrain(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	m.RunAgent(t, agents.NewEcho())
	c := m.Client(t)
	errc := make(chan error, 1)
	go func() { errc <- c.Call(t.Context(), "echo.sleep", map[string]int{"ms": 300}, nil) }()
	meshtest.WaitFor(t, 2*time.Second, func() bool {
		var list []control.AgentInfo
		_ = c.Call(t.Context(), "mesh.agents", nil, &list)
		return len(list) == 1 && list[0].InFlight == 1
	})
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		shut <- m.Hub.Shutdown(ctx)
	}()
	meshtest.WaitFor(t, 2*time.Second, func() bool {
		res, err := http.Get(m.HTTP + "/readyz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusServiceUnavailable
	})
	if err := c.Call(t.Context(), "echo.echo", 1, nil); envelope.CodeOf(err) != envelope.CodeUnavailable {
		t.Errorf("call during drain = %v; want UNAVAILABLE", err)
	}
	if err := <-errc; err != nil {
		t.Errorf("call in flight during drain = %v; want it to finish", err)
	}
	if err := <-shut; err != nil {
		t.Errorf("Shutdown = %v", err)
	}
}
