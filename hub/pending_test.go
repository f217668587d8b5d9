package hub_test

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
)

// gate is an agent whose gate.wait calls block until release, counting
// those that started; gate.echo answers at once.
type gate struct {
	started atomic.Int64
	mu      sync.Mutex
	open    chan struct{}
}

func newGate() *gate { return &gate{open: make(chan struct{})} }

func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	close(g.open)
	g.open = make(chan struct{})
}

func (g *gate) agent() *agents.Agent {
	a := agents.New("gate")
	a.Handle("gate.wait", func(ctx context.Context, p json.RawMessage) (any, error) {
		g.mu.Lock()
		open := g.open
		g.mu.Unlock()
		g.started.Add(1)
		select {
		case <-open:
			return "released", nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	})
	a.Handle("gate.echo", func(ctx context.Context, p json.RawMessage) (any, error) { return p, nil })
	return a
}

// TestPendingCallsBoundPerConnection: a connection may have a bounded
// number of calls in flight (10,000 by default, 8 here). On a native link
// and on a plain JSON-RPC WebSocket, the calls past the bound are refused
// at once with OVERLOADED, each answered under its own id (a batch that
// would cross the bound gets one refusal per call, as JSON-RPC 2.0 wants
// an array for a batch), and never reach the agent; other connections
// are unaffected; once the admitted calls end, the connection has its
// whole bound again (the count leaks neither way) and the hub's
// goroutines go back to where they were.
func TestPendingCallsBoundPerConnection(t *testing.T) {
	const bound, push = 8, 20
	m := meshtest.Start(t, hub.Config{}, hub.WithMaxPending(bound))
	g := newGate()
	m.RunAgent(t, g.agent())
	other := m.Client(t, mesh.WithoutReliability())
	httpc := m.HTTPClient(t, mesh.WithoutReliability())
	for _, c := range []*mesh.Client{other, httpc} {
		if err := c.Call(t.Context(), "gate.echo", []int{1}, nil); err != nil {
			t.Fatal(err)
		}
	}
	g0 := runtime.NumGoroutine()

	// waitStarted waits for the agent to hold n calls in all.
	waitStarted := func(t *testing.T, n int64) {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); g.started.Load() < n && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(100 * time.Millisecond) // room for any call over the bound to (wrongly) arrive
		if got := g.started.Load(); got != n {
			t.Fatalf("the agent holds %d calls; want %d", got, n)
		}
	}
	othersUnaffected := func(t *testing.T, what string) {
		t.Helper()
		if err := other.Call(t.Context(), "gate.echo", []int{2}, nil); err != nil {
			t.Errorf("%s: another connection's call: %v", what, err)
		}
		var res map[string]any
		if err := httpc.Call(t.Context(), "gate.echo", map[string]int{"x": 3}, &res); err != nil {
			t.Errorf("%s: a /rpc call: %v", what, err)
		}
	}

	t.Run("native link", func(t *testing.T) {
		l, err := link.Dial(t.Context(), m.WS, link.Config{})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		call := func(method string) error {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			_, err := l.Call(ctx, &envelope.Request{ID: envelope.NewID(), Method: method, Params: json.RawMessage(`{}`)})
			return err
		}
		base := g.started.Load()
		for round := range 2 { // the second round finds the whole bound free again
			errs := make(chan error, push)
			var wg sync.WaitGroup
			for range push {
				wg.Go(func() { errs <- call("gate.wait") })
			}
			// The calls past the bound are answered while the others wait.
			var refused []error
			deadline := time.After(15 * time.Second)
			for len(refused) < push-bound {
				select {
				case err := <-errs:
					refused = append(refused, err)
				case <-deadline:
					t.Fatalf("round %d: %d calls answered while %d wait; want %d refusals", round, len(refused), bound, push-bound)
				}
			}
			for _, err := range refused {
				testkit.WantCode(t, fmt.Sprintf("round %d: a call past the bound", round), err, envelope.CodeOverloaded)
			}
			waitStarted(t, base+int64((round+1)*bound))
			testkit.WantCode(t, "one more call on the full link", call("gate.echo"), envelope.CodeOverloaded)
			othersUnaffected(t, fmt.Sprintf("round %d", round))
			g.release()
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Errorf("round %d: an admitted call: %v", round, err)
				}
			}
		}
		if err := call("gate.echo"); err != nil {
			t.Errorf("after the rounds: %v", err)
		}
	})

	t.Run("JSON-RPC WebSocket", func(t *testing.T) {
		ws, _, err := websocket.DefaultDialer.DialContext(t.Context(), m.WS, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer ws.Close()
		type reply struct {
			ID     json.RawMessage `json:"id"`
			Result json.RawMessage `json:"result"`
			Error  *struct {
				Code int `json:"code"`
			} `json:"error"`
		}
		replies := make(chan []reply, 64)
		go func() {
			defer close(replies)
			for {
				_, b, err := ws.ReadMessage()
				if err != nil {
					return
				}
				var rs []reply
				if len(b) > 0 && b[0] == '[' {
					if err := json.Unmarshal(b, &rs); err != nil {
						t.Errorf("batch reply %s: %v", b, err)
					}
				} else {
					var r reply
					if err := json.Unmarshal(b, &r); err != nil {
						t.Errorf("reply %s: %v", b, err)
					}
					rs = []reply{r}
				}
				replies <- rs
			}
		}()
		var wmu sync.Mutex
		send := func(v any) {
			wmu.Lock()
			defer wmu.Unlock()
			if err := ws.WriteJSON(v); err != nil {
				t.Fatal(err)
			}
		}
		req := func(id int, method string) map[string]any {
			return map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": map[string]any{},
				"meta": map[string]any{"ttl": 60000}} // the default of a call without one is shorter
		}
		// collect reads replies until n answers came (or 15 s passed).
		collect := func(n int) map[string]reply {
			t.Helper()
			got := map[string]reply{}
			deadline := time.After(15 * time.Second)
			for len(got) < n {
				select {
				case rs, ok := <-replies:
					if !ok {
						t.Fatalf("the hub closed the WebSocket; %d of %d answers", len(got), n)
					}
					for _, r := range rs {
						if _, dup := got[string(r.ID)]; dup {
							t.Errorf("id %s answered twice", r.ID)
						}
						got[string(r.ID)] = r
					}
				case <-deadline:
					ids := make([]string, 0, len(got))
					for id := range got {
						ids = append(ids, id)
					}
					sort.Strings(ids)
					t.Fatalf("%d of %d answers within 15 s (ids %v)", len(got), n, ids)
				}
			}
			return got
		}
		overloaded := func(r reply) bool { return r.Error != nil && r.Error.Code == -32005 }

		base := g.started.Load()
		id := 0
		for round := range 2 {
			first := id + 1
			for range push {
				id++
				send(req(id, "gate.wait"))
			}
			// Past the bound: refused under their own ids, while the
			// others wait at the agent.
			early := collect(push - bound)
			for k, r := range early {
				if !overloaded(r) {
					t.Errorf("round %d: id %s answered %+v while the bound was full; want OVERLOADED", round, k, r)
				}
			}
			waitStarted(t, base+int64((round+1)*bound))
			// A batch that would cross the bound: one refusal per call
			// (none for the notification), under each call's id.
			batch := []any{req(1001, "gate.echo"), req(1002, "gate.echo"),
				map[string]any{"jsonrpc": "2.0", "method": "gate.echo"}}
			send(batch)
			b := collect(2)
			for _, k := range []string{"1001", "1002"} {
				if r, ok := b[k]; !ok || !overloaded(r) {
					t.Errorf("round %d: batch call %s over the bound answered %+v (present %v); want OVERLOADED under its id", round, k, r, ok)
				}
			}
			othersUnaffected(t, fmt.Sprintf("round %d", round))
			g.release()
			late := collect(bound)
			for k, r := range late {
				if r.Error != nil || string(r.Result) != `"released"` {
					t.Errorf("round %d: admitted call %s answered %+v", round, k, r)
				}
				if _, was := early[k]; was {
					t.Errorf("round %d: id %s answered twice", round, k)
				}
			}
			if len(early)+len(late) != push {
				t.Errorf("round %d: %d + %d answers for ids %d..%d", round, len(early), len(late), first, id)
			}
		}
		// The bound is free again: a batch of bound calls passes whole.
		var batch []any
		for k := range bound {
			batch = append(batch, req(2000+k, "gate.echo"))
		}
		send(batch)
		for k, r := range collect(bound) {
			if r.Error != nil {
				t.Errorf("batch call %s after the rounds: %+v", k, r.Error)
			}
		}
	})

	// Nothing left behind: the hub's goroutines (link workers exit after
	// 500 ms idle) go back to the baseline once the test's connections
	// are closed.
	meshtest.WaitFor(t, 20*time.Second, func() bool { return runtime.NumGoroutine() <= g0+3 })
}
