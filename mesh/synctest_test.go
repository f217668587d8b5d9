package mesh_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/memnet"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/reliability"
	"github.com/agentmesh/agentmesh/telemetry"
)

// The tests of this file run the mesh's time-driven behaviour inside
// testing/synctest bubbles over the in-memory network (memmesh_test.go):
// time is the bubble's fake clock, which moves only when every goroutine
// of the bubble is blocked, so that each instant asserted below is exact
// and the tests take no real time.

// registerRaw registers a hand-made agent over l: it never heartbeats.
func registerRaw(t *testing.T, l *link.Link, id string, caps ...string) {
	t.Helper()
	reg, _ := json.Marshal(control.RegisterParams{AgentID: id, Capabilities: caps})
	if _, err := l.Call(t.Context(), &envelope.Request{ID: envelope.NewID(), Method: "agent.register", Params: reg}); err != nil {
		t.Fatalf("agent.register: %v", err)
	}
}

// memoryExpiryCheck is how often the memory registry looks for expired
// instances (registry/memory's default).
const memoryExpiryCheck = 250 * time.Millisecond

// TestSynctestHeartbeatExpiry: an agent that registers and then never
// heartbeats leaves the registry one TTL (three heartbeat intervals)
// after its registration, within one expiry check, and not before; the
// call pending on it fails UNAVAILABLE at that very instant, not at its
// one-minute timeout; the hub closes its link then. An agent that
// heartbeats stays registered through ten TTLs.
func TestSynctestHeartbeatExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const beat = time.Second
		ttl := 3 * beat
		m := meshtest.StartInMemory(t, hub.Config{HeartbeatInterval: beat})
		m.RunAgent(t, agents.NewEcho(agents.WithID("live-1"), m.AgentConn()))

		served := make(chan struct{}, 1)
		l, err := link.Dial(t.Context(), m.WS, m.Conn(link.Config{}), link.WithHandler(
			func(ctx context.Context, _ *envelope.Request) (*envelope.Response, error) {
				served <- struct{}{}
				<-ctx.Done()
				return nil, ctx.Err()
			}))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		registered := time.Now()
		registerRaw(t, l, "mute-1", "mute.call")

		wctx, stopWatch := context.WithCancel(t.Context())
		defer stopWatch()
		watch, err := m.Hub.Registry().Watch(wctx)
		if err != nil {
			t.Fatal(err)
		}
		left := make(chan time.Time, 1)
		go func() {
			for snap := range watch {
				if snap.Instance("mute-1") == nil {
					left <- time.Now()
					break
				}
			}
			for range watch { // until stopWatch
			}
		}()
		linkClosed := make(chan time.Time, 1)
		go func() { <-l.Done(); linkClosed <- time.Now() }()

		c := m.Client(t, mesh.WithoutReliability())
		var callErr error
		var failed time.Time
		callDone := make(chan struct{})
		go func() {
			defer close(callDone)
			callErr = c.Call(t.Context(), "mute.call", nil, nil, mesh.CallTimeout(time.Minute))
			failed = time.Now()
		}()
		select {
		case <-served: // the call is pending on the silent agent
		case <-callDone:
			t.Fatalf("the call ended (%v) before reaching the silent agent", callErr)
		}

		expired := <-left
		<-callDone
		synctest.Wait() // the raw link's end has seen the hub close it
		after := expired.Sub(registered)
		t.Logf("silent agent expired %v after registering (TTL %v, checked every %v); pending call failed %v after that: %v",
			after, ttl, memoryExpiryCheck, failed.Sub(expired), callErr)
		if after <= ttl || after > ttl+memoryExpiryCheck {
			t.Errorf("the silent agent left the registry %v after registering; want within (%v, %v]", after, ttl, ttl+memoryExpiryCheck)
		}
		if code := envelope.CodeOf(callErr); code != envelope.CodeUnavailable {
			t.Errorf("the call pending on the expired agent = %v; want UNAVAILABLE", callErr)
		}
		if !failed.Equal(expired) {
			t.Errorf("the pending call failed %v after the agent expired; want at that instant", failed.Sub(expired))
		}
		select {
		case at := <-linkClosed:
			if !at.Equal(expired) {
				t.Errorf("the hub closed the expired agent's link %v after the expiry; want at once", at.Sub(expired))
			}
		default:
			t.Error("the hub did not close the expired agent's link")
		}

		// The heartbeating agent outlives ten TTLs.
		time.Sleep(10 * ttl)
		if m.Hub.Registry().Snapshot().Instance("live-1") == nil {
			t.Error("the heartbeating agent expired")
		}
		var got int
		if err := c.Call(t.Context(), "echo.echo", 5, &got); err != nil || got != 5 {
			t.Errorf("call to the heartbeating agent after ten TTLs = %v, %v; want 5", got, err)
		}
	})
}

