package hub_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/telemetry"
)

// invalidFrames reads agentmesh_link_invalid_frames_total{outcome}.
func invalidFrames(t *testing.T, m *telemetry.Metrics, outcome string) float64 {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "agentmesh_link_invalid_frames_total" {
			continue
		}
		for _, s := range f.Metric {
			for _, lp := range s.Label {
				if lp.GetName() == "outcome" && lp.GetValue() == outcome {
					return s.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestInvalidNativeFrameAnswered: a native request frame that fails the
// message-level checks (invalid UTF-8, nesting too deep, broken JSON) is
// answered at once with its coded error when its seq can be read from
// its head, and counted; the link stays usable. A frame that names no
// seq closes the link with 1007, so that its sender fails fast.
func TestInvalidNativeFrameAnswered(t *testing.T) {
	met := telemetry.NewMetrics(nil)
	m := meshtest.Start(t, hub.Config{}, hub.WithTelemetry(telemetry.New(nil, met)))
	m.RunAgent(t, agents.NewEcho())
	d := websocket.Dialer{Subprotocols: []string{envelope.Subprotocol}}
	ws, _, err := d.DialContext(t.Context(), m.WS, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	deep := strings.Repeat("[", 10_001) + strings.Repeat("]", 10_001)
	cases := []struct {
		name  string
		frame string
		seq   uint64
		code  envelope.Code
	}{
		{"invalid UTF-8 in params", "{\"type\":\"req\",\"seq\":7,\"id\":\"a\",\"method\":\"echo.echo\",\"params\":[\"\xff\xfe\"],\"headers\":{},\"version\":\"1.0\"}", 7, envelope.CodeParseError},
		{"nesting 10001", `{"type":"req","seq":8,"id":"b","method":"echo.echo","params":` + deep + `,"headers":{},"version":"1.0"}`, 8, envelope.CodeInvalidRequest},
		{"seq before type, truncated", `{"seq":9,"type":"req","id":"c","method":"echo.echo","params":["x`, 9, envelope.CodeParseError},
		{"invalid UTF-8 in a key", "{\"type\":\"req\",\"seq\":10,\"\xff\":1,\"method\":\"echo.echo\",\"headers\":{},\"version\":\"1.0\"}", 10, envelope.CodeParseError},
	}
	for _, tc := range cases {
		start := time.Now()
		if err := ws.WriteMessage(websocket.TextMessage, []byte(tc.frame)); err != nil {
			t.Fatal(err)
		}
		_ = ws.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, r, err := ws.ReadMessage()
		took := time.Since(start)
		if err != nil {
			t.Fatalf("%s: no answer: %v", tc.name, err)
		}
		var f struct {
			Type  string
			Seq   uint64
			Error *struct{ Code string }
		}
		if err := json.Unmarshal(r, &f); err != nil || f.Type != "res" || f.Seq != tc.seq || f.Error == nil || f.Error.Code != tc.code.String() {
			t.Errorf("%s: answer %.200q; want a response to seq %d with %s", tc.name, r, tc.seq, tc.code)
		}
		if took > time.Second {
			t.Errorf("%s: answered after %v; want at once", tc.name, took)
		}
	}
	if got := invalidFrames(t, met, "answered"); got != float64(len(cases)) {
		t.Errorf("invalid frames answered counted %v; want %d", got, len(cases))
	}
	// The link still serves.
	if err := ws.WriteMessage(websocket.TextMessage, []byte(`{"type":"req","seq":11,"id":"ok","method":"echo.echo","params":["ok"],"headers":{},"version":"1.0"}`)); err != nil {
		t.Fatal(err)
	}
	if _, r, err := ws.ReadMessage(); err != nil || !strings.Contains(string(r), `"seq":11`) || !strings.Contains(string(r), `["ok"]`) {
		t.Fatalf("after the invalid frames: %v %.200q; want the answer to seq 11", err, r)
	}

	// Nothing to answer: closed with 1007, at once.
	for _, junk := range []string{"\xff\xfe", `{"type":"req","seq":12,"seq":13,"params":["` + "\xff" + `"]}`, `[{"type":"req","seq":14,"params":["` + "\xff" + `"]}]`} {
		ws, _, err := d.DialContext(t.Context(), m.WS, nil)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		if err := ws.WriteMessage(websocket.TextMessage, []byte(junk)); err != nil {
			t.Fatal(err)
		}
		_ = ws.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, r, err := ws.ReadMessage()
		if !websocket.IsCloseError(err, websocket.CloseInvalidFramePayloadData) {
			t.Errorf("frame %q: got %v %.100q; want close 1007", junk, err, r)
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("frame %q: closed after %v; want at once", junk, took)
		}
		ws.Close()
	}
	if got := invalidFrames(t, met, "closed"); got != 3 {
		t.Errorf("invalid frames closed counted %v; want 3", got)
	}
}

// TestInvalidNativeResponseFailsCall: an agent whose answer fails the
// message-level checks (here invalid UTF-8 in its result) has the call
// it answers fail at once with INTERNAL, not at the caller's timeout.
func TestInvalidNativeResponseFailsCall(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	l, err := link.Dial(t.Context(), m.WS, link.Config{}, link.WithHandler(
		func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
			return &envelope.Response{Result: json.RawMessage("\"\xff\xfe\"")}, nil
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	reg, _ := json.Marshal(control.RegisterParams{AgentID: "bad-utf8-1", Capabilities: []string{"bad.utf8"}})
	if _, err := l.Call(t.Context(), &envelope.Request{Method: "agent.register", Params: reg}); err != nil {
		t.Fatal(err)
	}
	c := m.Client(t)
	start := time.Now()
	err = c.Call(t.Context(), "bad.utf8", nil, nil, mesh.CallTimeout(10*time.Second))
	if took := time.Since(start); took > time.Second {
		t.Errorf("call failed after %v; want at once, not at its 10 s timeout", took)
	}
	if envelope.CodeOf(err) != envelope.CodeInternal {
		t.Errorf("call error = %v; want INTERNAL", err)
	}
}
