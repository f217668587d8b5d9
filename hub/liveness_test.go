package hub_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/telemetry"
)

// counter returns the value of the counter name (0 if absent).
func counter(t *testing.T, m *telemetry.Metrics, name string) float64 {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			var sum float64
			for _, s := range f.Metric {
				sum += s.GetCounter().GetValue()
			}
			return sum
		}
	}
	return 0
}

// TestLateResponseDropped: an agent that answers after the caller gave up
// (its handler ignores the deadline, as a frozen process would) has its
// answer dropped by the hub and counted in agentmesh_late_responses_total;
// the next call gets its own answer, not the late one.
func TestLateResponseDropped(t *testing.T) {
	metrics := telemetry.NewMetrics(nil)
	m := meshtest.Start(t, hub.Config{}, hub.WithTelemetry(telemetry.New(nil, metrics)))
	a := agents.New("slow")
	a.Handle("slow.echo", func(_ context.Context, p json.RawMessage) (any, error) {
		var in struct{ Sleep int }
		_ = json.Unmarshal(p, &in)
		time.Sleep(time.Duration(in.Sleep) * time.Millisecond) // deaf to the deadline
		return p, nil
	})
	m.RunAgent(t, a)
	c := m.Client(t, mesh.WithoutReliability())

	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	err := c.Call(ctx, "slow.echo", map[string]int{"Sleep": 300, "N": 1}, nil)
	cancel()
	if code := envelope.CodeOf(err); code != envelope.CodeTimeout && code != envelope.CodeCancelled {
		t.Fatalf("call past its deadline: %v; want TIMEOUT", err)
	}
	meshtest.WaitFor(t, 3*time.Second, func() bool { return counter(t, metrics, "agentmesh_late_responses_total") == 1 })

	var got map[string]int
	if err := c.Call(t.Context(), "slow.echo", map[string]int{"Sleep": 0, "N": 2}, &got); err != nil || got["N"] != 2 {
		t.Fatalf("next call: %v %v; want its own answer N=2", got, err)
	}
	time.Sleep(100 * time.Millisecond)
	if n := counter(t, metrics, "agentmesh_late_responses_total"); n != 1 {
		t.Errorf("agentmesh_late_responses_total = %v after an on-time call; want 1", n)
	}
}

// TestLinkLateResponses: Link.LateResponses counts answers to calls that
// had given up, on the calling side of a link.
func TestLinkLateResponses(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	a := agents.New("slow")
	a.Handle("slow.wait", func(context.Context, json.RawMessage) (any, error) {
		time.Sleep(200 * time.Millisecond)
		return "late", nil
	})
	m.RunAgent(t, a)
	l, err := link.Dial(t.Context(), m.WS, link.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := range 3 {
		// Cancelled, not timed out: no ttl travels, so the hub cannot
		// answer TIMEOUT on its own just in time.
		ctx, cancel := context.WithCancel(t.Context())
		stop := time.AfterFunc(20*time.Millisecond, cancel)
		_, err := l.Call(ctx, &envelope.Request{ID: envelope.NewID(), Method: "slow.wait"})
		stop.Stop()
		cancel()
		if envelope.CodeOf(err) != envelope.CodeCancelled {
			t.Fatalf("call %d: %v; want CANCELLED", i, err)
		}
	}
	// The hub answers each given-up call once told to cancel (CANCELLED),
	// after the caller stopped waiting: three late responses here.
	deadline := time.Now().Add(3 * time.Second)
	for l.LateResponses() != 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := l.LateResponses(); n != 3 {
		t.Fatalf("LateResponses() = %d; want 3", n)
	}
	if l.Pending() != 0 {
		t.Errorf("%d calls still pending", l.Pending())
	}
}

// TestHalfOpenPeerDeclaredDead: a peer whose TCP connection stays open but
// that never answers a ping (it reads nothing) is closed by the hub after
// two missed pings, not at TCP's own timeout.
func TestHalfOpenPeerDeclaredDead(t *testing.T) {
	const ping = 100 * time.Millisecond
	m := meshtest.Start(t, hub.Config{Conn: link.Config{PingInterval: ping}})
	d := websocket.Dialer{Subprotocols: []string{envelope.Subprotocol}}
	ws, _, err := d.DialContext(t.Context(), m.WS, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	opened := time.Now()
	// Read raw bytes under gorilla, so that no pong is ever sent: the
	// pings pile up unanswered until the hub gives up and closes.
	raw := ws.UnderlyingConn()
	_ = raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4096)
	for {
		if _, err := raw.Read(buf); err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatal("the hub kept a peer that answers no ping for 5s")
			}
			break
		}
	}
	dead := time.Since(opened)
	t.Logf("half-open peer closed %v after the link opened (ping %v)", dead.Round(time.Millisecond), ping)
	if dead < 2*ping-20*time.Millisecond || dead > 2*ping+300*time.Millisecond {
		t.Errorf("closed after %v; want about 2 missed pings (%v)", dead, 2*ping)
	}
}

// TestPingAbuse: a client pinging 20 times a second is closed with 1008
// "too many pings" within 5 s and counted; a well-behaved link on the same
// hub keeps working meanwhile.
func TestPingAbuse(t *testing.T) {
	metrics := telemetry.NewMetrics(nil)
	m := meshtest.Start(t, hub.Config{}, hub.WithTelemetry(telemetry.New(nil, metrics)))
	m.RunAgent(t, agents.NewEcho())
	good := m.Client(t, mesh.WithoutReliability())
	stopGood := keepCalling(t, good)

	for _, proto := range []string{envelope.Subprotocol, "jsonrpc"} {
		t.Run(proto, func(t *testing.T) {
			before := counter(t, metrics, "agentmesh_link_ping_abuse_total")
			d := websocket.Dialer{Subprotocols: []string{proto}}
			ws, _, err := d.DialContext(t.Context(), m.WS, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer ws.Close()
			closed := make(chan error, 1)
			go func() {
				for {
					if _, _, err := ws.ReadMessage(); err != nil {
						closed <- err
						return
					}
				}
			}()
			start := time.Now()
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			var err2 error
		loop:
			for {
				select {
				case err2 = <-closed:
					break loop
				case <-tick.C:
					if time.Since(start) > 5*time.Second {
						t.Fatal("a client pinging 20/s still connected after 5s")
					}
					_ = ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(time.Second))
				}
			}
			took := time.Since(start)
			t.Logf("%s: pinging 20/s closed after %v: %v", proto, took.Round(time.Millisecond), err2)
			if !websocket.IsCloseError(err2, websocket.ClosePolicyViolation) {
				t.Errorf("closed with %v; want close 1008 (policy violation)", err2)
			}
			if got := counter(t, metrics, "agentmesh_link_ping_abuse_total"); got != before+1 {
				t.Errorf("agentmesh_link_ping_abuse_total = %v; want %v", got, before+1)
			}
		})
	}
	ok, failed := stopGood()
	if failed != 0 || ok == 0 {
		t.Errorf("the well-behaved client: %d ok, %d failed during the abuse; want all ok", ok, failed)
	}
}