// probeSeen is what the probe agent's handler saw of one call.
type probeSeen struct {
	start    time.Time // the handler began
	deadline time.Time // its context's deadline
	hasDL    bool
	ended    time.Time // its context ended
	err      error     // why
}

// TestSynctestDeadlines: a call to a handler that never answers gets
// TIMEOUT exactly at its deadline, whichever sets it (CallTimeout, the
// caller's context, the client's default timeout, the hub's
// DefaultTimeout for a request with no ttl); the handler's context
// carries that deadline and is cancelled at that instant; nothing is left
// in flight.
func TestSynctestDeadlines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const hubDefault, policy = 7 * time.Second, 5 * time.Second
		rc := reliability.DefaultConfig()
		rc.Policies["probe.short"] = reliability.Policy{Timeout: policy}
		m := meshtest.StartInMemory(t, hub.Config{DefaultTimeout: hubDefault, Reliability: &rc})
		seen := make(chan probeSeen, 1)
		a := agents.New("probe", agents.WithID("probe-1"), m.AgentConn())
		wait := func(ctx context.Context, _ json.RawMessage) (any, error) {
			s := probeSeen{start: time.Now()}
			s.deadline, s.hasDL = ctx.Deadline()
			<-ctx.Done()
			s.ended, s.err = time.Now(), ctx.Err()
			seen <- s
			return nil, ctx.Err()
		}
		a.Handle("probe.wait", wait)
		a.Handle("probe.short", wait)
		m.RunAgent(t, a)
		bare := m.Client(t, mesh.WithoutReliability(), mesh.WithTimeout(4*time.Second))
		sdk := m.Client(t) // the default reliability chain
		raw, err := link.Dial(t.Context(), m.WS, m.Conn(link.Config{}))
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()

		cases := []struct {
			name string
			want time.Duration
			call func() error
		}{
			{"CallTimeout", 3 * time.Second, func() error {
				return bare.Call(t.Context(), "probe.wait", nil, nil, mesh.CallTimeout(3*time.Second))
			}},
			{"context deadline, SDK chain", 2500 * time.Millisecond, func() error {
				ctx, cancel := context.WithTimeout(t.Context(), 2500*time.Millisecond)
				defer cancel()
				return sdk.Call(ctx, "probe.wait", nil, nil)
			}},
			{"client default timeout", 4 * time.Second, func() error {
				return bare.Call(t.Context(), "probe.wait", nil, nil)
			}},
			{"hub DefaultTimeout (no ttl)", hubDefault, func() error {
				// A raw link call with no deadline carries no ttl: the hub
				// bounds it by its DefaultTimeout.
				_, err := raw.Call(context.Background(), &envelope.Request{ID: envelope.NewID(), Method: "probe.wait"})
				return err
			}},
			{"the method's policy timeout, shorter than DefaultTimeout (no ttl)", policy, func() error {
				// Bounded once, at the hub's deadline stage, by the
				// shorter of the two (not by DefaultTimeout, then
				// narrowed again by the retry stage).
				_, err := raw.Call(context.Background(), &envelope.Request{ID: envelope.NewID(), Method: "probe.short"})
				return err
			}},
		}
		for _, tc := range cases {
			start := time.Now()
			err := tc.call()
			took := time.Since(start)
			s := <-seen
			t.Logf("%s: %v after %v; handler deadline in %v, cancelled after %v (%v)", tc.name, envelope.CodeOf(err), took,
				s.deadline.Sub(s.start), s.ended.Sub(start), s.err)
			if envelope.CodeOf(err) != envelope.CodeTimeout {
				t.Errorf("%s: error = %v; want TIMEOUT", tc.name, err)
			}
			if took != tc.want {
				t.Errorf("%s: answered after %v; want exactly the deadline, %v", tc.name, took, tc.want)
			}
			if !s.hasDL || !s.deadline.Equal(start.Add(tc.want)) {
				t.Errorf("%s: the handler's deadline was %v after the call (set %v); want %v", tc.name, s.deadline.Sub(start), s.hasDL, tc.want)
			}
			if s.err == nil || !s.ended.Equal(start.Add(tc.want)) {
				t.Errorf("%s: the handler's context ended %v after the call (%v); want cancelled at %v", tc.name, s.ended.Sub(start), s.err, tc.want)
			}
			synctest.Wait()
			if in := m.Hub.Registry().Snapshot().Instance("probe-1"); in == nil || in.InFlight() != 0 || a.Pending() != 0 {
				t.Errorf("%s: calls left in flight after the timeout (instance %v, agent pending %d)", tc.name, in != nil, a.Pending())
			}
		}
	})
}

