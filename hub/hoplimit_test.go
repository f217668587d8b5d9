package hub_test

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/registry"
	"github.com/agentmesh/agentmesh/registry/etcd"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
	"github.com/agentmesh/agentmesh/reliability"
	"github.com/agentmesh/agentmesh/telemetry"
)

// hopAgent serves hop.run and counts how many times its handler ran.
func hopAgent(id string, ran *atomic.Int64) *agents.Agent {
	a := agents.New("hop", agents.WithID(id))
	a.Handle("hop.run", func(ctx context.Context, p json.RawMessage) (any, error) {
		ran.Add(1)
		return "ran on " + id, nil
	})
	return a
}

// hubMetrics makes metrics for a hub that does not exist yet: the labeler
// asks the hub once it is set.
func hubMetrics() (*telemetry.Metrics, **hub.Hub) {
	var h *hub.Hub
	return telemetry.NewMetrics(telemetry.NewLabeler(func(m string) bool { return h != nil && h.KnownMethod(m) })), &h
}

// served returns how many calls of method the hub's server side saw, any
// outcome (its server duration histogram's count).
func served(t *testing.T, m *telemetry.Metrics, method string) uint64 {
	t.Helper()
	var n uint64
	for k, v := range callCounts(t, m) {
		if strings.HasPrefix(k, "server "+method+" ") {
			n += v
		}
	}
	return n
}

