package hub_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/faultproxy"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/registry/etcd"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
)

// TestPeerLinkBlackholedThenHealed: hub C advertises a fault proxy, so
// A's peer link to C crosses it. With the proxy blackholed (sockets open,
// no bytes: TCP notices nothing) the call in flight to C fails with
// UNAVAILABLE once the peer heartbeat gives up (200 ms ping, dead after
// 500 ms), not at its 10 s timeout; the next calls fail at once, marked
// not sent; after heal the link is dialled again without any call's help
// and calls succeed.
func TestPeerLinkBlackholedThenHealed(t *testing.T) {
	cl, proxy := peerThroughProxy(t)

	proxy.Blackhole()
	start := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	err := cl.Call(ctx, "echo.sleep", map[string]int{"ms": 50}, nil)
	cancel()
	took := time.Since(start)
	t.Logf("call in flight on the blackholed peer link: %v after %v", err, took)
	if envelope.CodeOf(err) != envelope.CodeUnavailable || took < 300*time.Millisecond || took > 2*time.Second {
		t.Errorf("call in flight = %v after %v; want UNAVAILABLE at detection (about 500 ms)", err, took)
	}
	start = time.Now()
	err = cl.Call(t.Context(), "echo.echo", 1, nil)
	var e *envelope.Error
	if envelope.CodeOf(err) != envelope.CodeUnavailable || time.Since(start) > 100*time.Millisecond {
		t.Errorf("call while the peer is down = %v after %v; want UNAVAILABLE at once", err, time.Since(start))
	} else if e = envelope.AsError(err); !e.NotSent() {
		t.Errorf("call while the peer is down = %v; want it marked not sent", err)
	}

	proxy.Unblackhole()
	// Without a call, the background re-dial brings the link back within
	// its backoff (at most 1 s) and a dial: a call then succeeds at its
	// first try (while the peer is down it would fail at once).
	time.Sleep(1500 * time.Millisecond)
	if err := cl.Call(t.Context(), "echo.echo", "healed", nil); err != nil {
		t.Errorf("first call 1.5 s after heal: %v; want the link re-dialled by then", err)
	}
}

// TestPeerLinkStallDoesNotOpenBreakers: calls that run out of time on a
// stalled peer link (blackholed: it reads nothing, not even pongs) fail
// with TIMEOUT, but the agent behind the peer is not to blame: its
// breaker on the origin hub stays closed, and once the path heals the
// agent answers at once. Six calls time out together on the stall, more
// than the breaker's five consecutive failures; before, they opened it
// for its 30 s recovery timeout (CI's lab S07b under 5 % loss: a 2.5 s
// stall of the cross-hub link, then 30 s of CIRCUIT_OPEN).
func TestPeerLinkStallDoesNotOpenBreakers(t *testing.T) {
	cl, proxy := peerThroughProxy(t)

	proxy.Blackhole()
	errs := make(chan error, 6)
	for range 6 {
		go func() {
			ctx, cancel := context.WithTimeout(t.Context(), 400*time.Millisecond)
			defer cancel()
			errs <- cl.Call(ctx, "echo.echo", "stalled", nil)
		}()
	}
	for range 6 {
		if err := <-errs; envelope.CodeOf(err) != envelope.CodeTimeout {
			t.Errorf("call on the stalled peer link = %v; want TIMEOUT", err)
		}
	}
	if st := breakerState(t, cl, "echo.echo", "echo-c"); st == "open" {
		t.Errorf("breaker of echo-c for echo.echo on hub A is %q after timeouts on a stalled peer link; want it not open", st)
	}

	proxy.Unblackhole()
	// The link was found dead at 500 ms; the background re-dial brings
	// it back within its backoff, and the agent answers.
	meshtest.WaitFor(t, 5*time.Second, func() bool { return cl.Call(t.Context(), "echo.echo", "healed", nil) == nil })
	if st := breakerState(t, cl, "echo.echo", "echo-c"); st != "" && st != "closed" {
		t.Errorf("breaker of echo-c for echo.echo on hub A is %q after the heal; want closed", st)
	}
}

// breakerState is the state mesh.breakers lists for (method, instance),
// "" when it lists none.
func breakerState(t *testing.T, cl *mesh.Client, method, instance string) string {
	t.Helper()
	var list []struct{ Method, Instance, State string }
	if err := cl.Call(t.Context(), "mesh.breakers", nil, &list); err != nil {
		t.Fatalf("mesh.breakers: %v", err)
	}
	for _, b := range list {
		if b.Method == method && b.Instance == instance {
			return b.State
		}
	}
	return ""
}

// peerThroughProxy starts hubs A and C over one etcd, C advertising a
// fault proxy (so A's peer link to C crosses it) and serving the echo
// agent echo-c, A's peer heartbeat 200 ms (stalled after 325 ms of
// silence, dead after 500 ms); it returns a client of A, without
// reliability, that has called echo-c once, and the proxy.
func peerThroughProxy(t *testing.T) (*mesh.Client, *faultproxy.Proxy) {
	t.Helper()
	srv := etcdtest.Start(t)
	newReg := func() *etcd.Registry {
		reg, err := etcd.New(etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: "/peer/"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return reg
	}
	a := meshtest.StartCluster(t, hub.Config{ID: "hub-A", PeerHeartbeat: 200 * time.Millisecond}, newReg())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := faultproxy.New(t.Context(), ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	c := meshtest.StartClusterOn(t, hub.Config{ID: "hub-C", Advertise: proxy.Addr()}, newReg(), ln)
	c.RunAgent(t, agents.NewEcho(agents.WithID("echo-c")))
	meshtest.WaitFor(t, 5*time.Second, func() bool { return a.Hub.Registry().Snapshot().Instance("echo-c") != nil })
	cl := a.Client(t, mesh.WithoutReliability())
	if err := cl.Call(t.Context(), "echo.echo", "through the proxy", nil); err != nil {
		t.Fatalf("call through the peer link: %v", err)
	}
	return cl, proxy
}