// TestSynctestPingTimeout: a link whose peer stops answering pings is
// closed IdleTimeout (2 × PingInterval) after the last pong, to the
// instant: the hub closing a client that went deaf, and a dialled link
// (an agent's or client's) closing on a hub that did, failing the call
// pending on it UNAVAILABLE then.
func TestSynctestPingTimeout(t *testing.T) {
	const ping = time.Second
	idle := 2 * ping
	const deafAt = 3500 * time.Millisecond

	t.Run("hub closes a deaf client", func(t *testing.T) {
		// The hub's first ping goes out 1.25 intervals after the link
		// opened (a peer that pings first keeps it from pinging at all:
		// wsconn's pingWait), then one every interval: 1.25 s, 2.25 s,
		// 3.25 s (the last answered), 4.25 s.
		lastPong := 3250 * time.Millisecond
		want := lastPong + idle
		synctest.Test(t, func(t *testing.T) {
			m := meshtest.StartInMemory(t, hub.Config{Conn: link.Config{PingInterval: ping}})
			d := websocket.Dialer{Subprotocols: []string{envelope.Subprotocol}, NetDialContext: m.DialContext}
			ws, _, err := d.DialContext(t.Context(), m.WS, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer ws.Close()
			opened := time.Now()
			// Until deafAt the client reads, and gorilla answers the hub's
			// pings with pongs; then it stops.
			readerDone := make(chan error, 1)
			go func() {
				for {
					if _, _, err := ws.ReadMessage(); err != nil {
						readerDone <- err
						return
					}
				}
			}()
			time.Sleep(deafAt)
			raw := ws.UnderlyingConn()
			_ = raw.SetReadDeadline(time.Now()) // ends the reader
			<-readerDone
			// From here the client reads raw bytes: the hub's pings pile
			// up unanswered until the hub closes the connection.
			_ = raw.SetReadDeadline(time.Time{})
			buf := make([]byte, 4096)
			for {
				if _, err := raw.Read(buf); err != nil {
					break
				}
			}
			closed := time.Since(opened)
			t.Logf("deaf from %v: the hub closed the connection %v after it opened (ping %v, idle %v)", deafAt, closed, ping, idle)
			if closed != want {
				t.Errorf("the hub closed a client deaf since %v at %v; want exactly %v (the last pong at %v + idle %v)", deafAt, closed, want, lastPong, idle)
			}
		})
	})

	t.Run("dialled link closes on a deaf hub", func(t *testing.T) {
		// A dialled link pings every interval: 1 s, 2 s, 3 s (the last
		// answered), 4 s.
		lastPong := 3 * time.Second
		want := lastPong + idle
		synctest.Test(t, func(t *testing.T) {
			// A stand-in hub that upgrades, answers pings until deaf is
			// closed, then reads nothing more (the connection stays open).
			ln := memnet.Listen("deafhub", 0)
			deaf, end := make(chan struct{}), make(chan struct{})
			up := websocket.Upgrader{Subprotocols: []string{envelope.Subprotocol}}
			srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				ws, err := up.Upgrade(w, r, nil)
				if err != nil {
					return
				}
				defer ws.Close()
				readerDone := make(chan struct{})
				go func() {
					defer close(readerDone)
					for {
						if _, _, err := ws.ReadMessage(); err != nil {
							return
						}
					}
				}()
				select {
				case <-deaf:
				case <-end:
				}
				_ = ws.UnderlyingConn().SetReadDeadline(time.Now())
				<-readerDone
				<-end
			})}
			served := make(chan struct{})
			go func() { defer close(served); _ = srv.Serve(ln) }()
			defer func() { close(end); _ = srv.Close(); <-served }()

			l, err := link.Dial(t.Context(), "ws://deafhub/ws", link.Config{PingInterval: ping, Dial: ln.DialContext})
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			opened := time.Now()
			time.Sleep(deafAt)
			close(deaf)
			callErr := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
				defer cancel()
				_, err := l.Call(ctx, &envelope.Request{ID: envelope.NewID(), Method: "never.answered"})
				callErr <- err
			}()
			<-l.Done()
			closed := time.Since(opened)
			err = <-callErr
			failed := time.Since(opened)
			t.Logf("hub deaf from %v: the link closed %v after it opened (%v); the pending call failed at %v: %v", deafAt, closed, l.Err(), failed, err)
			if closed != want {
				t.Errorf("the link closed at %v; want exactly %v (the last pong at %v + idle %v)", closed, want, lastPong, idle)
			}
			if envelope.CodeOf(err) != envelope.CodeUnavailable || failed != closed {
				t.Errorf("the call pending on the link = %v at %v; want UNAVAILABLE when the link closed (%v)", err, failed, closed)
			}
		})
	})
}