// TestHopLimitRawPeerRequest: a request that says it already crossed a
// peer link (Hops = 1), sent to hub B over a raw link, for an instance
// that B's registry (rightly) places on hub A, is answered UNAVAILABLE,
// marked not sent, at once; B never forwards it, so the agent on A never
// runs it. The same request with Hops = 0 is forwarded and runs: the hop
// count alone makes the difference.
func TestHopLimitRawPeerRequest(t *testing.T) {
	srv := etcdtest.Start(t)
	newReg := func() *etcd.Registry {
		reg, err := etcd.New(etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: "/hoplimit-raw/"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return reg
	}
	a := meshtest.StartCluster(t, hub.Config{ID: "hub-A"}, newReg())
	mb, hb := hubMetrics()
	b := meshtest.StartCluster(t, hub.Config{ID: "hub-B"}, newReg(), hub.WithTelemetry(telemetry.New(nil, mb)))
	*hb = b.Hub
	var ran atomic.Int64
	a.RunAgent(t, hopAgent("hop-on-a", &ran))
	meshtest.WaitFor(t, 10*time.Second, func() bool {
		in := b.Hub.Registry().Snapshot().Instance("hop-on-a")
		return in != nil && in.Hub == "hub-A" && in.HubAddr == a.Addr
	})

	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	l, err := link.Dial(ctx, b.WS, link.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	call := func(dest string, hops int) (time.Duration, error) {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		req := &envelope.Request{ID: envelope.NewID(), Method: "hop.run", Destination: dest, Params: json.RawMessage(`{}`),
			Timestamp: time.Now().UnixMilli()}
		req.Headers.Hops = hops
		start := time.Now()
		_, err := l.Call(cctx, req)
		return time.Since(start), err
	}

	for _, dest := range []string{"hop-on-a", ""} { // named, and picked by B's balancer
		took, err := call(dest, 1)
		t.Logf("Hops=1, destination %q: %v after %v", dest, err, took)
		e := envelope.AsError(err)
		if envelope.CodeOf(err) != envelope.CodeUnavailable || !e.NotSent() {
			t.Errorf("Hops=1, destination %q: %v; want UNAVAILABLE marked not sent", dest, err)
		}
		if err != nil && !strings.Contains(e.Message, "already crossed a peer link") {
			t.Errorf("Hops=1, destination %q: message %q; want the hop limit's", dest, e.Message)
		}
		if took > 5*time.Second {
			t.Errorf("Hops=1, destination %q: answered after %v; want at once, not at the deadline", dest, took)
		}
	}
	// An instance B does not know at all, with Hops = 1: the origin hub
	// saw it on B, so it has just left; not sent, for the origin to retry
	// elsewhere (from a client, Hops = 0, it is AGENT_NOT_FOUND).
	if took, err := call("gone-from-b", 1); envelope.CodeOf(err) != envelope.CodeUnavailable || !envelope.AsError(err).NotSent() {
		t.Errorf("Hops=1 to an instance B does not know: %v after %v; want UNAVAILABLE marked not sent", err, took)
	}
	if took, err := call("gone-from-b", 0); envelope.CodeOf(err) != envelope.CodeAgentNotFound {
		t.Errorf("Hops=0 to an instance B does not know: %v after %v; want AGENT_NOT_FOUND", err, took)
	}
	// Nothing reaches the agent, even late (a forward in flight would land
	// within this wait).
	time.Sleep(300 * time.Millisecond)
	if n := ran.Load(); n != 0 {
		t.Fatalf("the agent on A ran %d requests that crossed a peer link to B; want 0 (never forwarded again)", n)
	}
	if n := served(t, mb, "hop.run"); n != 4 {
		t.Errorf("hub B served hop.run %d times; want 4 (the raw requests, nothing looping back)", n)
	}

	// Control: the same request as from a client (Hops = 0) is forwarded
	// by B to A and runs once.
	if took, err := call("hop-on-a", 0); err != nil {
		t.Fatalf("Hops=0 through B: %v after %v; want B to forward it to A", err, took)
	}
	if n := ran.Load(); n != 1 {
		t.Errorf("the agent ran %d times after the Hops=0 call; want 1", n)
	}
}

// skewed is a registry whose snapshots place one instance on another hub
// than the one it is attached to: a stale or wrong view, as a hub has
// while etcd's watch lags behind an agent moving between hubs.
type skewed struct {
	registry.Registry
	instance string
	where    atomic.Pointer[[2]string] // hub id and address this view says the instance is on
	rewrites atomic.Int64
}

func newSkewed(inner registry.Registry, instance, hb, hubAddr string) *skewed {
	s := &skewed{Registry: inner, instance: instance}
	s.where.Store(&[2]string{hb, hubAddr})
	return s
}

func (s *skewed) Snapshot() *registry.Snapshot {
	src := s.Registry.Snapshot()
	ins := src.Instances()
	out := make([]*registry.Instance, 0, len(ins))
	for _, in := range ins {
		if in.InstanceID == s.instance {
			r := in.Registration
			w := s.where.Load()
			r.Hub, r.HubAddr = w[0], w[1]
			in = registry.NewInstance(r, in.RegisteredAt)
			s.rewrites.Add(1)
		}
		out = append(out, in)
	}
	return registry.NewSnapshot(src.Rev, out, nil)
}

// TestHopLimitStopsPeerLoop: three hubs on one etcd; the agent is attached
// to C, but A's view places it on B and B's view places it on A. A client
// on A calls it: A forwards to B (its view), B would send it back to A
// (its view), and so on until the deadline. The hop limit stops this at
// B: the call ends UNAVAILABLE long before its deadline, B serves only A's
// attempts (no request comes back to A from B), and the agent never runs
// it. With the views agreeing again (C's own), the same call runs once.
func TestHopLimitStopsPeerLoop(t *testing.T) {
	srv := etcdtest.Start(t)
	newReg := func() *etcd.Registry {
		reg, err := etcd.New(etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: "/hoplimit-loop/"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return reg
	}
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}
	lnA, lnB := listen(), listen()
	addrA, addrB := lnA.Addr().String(), lnB.Addr().String()
	regA := newSkewed(newReg(), "hop-on-c", "hub-B", addrB)
	regB := newSkewed(newReg(), "hop-on-c", "hub-A", addrA)
	ma, ha := hubMetrics()
	mb, hb := hubMetrics()
	// No retries at the hubs: each attempt of A is one request to B, so
	// that B's count says whether anything looped.
	rc := reliability.DefaultConfig()
	rc.Policies["hop.*"] = reliability.Policy{Timeout: 10 * time.Second}
	a := meshtest.StartClusterOn(t, hub.Config{ID: "hub-A", Advertise: addrA, Reliability: &rc}, regA, lnA, hub.WithTelemetry(telemetry.New(nil, ma)))
	b := meshtest.StartClusterOn(t, hub.Config{ID: "hub-B", Advertise: addrB, Reliability: &rc}, regB, lnB, hub.WithTelemetry(telemetry.New(nil, mb)))
	*ha, *hb = a.Hub, b.Hub
	c := meshtest.StartCluster(t, hub.Config{ID: "hub-C"}, newReg())
	var ran atomic.Int64
	c.RunAgent(t, hopAgent("hop-on-c", &ran))
	meshtest.WaitFor(t, 10*time.Second, func() bool {
		ia, ib := a.Hub.Registry().Snapshot().Instance("hop-on-c"), b.Hub.Registry().Snapshot().Instance("hop-on-c")
		return ia != nil && ib != nil && ia.Hub == "hub-B" && ib.Hub == "hub-A"
	})

	cl := a.Client(t, mesh.WithoutReliability())
	for _, dest := range []string{"", "hop-on-c"} { // picked by A's balancer, and named
		beforeA, beforeB := served(t, ma, "hop.run"), served(t, mb, "hop.run")
		start := time.Now()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		err := cl.Call(ctx, "hop.run", nil, nil, mesh.To(dest))
		cancel()
		took := time.Since(start)
		// Let anything still bouncing between the hubs show in the counts.
		time.Sleep(300 * time.Millisecond)
		dA, dB := served(t, ma, "hop.run")-beforeA, served(t, mb, "hop.run")-beforeB
		t.Logf("destination %q: %v after %v; hub A served %d, hub B served %d", dest, err, took, dA, dB)
		if envelope.CodeOf(err) != envelope.CodeUnavailable {
			t.Errorf("destination %q: %v; want UNAVAILABLE (the hop limit), not a loop to the deadline", dest, err)
		}
		if took > 5*time.Second {
			t.Errorf("destination %q: answered after %v; want well before the 10 s deadline", dest, took)
		}
		if dA != 1 || dB != 1 {
			t.Errorf("destination %q: hub A served %d, hub B %d; want 1 each (client → A → B, and no further)", dest, dA, dB)
		}
	}
	if n := ran.Load(); n != 0 {
		t.Fatalf("the agent ran %d of the looping calls; want 0", n)
	}
	if regA.rewrites.Load() == 0 || regB.rewrites.Load() == 0 {
		t.Fatal("the skewed views were never read: the test did not build the disagreement")
	}

	// Control: A's view corrected (the instance on C, as etcd says), the
	// call runs once.
	regA.where.Store(&[2]string{"hub-C", c.Addr})
	if err := cl.Call(t.Context(), "hop.run", nil, nil); err != nil {
		t.Fatalf("with A's view corrected: %v", err)
	}
	if n := ran.Load(); n != 1 {
		t.Errorf("the agent ran %d times after the corrected call; want 1", n)
	}
}
