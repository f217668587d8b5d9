// Package meshtest starts hubs, agents and clients on real loopback
// sockets for tests, and stops them in tb.Cleanup.
package meshtest

import (
	"context"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/registry"
	"github.com/agentmesh/agentmesh/surface/all"
)

// Mesh is a running hub on a loopback port.
type Mesh struct {
	Hub  *hub.Hub
	Addr string // host:port
	WS   string // ws://host:port/ws
	HTTP string // http://host:port
}

// Start runs a hub on 127.0.0.1 on a free port until the test ends.
//
// The hubs started here have no warm-up (HubConfig.WarmUp) unless cfg
// sets one: each is new, with no agent reconnecting to it, and a call to
// a method nobody serves gets METHOD_NOT_FOUND at once, as after the
// warm-up of a restarted meshd.
func Start(tb testing.TB, cfg hub.Config, opts ...hub.Option) *Mesh {
	tb.Helper()
	return StartMounted(tb, cfg, nil, opts...)
}

// StartMounted is Start with mount run on the hub before it serves (a
// handler the test's package mounts, such as the console).
func StartMounted(tb testing.TB, cfg hub.Config, mount func(*hub.Hub), opts ...hub.Option) *Mesh {
	tb.Helper()
	cfg = noWarmUp(cfg)
	h, err := hub.New(cfg, opts...)
	if err != nil {
		tb.Fatalf("NewHub: %v", err)
	}
	all.Mount(h)
	if mount != nil {
		mount(h)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("listen: %v", err)
	}
	return serveCfg(tb, h, ln, cfg)
}

// serveCfg serves h, probing readiness in a way cfg's listener answers:
// the plain readiness probe cannot pass a TLS (maybe mutual) listener, so
// a TLS hub is ready when it accepts connections.
func serveCfg(tb testing.TB, h *hub.Hub, ln net.Listener, cfg hub.Config) *Mesh {
	tb.Helper()
	if cfg.TLS != nil {
		return serveWith(tb, h, ln, func(m *Mesh) bool {
			c, err := net.Dial("tcp", m.Addr)
			if err == nil {
				c.Close()
			}
			return err == nil
		})
	}
	return serve(tb, h, ln)
}

func serve(tb testing.TB, h *hub.Hub, ln net.Listener) *Mesh {
	return serveWith(tb, h, ln, func(m *Mesh) bool {
		res, err := http.Get(m.HTTP + "/readyz")
		if err != nil {
			return false
		}
		res.Body.Close()
		return res.StatusCode == http.StatusOK
	})
}

func serveWith(tb testing.TB, h *hub.Hub, ln net.Listener, ready func(*Mesh) bool) *Mesh {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Serve(ctx, ln) }()
	tb.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			tb.Errorf("hub did not stop within 30s")
		}
	})
	addr := ln.Addr().String()
	m := &Mesh{Hub: h, Addr: addr, WS: "ws://" + addr + "/ws", HTTP: "http://" + addr}
	WaitFor(tb, 5*time.Second, func() bool { return ready(m) })
	return m
}

// RunAgent runs a until the test ends (or stop is called) and waits until
// it is registered.
func (m *Mesh) RunAgent(tb testing.TB, a *agents.Agent) (stop func()) {
	tb.Helper()
	return runAgent(tb, a, m.WS)
}

// runAgent runs a against the hub at url until the test ends or stop is
// called (the cleanup is registered first, so that a failed wait stops
// it too), and waits up to 10 s (a bubble's, in one) for its
// registration.
func runAgent(tb testing.TB, a *agents.Agent, url string) (stop func()) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := a.Run(ctx, url); err != nil {
			tb.Errorf("agent %s: %v", a.Name(), err)
		}
	})
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	tb.Cleanup(stop)
	select {
	case <-a.Registered():
	case <-time.After(10 * time.Second):
		tb.Fatalf("agent %s did not register within 10s", a.Name())
	}
	return stop
}

// Client returns a WebSocket client of the hub, closed when the test ends.
func (m *Mesh) Client(tb testing.TB, opts ...mesh.ClientOption) *mesh.Client {
	return m.client(tb, m.WS, opts...)
}

// HTTPClient returns a JSON-RPC-over-HTTP client of the hub.
func (m *Mesh) HTTPClient(tb testing.TB, opts ...mesh.ClientOption) *mesh.Client {
	return m.client(tb, m.HTTP, opts...)
}

func (m *Mesh) client(tb testing.TB, url string, opts ...mesh.ClientOption) *mesh.Client {
	tb.Helper()
	c, err := mesh.NewClient([]string{url}, opts...)
	if err != nil {
		tb.Fatalf("NewClient: %v", err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// WaitFor polls cond every 5 ms until it holds or d passes (then fails).
func WaitFor(tb testing.TB, d time.Duration, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("condition not met within %v", d)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// StartCluster runs a hub with reg as its registry (an etcd registry for a
// cluster), advertising its own loopback address to its peers, with opts
// (telemetry, a logger) besides. reg is closed when the test ends.
func StartCluster(tb testing.TB, cfg hub.Config, reg registry.Registry, opts ...hub.Option) *Mesh {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("listen: %v", err)
	}
	cfg.Advertise = ln.Addr().String()
	return StartClusterOn(tb, cfg, reg, ln, opts...)
}

// StartClusterOn is StartCluster on a listener of the caller's, keeping
// cfg.Advertise (e.g. a fault proxy in front of ln). Like Start, no
// warm-up unless cfg sets one.
func StartClusterOn(tb testing.TB, cfg hub.Config, reg registry.Registry, ln net.Listener, opts ...hub.Option) *Mesh {
	tb.Helper()
	cfg = noWarmUp(cfg)
	h, err := hub.New(cfg, append([]hub.Option{hub.WithRegistry(reg)}, opts...)...)
	if err == nil {
		all.Mount(h)
	}
	if err != nil {
		tb.Fatalf("NewHub: %v", err)
	}
	tb.Cleanup(func() { _ = reg.Close() })
	return serveCfg(tb, h, ln, cfg)
}

// noWarmUp turns the warm-up off unless cfg sets one (see Start).
func noWarmUp(cfg hub.Config) hub.Config {
	if cfg.WarmUp == 0 {
		cfg.WarmUp = -1
	}
	return cfg
}
