package hub_test

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/telemetry"
)

// lockedBuf is a log sink safe for the hub's goroutines.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestSecretsNeverRecorded: credentials — the bearer token of a link's
// upgrade, of an HTTP request, and a token carried in a frame's
// headers.authToken — appear in no span (name, attributes, events,
// status), no log line (debug level, failures included) and no metric,
// and never reach the agent; calls that fail are logged and traced like
// the others, without them.
func TestSecretsNeverRecorded(t *testing.T) {
	exp, tp := testkit.Tracing(t, "hub")
	metrics := telemetry.NewMetrics(nil)
	logs := &lockedBuf{}
	log := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	m := meshtest.Start(t, hub.Config{HeartbeatInterval: time.Second, Security: &hub.Security{Key: testkit.TestKey}},
		hub.WithTelemetry(telemetry.New(tp, metrics)), hub.WithLogger(log))
	var n atomic.Int64
	agentTok := testkit.Token(t, auth.Claims{Subject: "echo", Serve: []string{"echo.*"}}, time.Hour)
	m.RunAgent(t, testkit.CountingAgent("echo", &n, agentTok, "echo.echo"))

	linkTok := testkit.Token(t, auth.Claims{Subject: "link-caller"}, time.Hour)
	httpTok := testkit.Token(t, auth.Claims{Subject: "http-caller"}, time.Hour)
	frameTok := testkit.Token(t, auth.Claims{Subject: "frame-caller"}, time.Hour)
	adminTok := testkit.Token(t, auth.Claims{Subject: "ops", Roles: []string{auth.RoleAdmin}}, time.Hour)
	secrets := map[string]string{"agent": agentTok, "link": linkTok, "http": httpTok, "frame": frameTok}

	// A native link authenticated at its upgrade: a call, a failing call.
	c := testkit.MustClient(t, m.WS, mesh.WithToken(linkTok), mesh.WithoutReliability())
	var got map[string]string
	if err := c.Call(t.Context(), "echo.echo", nil, &got); err != nil || got["authToken"] != "" {
		t.Fatalf("call over the link: %v, the agent saw authToken %q", err, got["authToken"])
	}
	testkit.WantCode(t, "unknown method over the link", c.Call(t.Context(), "no.such.method", nil, nil), envelope.CodeMethodNotFound)

	// HTTP with Authorization: a call and a failing one.
	post := func(tok, body string) string {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, m.HTTP+"/rpc", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return string(b)
	}
	if r := post(httpTok, `{"jsonrpc":"2.0","id":1,"method":"echo.echo"}`); !strings.Contains(r, `"authToken":""`) {
		t.Errorf("HTTP call: %s", r)
	}
	if r := post(httpTok, `{"jsonrpc":"2.0","id":2,"method":"no.such.method"}`); !strings.Contains(r, "-32601") {
		t.Errorf("HTTP unknown method: %s", r)
	}

	// A frame carrying its own credential in headers.authToken, on a link
	// upgraded with another token: a call and a failing one.
	d := websocket.Dialer{Subprotocols: []string{envelope.Subprotocol}}
	ws, _, err := d.DialContext(t.Context(), m.WS, http.Header{"Authorization": {"Bearer " + linkTok}})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	for i, method := range []string{"echo.echo", "no.such.method"} {
		frame, _ := json.Marshal(map[string]any{"type": "req", "seq": i + 1, "id": "f" + method, "method": method, "params": map[string]any{},
			"headers": map[string]any{"authToken": frameTok}, "version": envelope.Version})
		if err := ws.WriteMessage(websocket.TextMessage, frame); err != nil {
			t.Fatal(err)
		}
		_ = ws.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, r, err := ws.ReadMessage()
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 && !strings.Contains(string(r), `"authToken":""`) {
			t.Errorf("frame with headers.authToken: %s", r)
		}
	}

	if err := tp.ForceFlush(t.Context()); err != nil {
		t.Fatal(err)
	}
	spans := exp.GetSpans()
	if len(spans) < 6 {
		t.Fatalf("%d spans recorded; want the calls' spans", len(spans))
	}
	var recorded strings.Builder
	for _, s := range spans {
		b, _ := json.Marshal(struct {
			Name   string
			Attrs  any
			Events any
			Status any
			Links  any
		}{s.Name, s.Attributes, s.Events, s.Status, s.Links})
		recorded.Write(b)
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, m.HTTP+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+adminTok)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	metricsText, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || !strings.Contains(string(metricsText), "rpc_server_call_duration_seconds") {
		t.Fatalf("/metrics with an admin token: HTTP %d", res.StatusCode)
	}
	logText := logs.String()
	if !strings.Contains(logText, "no.such.method") {
		t.Errorf("the failed calls were not logged:\n%s", logText)
	}
	for name, tok := range secrets {
		sig := tok[strings.LastIndex(tok, ".")+1:] // the part that makes it a credential
		for where, text := range map[string]string{"spans": recorded.String(), "logs": logText, "metrics": string(metricsText)} {
			if strings.Contains(text, sig) {
				t.Errorf("the %s token appears in the %s", name, where)
			}
		}
	}
	t.Logf("%d spans, %d bytes of logs, %d bytes of metrics searched for %d tokens", len(spans), len(logText), len(metricsText), len(secrets))
}
