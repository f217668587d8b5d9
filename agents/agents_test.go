package agents_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/freeport"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}

func TestHandlerErrorsAreCoded(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	a := agents.New("errs")
	a.Handle("errs.plain", func(context.Context, json.RawMessage) (any, error) { return nil, errors.New("disk on fire") })
	a.Handle("errs.coded", func(context.Context, json.RawMessage) (any, error) {
		return nil, envelope.NewError(envelope.CodePermissionDenied, "not you")
	})
	a.Handle("errs.panic", func(context.Context, json.RawMessage) (any, error) { panic("boom") })
	a.Handle("errs.panic-error", func(context.Context, json.RawMessage) (any, error) { panic(errors.New("disk on fire")) })
	a.Handle("errs.unencodable", func(context.Context, json.RawMessage) (any, error) { return func() {}, nil })
	a.Handle("errs.wild.*", func(ctx context.Context, p json.RawMessage) (any, error) {
		return agents.RequestFrom(ctx).Method, nil
	})
	m.RunAgent(t, a)
	c := m.Client(t)
	cases := []struct {
		method string
		code   envelope.Code
		msg    string
	}{
		{"errs.plain", envelope.CodeRPCError, "disk on fire"},
		{"errs.coded", envelope.CodePermissionDenied, "not you"},
		{"errs.panic", envelope.CodeInternal, "handler for errs.panic panicked: boom"},
		{"errs.panic-error", envelope.CodeInternal, "handler for errs.panic-error panicked: disk on fire"},
		{"errs.unencodable", envelope.CodeInternal, ""},
	}
	for _, tc := range cases {
		t.Run(tc.method, func(t *testing.T) {
			err := c.Call(t.Context(), tc.method, nil, nil)
			var e *envelope.Error
			if !errors.As(err, &e) || e.Code != tc.code || (tc.msg != "" && e.Message != tc.msg) {
				t.Errorf("Call(%s) error = %v; want %s %q", tc.method, err, tc.code, tc.msg)
			}
			if e != nil && !e.IsWire() {
				t.Errorf("error from the agent is not marked as a wire error")
			}
		})
	}
	var got string
	if err := c.Call(t.Context(), "errs.wild.card", nil, &got); err != nil || got != "errs.wild.card" {
		t.Errorf("pattern handler = %q, %v; want it to see its method", got, err)
	}
	// After a panic the agent still serves.
	if err := c.Call(t.Context(), "errs.wild.x", nil, nil); err != nil {
		t.Errorf("call after a panic: %v", err)
	}
}

// TestInlineHandlersAnswerAsHandlersDo: a handler on the link's reader
// (HandleInline) gets the request, its deadline, and its errors and
// panics coded as a worker's handler's are; the agent serves on after.
func TestInlineHandlersAnswerAsHandlersDo(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	a := agents.New("inl")
	a.HandleInline("inl.plain", func(context.Context, json.RawMessage) (any, error) { return nil, errors.New("disk on fire") })
	a.HandleInline("inl.coded", func(context.Context, json.RawMessage) (any, error) {
		return nil, envelope.NewError(envelope.CodePermissionDenied, "not you")
	})
	a.HandleInline("inl.panic", func(context.Context, json.RawMessage) (any, error) { panic("boom") })
	a.HandleInline("inl.who", func(ctx context.Context, p json.RawMessage) (any, error) {
		if _, ok := ctx.Deadline(); !ok {
			return nil, errors.New("no deadline")
		}
		return agents.RequestFrom(ctx).Method + " " + string(p), nil
	})
	func() {
		defer func() {
			if recover() == nil {
				t.Error("HandleInline took a pattern")
			}
		}()
		a.HandleInline("inl.any.*", func(context.Context, json.RawMessage) (any, error) { return nil, nil })
	}()
	m.RunAgent(t, a)
	c := m.Client(t)
	for _, tc := range []struct {
		method string
		code   envelope.Code
		msg    string
	}{
		{"inl.plain", envelope.CodeRPCError, "disk on fire"},
		{"inl.coded", envelope.CodePermissionDenied, "not you"},
		{"inl.panic", envelope.CodeInternal, "handler for inl.panic panicked: boom"},
	} {
		err := c.Call(t.Context(), tc.method, nil, nil)
		if e := (*envelope.Error)(nil); !errors.As(err, &e) || e.Code != tc.code || e.Message != tc.msg {
			t.Errorf("Call(%s) error = %v; want %s %q", tc.method, err, tc.code, tc.msg)
		}
	}
	var got string
	if err := c.Call(t.Context(), "inl.who", 7, &got, mesh.CallTimeout(time.Second)); err != nil || got != "inl.who 7" {
		t.Errorf("inl.who = %q, %v", got, err)
	}
}

