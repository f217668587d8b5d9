package hub_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
)

// TestRateLimitPerConnection: with no authentication at all, one
// WebSocket connection flooding at 5× its limit gets about its limit
// through and OVERLOADED with a retry-after hint for the rest, while a
// second connection keeps every call; over HTTP, one keep-alive
// connection past the limit gets 429 with Retry-After. The agent's own
// heartbeats are never limited (it stays registered throughout).
func TestRateLimitPerConnection(t *testing.T) {
	// A rate is time: a synctest bubble over the in-memory mesh (2 s of
	// real time before).
	synctest.Test(t, func(t *testing.T) {
		m := meshtest.StartInMemory(t, hub.Config{ConnRate: 100, ConnBurst: 20, HeartbeatInterval: 100 * time.Millisecond})
		var n atomic.Int64
		echo := agents.New("echo", m.AgentConn())
		echo.Handle("echo.echo", func(ctx context.Context, p json.RawMessage) (any, error) {
			n.Add(1)
			return "ok", nil
		})
		m.RunAgent(t, echo)
		flood := m.Client(t, mesh.WithoutReliability())
		calm := m.Client(t, mesh.WithoutReliability())
		f := floodAndCalm(flood, calm, 2*time.Second)
		rate := f.rate(20)
		t.Logf("flooding connection: %d ok (%.0f/s after the burst), %d OVERLOADED (%d with retry-after, not sent), %d other; calm connection: %d ok, %d failed; agent executed %d",
			f.ok, rate, f.limited, f.hinted, f.other, f.calmOK, f.calmErr, n.Load())
		if rate < 85 || rate > 115 {
			t.Errorf("flooding connection got %.0f calls/s through; the limit is 100/s", rate)
		}
		if f.limited == 0 || f.hinted != f.limited || f.other != 0 {
			t.Errorf("excess not refused as OVERLOADED with a retry-after hint, not sent")
		}
		if f.calmErr != 0 || f.calmOK < 50 {
			t.Errorf("the other connection lost calls: %d ok, %d failed", f.calmOK, f.calmErr)
		}
		if got := n.Load(); got != f.ok+f.calmOK {
			t.Errorf("agent executed %d calls; %d succeeded", got, f.ok+f.calmOK)
		}

		// HTTP: one keep-alive connection, 60 calls back to back past a burst
		// of 20: the excess is answered with the JSON-RPC error of
		// OVERLOADED and its retry-after hint, as the per-token limit is.
		tr := &http.Transport{MaxConnsPerHost: 1, DialContext: m.DialContext}
		defer tr.CloseIdleConnections()
		hc := &http.Client{Transport: tr}
		codes := map[int]int{}
		hintedHTTP := 0
		for range 60 {
			res, err := hc.Post("http://memhub/rpc", "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"echo.echo"}`))
			if err != nil {
				t.Fatal(err)
			}
			var rep struct {
				Error *struct {
					Code int `json:"code"`
					Data struct {
						Details struct {
							RetryAfterMs int64 `json:"retryAfterMs"`
						} `json:"details"`
					} `json:"data"`
				} `json:"error"`
			}
			_ = json.NewDecoder(res.Body).Decode(&rep)
			res.Body.Close()
			if rep.Error == nil {
				codes[0]++
				continue
			}
			codes[rep.Error.Code]++
			if rep.Error.Data.Details.RetryAfterMs > 0 {
				hintedHTTP++
			}
		}
		over := envelope.CodeOverloaded.JSONRPC()
		t.Logf("HTTP, one connection, 60 calls back to back: JSON-RPC error codes %v (0: success), %d with retryAfterMs", codes, hintedHTTP)
		if codes[0] < 20 || codes[over] == 0 || codes[0]+codes[over] != 60 || hintedHTTP != codes[over] {
			t.Errorf("HTTP answers %v; want the burst of 20 served and the rest %d with retryAfterMs", codes, over)
		}
		// The agent stayed registered: its heartbeats are not calls.
		if err := calm.Call(t.Context(), "echo.echo", nil, nil); err != nil {
			t.Errorf("after the floods: %v", err)
		}
	})
}