// transition is one state change of a breaker, at the bubble's time.
type transition struct {
	instance, to string
	at           time.Time
}

// startFlaky runs, on m, agent id serving flaky.work, which fails
// UNAVAILABLE (a failure breakers count) while failing is set, and counts
// its executions.
func startFlaky(t *testing.T, m *meshtest.InMemory, id string, failing *atomic.Bool, execs *atomic.Int64) {
	t.Helper()
	a := agents.New("flaky", agents.WithID(id), m.AgentConn())
	a.Handle("flaky.work", func(context.Context, json.RawMessage) (any, error) {
		execs.Add(1)
		if failing.Load() {
			return nil, envelope.NewError(envelope.CodeUnavailable, "flaky: down")
		}
		return "ok", nil
	})
	m.RunAgent(t, a)
}

// flakyConfig gives flaky.* one attempt per call, so that each call is one outcome
// for the breakers.
func flakyConfig(cb reliability.BreakerConfig) reliability.Config {
	rc := reliability.DefaultConfig()
	rc.Policies["flaky.*"] = reliability.Policy{Timeout: 10 * time.Second, Retries: 0, Idempotent: true}
	rc.CircuitBreaker = cb
	return rc
}

// TestSynctestBreakerRecovery: failing calls open the hub's breaker of
// the instance after FailureThreshold of them; while open, calls are
// refused CIRCUIT_OPEN at once, not sent, reaching no agent, up to and
// including RecoveryTimeout after it opened; just after, a probe goes
// through; a failing probe opens it again for another RecoveryTimeout;
// after that, SuccessThreshold successful probes close it. The client's
// own per-method breaker (WithReliability) does the same on its side.
func TestSynctestBreakerRecovery(t *testing.T) {
	const recovery = 5 * time.Second
	t.Run("hub per-instance breaker", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var mu sync.Mutex
			var trans []transition
			rc := flakyConfig(reliability.BreakerConfig{FailureThreshold: 3, RecoveryTimeout: recovery, SuccessThreshold: 2})
			m := meshtest.StartInMemory(t, hub.Config{Reliability: &rc}, hub.WithBreakerHook(func(k reliability.BreakerKey, _, to string) {
				if k.Method == "flaky.work" {
					mu.Lock()
					trans = append(trans, transition{k.Instance, to, time.Now()})
					mu.Unlock()
				}
			}))
			transitions := func() []transition {
				mu.Lock()
				defer mu.Unlock()
				return slices.Clone(trans)
			}
			var failing atomic.Bool
			var execs atomic.Int64
			failing.Store(true)
			startFlaky(t, m, "flaky-1", &failing, &execs)
			c := m.Client(t, mesh.WithoutReliability())
			call := func() error { return c.Call(t.Context(), "flaky.work", nil, nil) }
			refused := func(when string) {
				t.Helper()
				before := execs.Load()
				start := time.Now()
				err := call()
				e := envelope.AsError(err)
				if envelope.CodeOf(err) != envelope.CodeCircuitOpen || !e.NotSent() || time.Since(start) != 0 || execs.Load() != before {
					t.Fatalf("%s: call = %v (not sent %v) after %v, %d executions; want CIRCUIT_OPEN, not sent, at once, none",
						when, err, e != nil && e.NotSent(), time.Since(start), execs.Load()-before)
				}
			}

			for i := range 3 {
				if err := call(); envelope.CodeOf(err) != envelope.CodeUnavailable {
					t.Fatalf("failing call %d = %v; want the agent's UNAVAILABLE", i, err)
				}
			}
			tr := transitions()
			if len(tr) != 1 || tr[0].to != "open" || tr[0].instance != "flaky-1" {
				t.Fatalf("breaker transitions after 3 failures = %+v; want flaky-1 open", tr)
			}
			opened := tr[0].at
			refused("just opened")
			time.Sleep(time.Until(opened.Add(recovery)))
			refused("RecoveryTimeout after it opened")

			// Just after: a probe goes through; it fails: open again.
			time.Sleep(time.Nanosecond)
			before := execs.Load()
			if err := call(); envelope.CodeOf(err) != envelope.CodeUnavailable || execs.Load() != before+1 {
				t.Fatalf("the first call after RecoveryTimeout = %v, %d executions; want the probe to reach the agent (UNAVAILABLE)", err, execs.Load()-before)
			}
			tr = transitions()
			if len(tr) != 3 || tr[1].to != "half-open" || tr[2].to != "open" || !tr[1].at.Equal(opened.Add(recovery+time.Nanosecond)) {
				t.Fatalf("transitions = %+v; want half-open at %v then open again", tr, opened.Add(recovery+time.Nanosecond))
			}
			reopened := tr[2].at
			refused("reopened by the failed probe")
			time.Sleep(time.Until(reopened.Add(recovery)))
			refused("RecoveryTimeout after it reopened")

			// The agent recovers: two successful probes close it.
			failing.Store(false)
			time.Sleep(time.Nanosecond)
			for i := range 2 {
				if err := call(); err != nil {
					t.Fatalf("probe %d after recovery = %v; want OK", i, err)
				}
				if tr = transitions(); i == 0 && (len(tr) != 4 || tr[3].to != "half-open") {
					t.Fatalf("transitions after one successful probe = %+v; want half-open still (SuccessThreshold 2)", tr)
				}
			}
			tr = transitions()
			if len(tr) != 5 || tr[3].to != "half-open" || tr[4].to != "closed" {
				t.Fatalf("transitions = %+v; want half-open, then closed after 2 successes", tr)
			}
			var brk []reliability.BreakerInfo
			if err := c.Call(t.Context(), "mesh.breakers", nil, &brk); err != nil {
				t.Fatal(err)
			}
			if i := slices.IndexFunc(brk, func(b reliability.BreakerInfo) bool { return b.Instance == "flaky-1" }); i < 0 || brk[i].State != "closed" {
				t.Errorf("mesh.breakers = %+v; want flaky-1 closed", brk)
			}
			for i := range 10 {
				if err := call(); err != nil {
					t.Fatalf("call %d after the breaker closed = %v", i, err)
				}
			}
			t.Logf("opened at +%v, probed and reopened at +%v, closed at +%v (RecoveryTimeout %v)",
				opened.Sub(tr[0].at), reopened.Sub(tr[0].at), tr[4].at.Sub(tr[0].at), recovery)
		})
	})

	t.Run("client per-method breaker", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// The hub's breakers would need a thousand failures: what
			// opens here is the client's.
			hubRC := flakyConfig(reliability.BreakerConfig{FailureThreshold: 1000, RecoveryTimeout: time.Hour, SuccessThreshold: 1})
			m := meshtest.StartInMemory(t, hub.Config{Reliability: &hubRC})
			var failing atomic.Bool
			var execs atomic.Int64
			failing.Store(true)
			startFlaky(t, m, "flaky-1", &failing, &execs)
			c := m.Client(t, mesh.WithReliability(flakyConfig(reliability.BreakerConfig{FailureThreshold: 2, RecoveryTimeout: recovery, SuccessThreshold: 1})))
			state := func() string {
				for _, b := range c.Breakers().List() {
					if b.Method == "flaky.work" {
						return b.State
					}
				}
				return ""
			}
			call := func() error { return c.Call(t.Context(), "flaky.work", nil, nil) }
			for i := range 2 {
				if err := call(); envelope.CodeOf(err) != envelope.CodeUnavailable {
					t.Fatalf("failing call %d = %v; want UNAVAILABLE", i, err)
				}
			}
			opened := time.Now()
			if s := state(); s != "open" {
				t.Fatalf("client breaker after 2 failures: %q; want open", s)
			}
			for _, at := range []time.Duration{0, recovery / 2, recovery} {
				time.Sleep(time.Until(opened.Add(at)))
				before := execs.Load()
				err := call()
				if envelope.CodeOf(err) != envelope.CodeCircuitOpen || execs.Load() != before {
					t.Fatalf("call %v after the client's breaker opened = %v, %d executions; want CIRCUIT_OPEN, sent nowhere", at, err, execs.Load()-before)
				}
			}
			failing.Store(false)
			time.Sleep(time.Nanosecond)
			before := execs.Load()
			if err := call(); err != nil || execs.Load() != before+1 {
				t.Fatalf("the probe after RecoveryTimeout = %v, %d executions; want it sent, and OK", err, execs.Load()-before)
			}
			if s := state(); s != "closed" {
				t.Errorf("client breaker after a successful probe: %q; want closed", s)
			}
		})
	})
}

