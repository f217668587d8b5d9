package hub_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/envelope/binframe"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
)

// TestBinaryLinksNegotiated: an SDK client and agent speak the binary
// frames (agentmesh.v2) with the hub; one that offers only agentmesh.v1
// speaks JSON; and calls pass between the two in every direction.
func TestBinaryLinksNegotiated(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	m.RunAgent(t, agents.NewEcho())
	v2, err := link.Dial(t.Context(), m.WS, link.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer v2.Close()
	v1, err := link.Dial(t.Context(), m.WS, link.Config{JSONFrames: true})
	if err != nil {
		t.Fatal(err)
	}
	defer v1.Close()
	if !v2.Binary() || v1.Binary() {
		t.Fatalf("binary: default %v, JSONFrames %v", v2.Binary(), v1.Binary())
	}
	for _, l := range []*link.Link{v2, v1} {
		res, err := l.Call(t.Context(), &envelope.Request{Method: "echo.echo", Params: json.RawMessage(`{"s":"héllo","n":[1,2.5]}`)})
		if err != nil || string(res.Result) != `{"s":"héllo","n":[1,2.5]}` {
			t.Errorf("binary %v: %s, %v", l.Binary(), res.Result, err)
		}
	}
	// A v1-only agent, called by a binary client.
	stop := m.RunAgent(t, agents.NewEcho(agents.WithConnConfig(link.Config{JSONFrames: true})))
	defer stop()
	c := m.Client(t)
	for range 20 { // the balancer spreads them over both agents
		var out json.RawMessage
		if err := c.Call(t.Context(), "echo.echo", json.RawMessage(`[true,null,"é"]`), &out); err != nil || string(out) != `[true,null,"é"]` {
			t.Fatalf("%s, %v", out, err)
		}
	}
}

// TestBinaryBodiesChecked: the hub passes params and results between
// binary links as they came, unchecked, so each end checks what it
// decodes: params that are not JSON are refused PARSE_ERROR naming them,
// by the binary agent's SDK or, for a JSON agent, by the hub before they
// reach it; a result that is not JSON fails the call INTERNAL for a
// binary client (its SDK), a JSON client and a plain JSON-RPC caller (the
// hub). Each link stays usable.
func TestBinaryBodiesChecked(t *testing.T) {
	for _, agentV1 := range []bool{false, true} {
		m := meshtest.Start(t, hub.Config{})
		m.RunAgent(t, agents.NewEcho(agents.WithConnConfig(link.Config{JSONFrames: agentV1})))
		d := websocket.Dialer{Subprotocols: []string{envelope.SubprotocolV2}}
		ws, _, err := d.DialContext(t.Context(), m.WS, nil)
		if err != nil {
			t.Fatal(err)
		}
		call := func(seq uint64, params string) envelope.Frame {
			t.Helper()
			msg := binframe.AppendRequest(nil, seq, &envelope.Request{ID: "x", Method: "echo.echo", Params: json.RawMessage(params)})
			if err := ws.WriteMessage(websocket.BinaryMessage, msg); err != nil {
				t.Fatal(err)
			}
			_ = ws.SetReadDeadline(time.Now().Add(5 * time.Second))
			typ, data, err := ws.ReadMessage()
			if err != nil || typ != websocket.BinaryMessage {
				t.Fatalf("agent v1 %v: read %d, %v", agentV1, typ, err)
			}
			var got envelope.Frame
			binframe.Each(data, envelope.Limits{}, true, new(envelope.Frame), func(f *envelope.Frame, e *envelope.Error) {
				if e != nil {
					t.Fatalf("undecodable answer: %v", e)
				}
				got = *f
			})
			return got
		}
		for i, bad := range []string{`{"a":`, "[\"\xff\"]", strings.Repeat("[", 100) + strings.Repeat("]", 100)} {
			f := call(uint64(10+i), bad)
			if f.Seq != uint64(10+i) || f.Err == nil || (f.Err.Code != envelope.CodeParseError && f.Err.Code != envelope.CodeInvalidRequest) || !strings.Contains(f.Err.Message, "params") {
				t.Errorf("agent v1 %v: params %.20q answered %+v", agentV1, bad, f.Err)
			}
		}
		if f := call(20, `{"ok":1}`); f.Err != nil || string(f.Response.Result) != `{"ok":1}` {
			t.Errorf("agent v1 %v: after the refusals: %s %v", agentV1, f.Response.Result, f.Err)
		}
		ws.Close()
	}

	// An agent (binary) whose results are not JSON.
	m := meshtest.Start(t, hub.Config{})
	l, err := link.Dial(t.Context(), m.WS, link.Config{}, link.WithHandler(
		func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
			if string(req.Params) == `["good"]` {
				return &envelope.Response{Result: json.RawMessage(`"fine"`)}, nil
			}
			return &envelope.Response{Result: json.RawMessage(`{"x":`)}, nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	reg, _ := json.Marshal(control.RegisterParams{AgentID: "bad-result-1", Capabilities: []string{"bad.result"}})
	if _, err := l.Call(t.Context(), &envelope.Request{Method: "agent.register", Params: reg}); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*mesh.Client{
		"binary client":   m.Client(t, mesh.WithoutReliability()),
		"JSON client":     m.Client(t, mesh.WithoutReliability(), mesh.WithConnConfig(link.Config{JSONFrames: true})),
		"JSON-RPC client": m.HTTPClient(t, mesh.WithoutReliability()),
	} {
		err := c.Call(t.Context(), "bad.result", []string{"bad"}, nil, mesh.CallTimeout(10*time.Second))
		if envelope.CodeOf(err) != envelope.CodeInternal || !strings.Contains(err.Error(), "result") {
			t.Errorf("%s: %v; want INTERNAL naming the result", name, err)
		}
		var out string
		if err := c.Call(t.Context(), "bad.result", []string{"good"}, &out); err != nil || out != "fine" {
			t.Errorf("%s: after it: %q, %v", name, out, err)
		}
	}
}

// TestDamagedBinaryMessageClosesLink: a binary message whose frames do
// not fill it (a stream damaged on the way: a peer link through a lossy
// proxy, S07) is not answered from its seq, which cannot be trusted: the
// link is closed 1007, so that its calls fail over at once.
func TestDamagedBinaryMessageClosesLink(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	m.RunAgent(t, agents.NewEcho())
	d := websocket.Dialer{Subprotocols: []string{envelope.SubprotocolV2}}
	ws, _, err := d.DialContext(t.Context(), m.WS, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	msg := binframe.AppendRequest(nil, 7, &envelope.Request{ID: "x", Method: "echo.echo", Params: json.RawMessage(`[1]`)})
	msg = append(msg, 0, 0) // two bytes past the frame: not a frame
	if err := ws.WriteMessage(websocket.BinaryMessage, msg); err != nil {
		t.Fatal(err)
	}
	_ = ws.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, r, err := ws.ReadMessage()
	var ce *websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.CloseInvalidFramePayloadData {
		t.Fatalf("got %x, %v; want the link closed 1007", r, err)
	}
}
