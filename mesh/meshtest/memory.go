package meshtest

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/memnet"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/surface/all"
)

// InMemory is a hub served over an in-memory network (no socket), for
// tests that run inside a testing/synctest bubble: with no socket the
// bubble's goroutines block durably, and its fake clock drives every
// heartbeat, ping, deadline and breaker timer, so that a test asserts
// exact instants and takes no real time. Everything it starts stops in
// the bubble's t.Cleanup (which runs inside the bubble, before
// synctest.Test waits for the bubble's goroutines), so that no goroutine
// outlives the bubble.
type InMemory struct {
	Hub *hub.Hub
	ln  *memnet.Listener
	WS  string // the hub's /ws on the in-memory network

	stopOnce sync.Once
	cancel   context.CancelFunc
	served   chan error
	stopErr  error
}

// memHubURL is the URL clients and agents dial: memnet ignores the
// address, the listener's DialContext is what reaches the hub.
const memHubURL = "ws://memhub/ws"

// StartInMemory runs a hub with cfg on a new in-memory listener until the
// test (its bubble) ends. As meshtest.Start, no warm-up unless cfg sets
// one.
func StartInMemory(t *testing.T, cfg hub.Config, opts ...hub.Option) *InMemory {
	t.Helper()
	cfg = noWarmUp(cfg)
	// The hub logs to the test (shown when it fails): which link closed,
	// which instance left, and why.
	opts = append([]hub.Option{hub.WithLogger(testLogger(t))}, opts...)
	h, err := hub.New(cfg, opts...)
	if err != nil {
		t.Fatalf("NewHub: %v", err)
	}
	all.Mount(h)
	ctx, cancel := context.WithCancel(context.Background())
	m := &InMemory{Hub: h, ln: memnet.Listen("memhub", 0), WS: memHubURL, cancel: cancel, served: make(chan error, 1)}
	go func() { m.served <- h.Serve(ctx, m.ln) }()
	t.Cleanup(func() {
		// A test that stopped the hub itself checked what Serve returned.
		if err := m.stop(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("hub Serve: %v", err)
		}
	})
	return m
}

// Stop ends Serve's context, so that the hub drains (at most
// DrainTimeout) and stops, and returns what Serve returned. Idempotent.
func (m *InMemory) Stop() error {
	m.stopOnce.Do(func() {
		m.cancel()
		m.stopErr = <-m.served
	})
	return m.stopErr
}

// stop is Stop for the cleanup: nil if the test stopped the hub itself.
func (m *InMemory) stop() (err error) {
	m.stopOnce.Do(func() {
		m.cancel()
		m.stopErr = <-m.served
		err = m.stopErr
	})
	return err
}

// Conn returns cc with its Dial set to the in-memory network.
func (m *InMemory) Conn(cc link.Config) link.Config {
	cc.Dial = m.ln.DialContext
	return cc
}

// DialContext dials the hub over the in-memory network (whatever the
// address), for a raw WebSocket or HTTP client of a test's own.
func (m *InMemory) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	return m.ln.DialContext(ctx, network, addr)
}

// HTTPClient is an http.Client whose connections go over the in-memory
// network (for mesh.WithHTTPClient).
func (m *InMemory) HTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: m.ln.DialContext}}
}

// RunAgent runs a (built with m.AgentConn) until the test ends, or stop
// is called, and waits until it is registered.
func (m *InMemory) RunAgent(t *testing.T, a *agents.Agent) (stop func()) {
	t.Helper()
	return runAgent(t, a, m.WS)
}

// AgentConn is the agents option that puts an agent's link on the
// in-memory network.
func (m *InMemory) AgentConn() agents.Option {
	return agents.WithConnConfig(m.Conn(link.Config{}))
}

// Client returns a WebSocket client of the hub over the in-memory
// network, closed when the test ends.
func (m *InMemory) Client(t *testing.T, opts ...mesh.ClientOption) *mesh.Client {
	t.Helper()
	c, err := mesh.NewClient([]string{m.WS}, append([]mesh.ClientOption{mesh.WithConnConfig(m.Conn(link.Config{}))}, opts...)...)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// HTTPRPCClient returns a JSON-RPC-over-HTTP client of the hub over the
// in-memory network, closed when the test ends.
func (m *InMemory) HTTPRPCClient(t *testing.T, opts ...mesh.ClientOption) *mesh.Client {
	t.Helper()
	c, err := mesh.NewClient([]string{"http://memhub"}, append([]mesh.ClientOption{mesh.WithHTTPClient(m.HTTPClient())}, opts...)...)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// testLogger logs to t, at debug level, until the test's cleanups have
// run (registered before the hub's, this one runs after it): a goroutine
// still ending then must not log to a finished test.
func testLogger(t *testing.T) *slog.Logger {
	w := &testLogWriter{t: t}
	t.Cleanup(func() { w.done.Store(true) })
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testLogWriter struct {
	t    *testing.T
	done atomic.Bool
}

func (w *testLogWriter) Write(p []byte) (int, error) {
	if !w.done.Load() {
		w.t.Log(strings.TrimSuffix(string(p), "\n"))
	}
	return len(p), nil
}