// TestSynctestDrain: the hub's drain, its context ended at drainAt. At
// once: every native link (an agent's, a client's) is sent goaway, and a
// new call is refused UNAVAILABLE, not sent, over each surface (a
// WebSocket client, a JSON-RPC-over-HTTP client, a link that received
// goaway). The call in flight since before finishes, OK, at its own time;
// Serve returns once the links are quiet, within DrainTimeout, and closes
// the links left. A call stuck past DrainTimeout does not hold it up:
// Serve returns DrainTimeout after the drain began, and that call fails
// UNAVAILABLE then.
func TestSynctestDrain(t *testing.T) {
	// Under the hub's default policy timeout (10 s), which would end a
	// stuck call first.
	const drainTimeout = 5 * time.Second
	const drainAt = time.Second // after the slow call began
	t.Run("in-flight call finishes", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			m := meshtest.StartInMemory(t, hub.Config{DrainTimeout: drainTimeout})
			echo := agents.NewEcho(agents.WithID("echo-1"), m.AgentConn())
			m.RunAgent(t, echo)
			c := m.Client(t, mesh.WithoutReliability())
			hc := m.HTTPRPCClient(t, mesh.WithoutReliability())
			if err := hc.Call(t.Context(), "echo.echo", []int{1}, nil); err != nil {
				t.Fatalf("HTTP call before the drain: %v", err)
			}
			// A hand-made agent's link: it sees the goaway frame itself.
			raw, err := link.Dial(t.Context(), m.WS, m.Conn(link.Config{}))
			if err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			registerRaw(t, raw, "raw-1", "raw.*")

			start := time.Now()
			var slowErr error
			var slowAt time.Time
			slowDone := make(chan struct{})
			go func() {
				defer close(slowDone)
				slowErr = c.Call(t.Context(), "echo.sleep", agents.SleepParams{MS: 3000}, nil, mesh.CallTimeout(time.Minute))
				slowAt = time.Now()
			}()
			time.Sleep(drainAt)
			var serveErr error
			var stopped time.Time
			stopDone := make(chan struct{})
			go func() {
				defer close(stopDone)
				serveErr = m.Stop()
				stopped = time.Now()
			}()
			synctest.Wait()
			drained := time.Now()
			select {
			case <-raw.GoAway():
			default:
				t.Error("the agent's link got no goaway when the drain began")
			}
			select {
			case <-echo.Registered():
				t.Error("the echo agent still counts itself registered after the goaway")
			default:
			}
			if raw.Err() != nil {
				t.Errorf("the hub closed a link at goaway: %v", raw.Err())
			}
			for _, tc := range []struct {
				name string
				call func() error
			}{
				{"WebSocket client", func() error { return c.Call(t.Context(), "echo.echo", 2, nil) }},
				{"HTTP client", func() error { return hc.Call(t.Context(), "echo.echo", []int{3}, nil) }},
				{"link told goaway", func() error {
					_, err := raw.Call(t.Context(), &envelope.Request{ID: envelope.NewID(), Method: "echo.echo", Params: json.RawMessage("4")})
					return err
				}},
			} {
				at := time.Now()
				err := tc.call()
				if e := envelope.AsError(err); envelope.CodeOf(err) != envelope.CodeUnavailable || !e.NotSent() || time.Since(at) != 0 {
					t.Errorf("%s: new call while draining = %v (not sent %v) after %v; want UNAVAILABLE, not sent, at once",
						tc.name, err, e != nil && e.NotSent(), time.Since(at))
				}
			}
			select {
			case <-stopDone:
				t.Fatalf("Serve returned (%v) %v after the drain began, with a call in flight", serveErr, time.Since(drained))
			default:
			}

			<-slowDone
			if slowErr != nil || slowAt.Sub(start) != 3*time.Second {
				t.Errorf("the call in flight when the drain began = %v after %v; want OK at its 3s", slowErr, slowAt.Sub(start))
			}
			<-stopDone
			took := stopped.Sub(drained)
			t.Logf("Serve returned %v after the drain began (in-flight call done at %v; DrainTimeout %v): %v",
				took, slowAt.Sub(drained), drainTimeout, serveErr)
			if serveErr != nil {
				t.Errorf("Serve = %v; want nil, the drain done in time", serveErr)
			}
			if stopped.Before(slowAt) || took > drainTimeout {
				t.Errorf("Serve returned %v after the drain began; want after the call in flight (%v) and within DrainTimeout %v",
					took, slowAt.Sub(drained), drainTimeout)
			}
			synctest.Wait() // the link's end has seen the hub close it
			select {
			case <-raw.Done():
			default:
				t.Error("the link left open is not closed after Serve returned")
			}
		})
	})

	t.Run("stuck call bounded by DrainTimeout", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			m := meshtest.StartInMemory(t, hub.Config{DrainTimeout: drainTimeout})
			a := agents.New("stuck", agents.WithID("stuck-1"), m.AgentConn(), agents.WithDrainTimeout(time.Second))
			a.Handle("stuck.wait", func(ctx context.Context, _ json.RawMessage) (any, error) {
				<-ctx.Done()
				return nil, ctx.Err()
			})
			m.RunAgent(t, a)
			c := m.Client(t, mesh.WithoutReliability())
			var stuckErr error
			var stuckAt time.Time
			stuckDone := make(chan struct{})
			go func() {
				defer close(stuckDone)
				stuckErr = c.Call(t.Context(), "stuck.wait", nil, nil, mesh.CallTimeout(time.Hour))
				stuckAt = time.Now()
			}()
			time.Sleep(drainAt)
			drained := time.Now()
			err := m.Stop()
			took := time.Since(drained)
			<-stuckDone
			t.Logf("Serve returned %v after the drain began (DrainTimeout %v): %v; the stuck call failed at %v: %v",
				took, drainTimeout, err, stuckAt.Sub(drained), stuckErr)
			if took != drainTimeout {
				t.Errorf("Serve returned %v after the drain began; want exactly DrainTimeout, %v", took, drainTimeout)
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Serve = %v; want the drain's deadline exceeded", err)
			}
			if envelope.CodeOf(stuckErr) != envelope.CodeUnavailable || stuckAt.Sub(drained) != drainTimeout {
				t.Errorf("the stuck call = %v at %v; want UNAVAILABLE when the hub closed its links, at %v", stuckErr, stuckAt.Sub(drained), drainTimeout)
			}
		})
	})
}

