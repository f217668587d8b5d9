package hub_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/reliability"
	"github.com/agentmesh/agentmesh/telemetry"
	"github.com/gorilla/websocket"
)

// TestFastPathMatchesChain: a routed call over a native link, or a single
// call over a plain JSON-RPC WebSocket, takes the completion-style forward
// path (fast.go); the same call over /rpc, or in a batch, takes the
// blocking chain. Both give the caller the same answer or code and
// the attempts mark, the hub the same spans (the server span, one attempt
// span per attempt, with their status and attempt numbers) and the same
// rpc.server.call.duration observations: for a success, a failure retried
// on another instance, a failure not retried, no responders, per-try
// timeouts, and a refusal by the role table.
func TestFastPathMatchesChain(t *testing.T) {
	exp, p := testkit.Tracing(t, "hub")
	metrics := telemetry.NewMetrics(nil)
	rc := reliability.DefaultConfig()
	fast := reliability.Policy{Backoff: reliability.BackoffConfig{Initial: time.Millisecond, Max: time.Millisecond, Multiplier: 1}}
	flaky := fast
	flaky.Retries, flaky.Idempotent = 2, true
	rc.Policies["flaky.*"] = flaky
	rc.Policies["fail.*"] = fast
	slow := flaky
	slow.Retries, slow.PerTryTimeout = 1, 50*time.Millisecond
	rc.Policies["slow.*"] = slow
	sec := hub.Security{Key: testkit.TestKey, Roles: map[string][]string{"secret.*": {"admin"}}}
	m := meshtest.Start(t, hub.Config{Security: &sec, Reliability: &rc}, hub.WithTelemetry(telemetry.New(p, metrics)))
	h := m.Hub

	agentTok := testkit.Token(t, auth.Claims{Subject: "agent", Serve: []string{"*"}}, time.Hour)
	var mu sync.Mutex
	seen := map[string]int{}
	for _, id := range []string{"a", "b"} {
		a := agents.New("flaky", agents.WithID("flaky-"+id), agents.WithToken(agentTok))
		a.Handle("flaky.once", func(_ context.Context, params json.RawMessage) (any, error) {
			mu.Lock()
			defer mu.Unlock()
			seen[string(params)]++
			if seen[string(params)] == 1 {
				return nil, envelope.NewError(envelope.CodeUnavailable, "first attempt fails")
			}
			return "ok", nil
		})
		a.Handle("fail.bad", func(context.Context, json.RawMessage) (any, error) {
			return nil, envelope.NewError(envelope.CodeInvalidParams, "never")
		})
		a.Handle("slow.sleep", func(ctx context.Context, _ json.RawMessage) (any, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		})
		a.Handle("secret.read", func(context.Context, json.RawMessage) (any, error) { return "secret", nil })
		m.RunAgent(t, a)
	}
	tok := testkit.Token(t, auth.Claims{Subject: "user", Roles: []string{"reader"}}, time.Hour)
	native := testkit.MustClient(t, m.WS, mesh.WithToken(tok), mesh.WithoutReliability())
	overHTTP := m.HTTPClient(t, mesh.WithToken(tok), mesh.WithoutReliability())

	cases := []struct {
		method string
		code   envelope.Code // OK: a result
	}{
		{"flaky.once", envelope.CodeOK},
		{"fail.bad", envelope.CodeInvalidParams},
		{"nobody.home", envelope.CodeMethodNotFound},
		{"slow.sleep", envelope.CodeTimeout},
		{"secret.read", envelope.CodePermissionDenied},
	}
	// outcome makes one call with call and describes what the caller got
	// (got), the hub's spans for it and its server-duration observations.
	outcome := func(method string, call func(ctx context.Context) string) (string, []string) {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		exp.Reset()
		before := testkit.HistCount(t, metrics, "rpc_server_call_duration_seconds", map[string]string{"rpc_method": method})
		got := call(ctx)
		if err := p.ForceFlush(t.Context()); err != nil {
			t.Fatal(err)
		}
		var shapes []string
		for _, sp := range exp.GetSpans() {
			if !strings.HasPrefix(sp.Name, method) {
				continue // an agent's registration or heartbeat
			}
			s := fmt.Sprintf("%s/%s/%s", sp.Name, sp.SpanKind, sp.Status.Code)
			for _, a := range sp.Attributes {
				if a.Key == "agentmesh.attempt" || a.Key == "agentmesh.error.code" || a.Key == "agentmesh.instance" {
					s += fmt.Sprintf(" %s=%s", a.Key, a.Value.Emit())
				}
			}
			shapes = append(shapes, s)
		}
		slices.Sort(shapes)
		after := testkit.HistCount(t, metrics, "rpc_server_call_duration_seconds", map[string]string{"rpc_method": method})
		return fmt.Sprintf("%s observed=%d", got, after-before), shapes
	}
	viaClient := func(c *mesh.Client, method, param string) func(ctx context.Context) string {
		return func(ctx context.Context) string {
			var res string
			err := c.Call(ctx, method, []string{param}, &res)
			got := fmt.Sprintf("res=%q code=%s", res, envelope.CodeOf(err))
			if err != nil {
				got += " attempts=" + strconv.Itoa(envelope.AsError(err).Attempts())
			}
			return got
		}
	}
	// A plain JSON-RPC WebSocket: a single call takes the forward path, a
	// batch of one the chain; the answers are compared byte for byte.
	hdr := http.Header{"Authorization": {"Bearer " + tok}}
	rpcWS, _, err := websocket.DefaultDialer.DialContext(t.Context(), m.WS, hdr)
	if err != nil {
		t.Fatal(err)
	}
	defer rpcWS.Close()
	viaJSONRPC := func(method, param string, batch bool) func(ctx context.Context) string {
		return func(ctx context.Context) string {
			msg := fmt.Sprintf(`{"jsonrpc":"2.0","id":7,"method":%q,"params":[%q]}`, method, param)
			if batch {
				msg = "[" + msg + "]"
			}
			if err := rpcWS.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
				t.Fatal(err)
			}
			_, ans, err := rpcWS.ReadMessage()
			if err != nil {
				t.Fatal(err)
			}
			if batch {
				ans = ans[1 : len(ans)-1]
			}
			return strings.ReplaceAll(string(ans), param, "PARAM")
		}
	}
	for i, tc := range cases {
		for _, pair := range []struct {
			name        string
			fast, chain func(ctx context.Context) string
		}{
			{"native link vs /rpc", viaClient(native, tc.method, fmt.Sprintf("fast-%d", i)), viaClient(overHTTP, tc.method, fmt.Sprintf("chain-%d", i))},
			{"JSON-RPC WebSocket call vs batch of one", viaJSONRPC(tc.method, fmt.Sprintf("rpc-fast-%d", i), false), viaJSONRPC(tc.method, fmt.Sprintf("rpc-chain-%d", i), true)},
		} {
			takenBefore := hub.FastTaken(h)
			gotFast, spansFast := outcome(tc.method, pair.fast)
			if hub.FastTaken(h) != takenBefore+1 {
				t.Errorf("%s, %s: the call was not taken by the forward path", tc.method, pair.name)
			}
			takenBefore = hub.FastTaken(h)
			gotChain, spansChain := outcome(tc.method, pair.chain)
			if hub.FastTaken(h) != takenBefore {
				t.Errorf("%s, %s: the chain's call was taken by the forward path", tc.method, pair.name)
			}
			if i := strings.Index(gotFast, " code="); i >= 0 && !strings.HasPrefix(gotFast[i:], " code="+tc.code.String()+" ") {
				t.Errorf("%s, %s: %s; want code %s", tc.method, pair.name, gotFast, tc.code)
			}
			if gotFast != gotChain {
				t.Errorf("%s, %s: forward path %s; chain %s", tc.method, pair.name, gotFast, gotChain)
			}
			// The instance an attempt went to is the balancer's pick:
			// compare the shapes without it.
			if !slices.Equal(stripInstance(spansFast), stripInstance(spansChain)) {
				t.Errorf("%s, %s: spans differ\nforward path: %q\nchain:        %q", tc.method, pair.name, spansFast, spansChain)
			}
		}
	}
}