func TestKV(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	m.RunAgent(t, agents.NewKV())
	c := m.Client(t)
	ctx := t.Context()
	for _, kv := range []struct{ k, v string }{{"cat", `"meow"`}, {"cow", `{"says":"moo"}`}, {"dog", `1`}} {
		if err := c.Call(ctx, "memory.put", map[string]any{"key": kv.k, "value": json.RawMessage(kv.v)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	var q struct {
		Items []agents.KVItem `json:"items"`
		Count int             `json:"count"`
	}
	if err := c.Call(ctx, "memory.query", map[string]any{"prefix": "c"}, &q); err != nil || q.Count != 2 || q.Items[0].Key != "cat" || q.Items[1].Key != "cow" {
		t.Errorf("memory.query prefix c = %+v, %v; want cat, cow", q, err)
	}
	if err := c.Call(ctx, "memory.query", map[string]any{"q": "moo"}, &q); err != nil || q.Count != 1 || q.Items[0].Key != "cow" {
		t.Errorf("memory.query q=moo = %+v, %v; want cow", q, err)
	}
	var del struct{ Deleted bool }
	if err := c.Call(ctx, "memory.delete", map[string]string{"key": "cat"}, &del); err != nil || !del.Deleted {
		t.Errorf("memory.delete = %+v, %v", del, err)
	}
	var get struct {
		Found bool            `json:"found"`
		Value json.RawMessage `json:"value"`
	}
	if err := c.Call(ctx, "memory.get", map[string]string{"key": "cat"}, &get); err != nil || get.Found || string(get.Value) != "null" {
		t.Errorf("memory.get after delete = %+v, %v; want not found", get, err)
	}
	for _, bad := range []any{map[string]any{}, map[string]any{"key": 1}, []int{1}} {
		if err := c.Call(ctx, "memory.get", bad, nil); envelope.CodeOf(err) != envelope.CodeInvalidParams {
			t.Errorf("memory.get %v = %v; want INVALID_PARAMS", bad, err)
		}
	}
	if err := c.Call(ctx, "memory.put", map[string]any{"key": "x"}, nil); envelope.CodeOf(err) != envelope.CodeInvalidParams {
		t.Errorf("memory.put without value = %v; want INVALID_PARAMS", err)
	}
}

func TestChaosFaults(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	var crashed atomic.Int32
	m.RunAgent(t, agents.NewChaos(agents.ChaosConfig{FailRate: 1, FailCode: envelope.CodeOverloaded}, agents.WithID("fail")))
	m.RunAgent(t, agents.NewChaos(agents.ChaosConfig{Latency: 100 * time.Millisecond, Jitter: 10 * time.Millisecond}, agents.WithID("slow")))
	m.RunAgent(t, agents.NewChaos(agents.ChaosConfig{HangRate: 1}, agents.WithID("hang")))
	m.RunAgent(t, agents.NewChaos(agents.ChaosConfig{CrashAfter: 2, Crash: func() { crashed.Add(1) }}, agents.WithID("crash")))
	c := m.Client(t)
	ctx := t.Context()

	if err := c.Call(ctx, "chaos.echo", 1, nil, mesh.To("fail")); envelope.CodeOf(err) != envelope.CodeOverloaded {
		t.Errorf("fail-rate 1: %v; want OVERLOADED", err)
	}
	start := time.Now()
	var got int
	if err := c.Call(ctx, "chaos.echo", 7, &got, mesh.To("slow")); err != nil || got != 7 {
		t.Errorf("slow echo = %d, %v", got, err)
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Errorf("latency 100ms: answered after %v", d)
	}
	if err := c.Call(ctx, "chaos.echo", 1, nil, mesh.To("hang"), mesh.CallTimeout(200*time.Millisecond)); envelope.CodeOf(err) != envelope.CodeTimeout {
		t.Errorf("hang-rate 1: %v; want TIMEOUT", err)
	}
	for range 3 {
		_ = c.Call(ctx, "chaos.echo", 1, nil, mesh.To("crash"))
	}
	if crashed.Load() != 2 {
		t.Errorf("crash-after 2: Crash called %d times in 3 executions; want 2 (the 2nd and 3rd)", crashed.Load())
	}
	// chaos.executions counts executions per request id.
	req := &envelope.Request{ID: envelope.NewID(), Method: "chaos.echo", Params: json.RawMessage("1"), Destination: "slow"}
	for range 2 {
		if _, err := c.Invoke(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	var n struct {
		Count int `json:"count"`
	}
	if err := c.Call(ctx, "chaos.executions", map[string]string{"id": req.ID}, &n, mesh.To("slow")); err != nil || n.Count != 2 {
		t.Errorf("chaos.executions(%s) = %d, %v; want 2", req.ID, n.Count, err)
	}
}

// TestReconnectAfterHubRestart: the hub goes away and comes back on the
// same address; the agent re-registers by itself and serves again.
func TestReconnectAfterHubRestart(t *testing.T) {
	addr := freeport.Addr(t) // not ephemeral: no dialler takes it while the hub is down
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	serve := func(ln net.Listener) (*hub.Hub, func()) {
		h, err := hub.New(hub.Config{HeartbeatInterval: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = h.Serve(ctx, ln); close(done) }()
		return h, func() { cancel(); <-done }
	}
	_, stop1 := serve(ln)
	a := agents.NewEcho(agents.WithID("phoenix"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, "ws://"+addr+"/ws") }()
	defer func() { cancel(); <-done }()
	<-a.Registered()
	stop1()
	meshtest.WaitFor(t, 5*time.Second, func() bool {
		select {
		case <-a.Registered():
			return false
		default:
			return true
		}
	})
	ln2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("re-listen on %s: %v", addr, err)
	}
	h2, stop2 := serve(ln2)
	defer stop2()
	select {
	case <-a.Registered():
	case <-time.After(10 * time.Second):
		t.Fatal("agent did not re-register with the restarted hub")
	}
	if h2.Registry().Snapshot().Instance("phoenix") == nil {
		t.Fatal("the new hub does not know the agent under its id")
	}
	// Heartbeats keep it alive past three intervals.
	time.Sleep(300 * time.Millisecond)
	if h2.Registry().Snapshot().Instance("phoenix") == nil {
		t.Fatal("the agent expired although it heartbeats")
	}
	c, err := mesh.NewClient([]string{"ws://" + addr + "/ws"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var got string
	if err := c.Call(t.Context(), "echo.echo", "back", &got); err != nil || got != "back" {
		t.Errorf("call after restart = %q, %v", got, err)
	}
}

// TestShutdownDeregisters: when Run's context ends the agent deregisters
// at once (it does not wait to expire) after its calls in flight finish.
func TestShutdownDeregisters(t *testing.T) {
	m := meshtest.Start(t, hub.Config{HeartbeatInterval: time.Minute})
	a := agents.NewEcho(agents.WithID("leaver"))
	stop := m.RunAgent(t, a)
	c := m.Client(t)
	errc := make(chan error, 1)
	go func() { errc <- c.Call(t.Context(), "echo.sleep", map[string]int{"ms": 200}, nil) }()
	// The agent itself must be running the call (the hub counts it in
	// flight before it crosses the link).
	meshtest.WaitFor(t, 2*time.Second, func() bool { return a.Pending() == 1 })
	stop()
	if m.Hub.Registry().Snapshot().Instance("leaver") != nil {
		t.Error("the agent is still registered after Run returned")
	}
	if err := <-errc; err != nil {
		t.Errorf("call in flight during the agent's shutdown = %v; want it to finish", err)
	}
}

func TestRunWithoutHandlers(t *testing.T) {
	if err := agents.New("empty").Run(t.Context(), "ws://127.0.0.1:1/ws"); err == nil {
		t.Error("Run with no handlers succeeded; want an error")
	}
}