// TestSynctestRegisterDuringRegistryChange: agents registering together
// keep their links. Each registration changes the registry, on which the
// hub's follow goroutine compares its bindings with a snapshot to close
// the links of instances that left; one whose registration completed
// between that snapshot and the comparison was taken for gone, and its
// link closed just after it registered (seen in the tests above, about 1
// run in 300: "instance left the registry; closing its link" at the
// instant of registration).
func TestSynctestRegisterDuringRegistryChange(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const rounds, n = 5, 100
		m := meshtest.StartInMemory(t, hub.Config{})
		lost := 0
		for r := range rounds {
			links := make([]*link.Link, n)
			for i := range links {
				l, err := link.Dial(t.Context(), m.WS, m.Conn(link.Config{}))
				if err != nil {
					t.Fatal(err)
				}
				links[i] = l
			}
			var wg sync.WaitGroup
			for i, l := range links {
				wg.Go(func() { registerRaw(t, l, fmt.Sprintf("reg-%d-%d", r, i), "reg.call") })
			}
			wg.Wait()
			synctest.Wait()
			for i, l := range links {
				if l.Err() != nil {
					lost++
					t.Errorf("round %d: agent %d's link closed after it registered: %v", r, i, l.Err())
				}
				l.Close()
			}
		}
		t.Logf("%d of %d links lost after registering", lost, rounds*n)
	})
}