// stripInstance drops the instance an attempt span names (the balancer's
// pick), checking that it names one.
func stripInstance(shapes []string) []string {
	out := make([]string, len(shapes))
	for i, s := range shapes {
		if j := strings.Index(s, " agentmesh.instance="); j >= 0 {
			s = s[:j]
		}
		out[i] = s
	}
	return out
}

// TestFastAnswerToSlowConsumerBlocksNoOne: the forward path answers a
// call on the agent link's reader. A caller that reads nothing fills its
// send queue; its answers then wait for room on a goroutine of their own
// (Link.Answer), not on that reader, which carries every other caller's
// answers from the agent: they keep coming, long before the write timeout
// that ends the slow consumer.
func TestFastAnswerToSlowConsumerBlocksNoOne(t *testing.T) {
	const writeTimeout = 5 * time.Second
	m := meshtest.Start(t, hub.Config{Conn: link.Config{QueueSize: 4, WriteTimeout: writeTimeout}})
	m.RunAgent(t, agents.NewEcho(agents.WithID("echo-1")))
	c := testkit.MustClient(t, m.WS, mesh.WithoutReliability())
	if err := c.Call(t.Context(), "echo.echo", 1, nil); err != nil {
		t.Fatal(err)
	}
	// The slow consumer: a native link that sends 80 calls with 256 KiB
	// of params each, paced (the agent link's queue is short too), and
	// reads nothing: 20 MiB of answers, past what the kernel's socket
	// buffers hold.
	d := websocket.Dialer{Subprotocols: []string{envelope.Subprotocol}}
	ws, _, err := d.DialContext(t.Context(), m.WS, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	params, _ := json.Marshal(strings.Repeat("x", 256<<10))
	var sent atomic.Int64
	writer := make(chan struct{})
	go func() {
		defer close(writer)
		for i := range 80 {
			time.Sleep(2 * time.Millisecond)
			f := envelope.AppendRequestFrame(nil, uint64(i+1), &envelope.Request{ID: "slow-" + strconv.Itoa(i), Method: "echo.echo", Params: params})
			if ws.WriteMessage(websocket.TextMessage, f) != nil {
				return // the hub closed it
			}
			sent.Add(1)
		}
	}()
	defer func() { ws.Close(); <-writer }()
	// Until the hub stops reading it (its answers fill the kernel's
	// buffers, then its queue).
	for last := int64(-1); sent.Load() != last; {
		last = sent.Load()
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("the slow consumer sent %d calls", sent.Load())
	// Every other caller's calls still get their answers from the agent.
	start := time.Now()
	for i := range 50 {
		ctx, cancel := context.WithTimeout(t.Context(), writeTimeout/2)
		err := c.Call(ctx, "echo.echo", i, nil)
		cancel()
		if err != nil {
			t.Fatalf("call %d, %v after the slow consumer filled its queue: %v", i, time.Since(start), err)
		}
	}
}

// TestFastCallsWaitInTheBulkheadWithoutAGoroutine: calls on the forward
// path that find their method's bulkhead full wait in its queue with no
// goroutine (before, each waited on one of its own in the blocking
// chain), and get what the chain gave them: admitted when a slot frees,
// OVERLOADED at once on a full queue and after the queue timeout, and a
// queued call its caller cancels leaves the queue. In a synctest bubble
// over the in-memory network: the queue timeout passes on the fake clock.
func TestFastCallsWaitInTheBulkheadWithoutAGoroutine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rc := reliability.DefaultConfig()
		rc.Bulkhead = reliability.BulkheadConfig{MaxConcurrent: 1, QueueSize: 2, QueueTimeout: 300 * time.Millisecond}
		m := meshtest.StartInMemory(t, hub.Config{Reliability: &rc})
		h := m.Hub
		var gateMu sync.Mutex
		gate := make(chan struct{})
		a := agents.New("gate", m.AgentConn())
		a.Handle("gate.wait", func(ctx context.Context, _ json.RawMessage) (any, error) {
			gateMu.Lock()
			g := gate
			gateMu.Unlock()
			select {
			case <-g:
				return "open", nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		})
		m.RunAgent(t, a)
		c := m.Client(t, mesh.WithoutReliability())
		open := func() { // the calls running and to come return
			gateMu.Lock()
			close(gate)
			gateMu.Unlock()
		}
		shut := func() { // the calls to come wait
			gateMu.Lock()
			gate = make(chan struct{})
			gateMu.Unlock()
		}

		type outcome struct {
			name string
			err  error
		}
		results := make(chan outcome, 8)
		call := func(ctx context.Context, name string) {
			go func() {
				var res string
				err := c.Call(ctx, "gate.wait", nil, &res)
				results <- outcome{name, err}
			}()
			synctest.Wait() // the call has reached the hub and is running or queued
		}
		active := func(running, queued int) {
			t.Helper()
			if r, q := hub.BulkheadActive(h, "gate.wait"); r != running || q != queued {
				t.Fatalf("bulkhead: %d running, %d queued; want %d, %d", r, q, running, queued)
			}
		}
		blockingWaiters := func() int {
			buf := make([]byte, 1<<20)
			return strings.Count(string(buf[:runtime.Stack(buf, true)]), "hub.(*fastCall).blocking.func1")
		}
		takenBefore := hub.FastTaken(h)
		ctx := t.Context()
		call(ctx, "first")
		active(1, 0)
		call(ctx, "second")
		active(1, 1)
		cancelCtx, cancel := context.WithCancel(ctx)
		call(cancelCtx, "cancelled")
		active(1, 2)
		if n := blockingWaiters(); n != 0 {
			t.Errorf("%d goroutines wait on the blocking chain for queued calls; want none", n)
		}
		if got := hub.FastTaken(h) - takenBefore; got != 3 {
			t.Errorf("the forward path took %d calls; want 3", got)
		}
		// Full: refused at once.
		var res string
		err := c.Call(ctx, "gate.wait", nil, &res)
		if envelope.CodeOf(err) != envelope.CodeOverloaded || !strings.Contains(err.Error(), "queue full") {
			t.Errorf("a call on a full queue: %v; want OVERLOADED, queue full", err)
		}
		// A queued call cancelled by its caller leaves the queue.
		cancel()
		if o := <-results; o.name != "cancelled" || envelope.CodeOf(o.err) != envelope.CodeCancelled {
			t.Errorf("first outcome %s: %v; want the cancelled call, CANCELLED", o.name, o.err)
		}
		synctest.Wait()
		active(1, 1)
		// Slots free: the queued call is admitted and answered.
		open()
		for range 2 {
			if o := <-results; o.err != nil {
				t.Errorf("%s: %v", o.name, o.err)
			}
		}
		synctest.Wait()
		active(0, 0)
		// The queue timeout, to the instant.
		shut()
		call(ctx, "holder")
		active(1, 0)
		start := time.Now()
		call(ctx, "timed-out")
		o := <-results
		if o.name != "timed-out" || envelope.CodeOf(o.err) != envelope.CodeOverloaded || !strings.Contains(o.err.Error(), "queue timeout") {
			t.Errorf("%s: %v; want timed-out, OVERLOADED after the queue timeout", o.name, o.err)
		}
		if d := time.Since(start); d != 300*time.Millisecond {
			t.Errorf("refused after %v in the queue; want the queue timeout, 300ms", d)
		}
		open()
		if o := <-results; o.err != nil {
			t.Errorf("%s: %v", o.name, o.err)
		}
		synctest.Wait()
		active(0, 0)
	})
}