// TestSynctestLinkLiveness: where the hub's links ping at least once a
// heartbeat interval, an agent's link is its heartbeat. The Go agent
// learns it at registration and sends no agent.heartbeat; it and an agent
// that never heartbeats (its link answers pings, nothing more) both stay
// registered, as the same instances, through ten TTLs. (A link that
// stops answering is closed at its idle timeout, two intervals, and its
// agent deregistered: TestSynctestPingTimeout.)
func TestSynctestLinkLiveness(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const beat = time.Second
		metrics := telemetry.NewMetrics(nil)
		m := meshtest.StartInMemory(t, hub.Config{HeartbeatInterval: beat, Conn: link.Config{PingInterval: beat}},
			hub.WithTelemetry(telemetry.New(nil, metrics)))
		m.RunAgent(t, agents.NewEcho(agents.WithID("sdk-1"), agents.WithConnConfig(m.Conn(link.Config{PingInterval: beat}))))
		l, err := link.Dial(t.Context(), m.WS, m.Conn(link.Config{PingInterval: beat}))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		registerRaw(t, l, "quiet-1", "quiet.call")
		snap := m.Hub.Registry().Snapshot()
		sdk, quiet := snap.Instance("sdk-1"), snap.Instance("quiet-1")
		if sdk == nil || quiet == nil {
			t.Fatal("agents not registered")
		}

		time.Sleep(30 * beat) // ten TTLs
		synctest.Wait()
		snap = m.Hub.Registry().Snapshot()
		if snap.Instance("sdk-1") != sdk || snap.Instance("quiet-1") != quiet {
			t.Fatalf("after ten TTLs: sdk-1 %v, quiet-1 %v; want both still registered as the same instances",
				snap.Instance("sdk-1") != nil, snap.Instance("quiet-1") != nil)
		}
		var beats float64
		fams, _ := metrics.Registry.Gather()
		for _, f := range fams {
			if f.GetName() == "agentmesh_registry_heartbeats_total" {
				for _, s := range f.Metric {
					beats += s.GetCounter().GetValue()
				}
			}
		}
		if beats != 0 {
			t.Errorf("%v agent.heartbeat calls in ten TTLs; want none (the links are the heartbeats)", beats)
		}
	})
}
