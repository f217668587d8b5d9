package mesh_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/envelope"
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
	m := meshtest.Start(t, mesh.HubConfig{ConnRate: 100, ConnBurst: 20, HeartbeatInterval: 100 * time.Millisecond})
	var n atomic.Int64
	echo := agents.New("echo")
	echo.Handle("echo.echo", func(ctx context.Context, p json.RawMessage) (any, error) {
		n.Add(1)
		return "ok", nil
	})
	m.RunAgent(t, echo)
	flood := mustClient(t, m.WS, mesh.WithoutReliability())
	calm := mustClient(t, m.WS, mesh.WithoutReliability())
	d := 2 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	var ok, limited, hinted, other, calmOK, calmErr atomic.Int64
	start := time.Now()
	for range 8 {
		wg.Go(func() {
			tk := time.NewTicker(16 * time.Millisecond) // 8 × 62.5/s = 500/s
			defer tk.Stop()
			for ctx.Err() == nil {
				<-tk.C
				err := flood.Call(context.Background(), "echo.echo", nil, nil)
				switch envelope.CodeOf(err) {
				case envelope.CodeOK:
					ok.Add(1)
				case envelope.CodeOverloaded:
					limited.Add(1)
					if e := envelope.AsError(err); e.RetryAfter() > 0 && e.NotSent() {
						hinted.Add(1)
					}
				default:
					other.Add(1)
				}
			}
		})
	}
	wg.Go(func() {
		tk := time.NewTicker(20 * time.Millisecond) // 50/s, half the limit
		defer tk.Stop()
		for ctx.Err() == nil {
			<-tk.C
			if err := calm.Call(context.Background(), "echo.echo", nil, nil); err != nil {
				calmErr.Add(1)
			} else {
				calmOK.Add(1)
			}
		}
	})
	wg.Wait()
	el := time.Since(start).Seconds()
	rate := float64(ok.Load()-20) / el
	t.Logf("flooding connection: %d ok (%.0f/s after the burst), %d OVERLOADED (%d with retry-after, not sent), %d other; calm connection: %d ok, %d failed; agent executed %d",
		ok.Load(), rate, limited.Load(), hinted.Load(), other.Load(), calmOK.Load(), calmErr.Load(), n.Load())
	if rate < 85 || rate > 115 {
		t.Errorf("flooding connection got %.0f calls/s through; the limit is 100/s", rate)
	}
	if limited.Load() == 0 || hinted.Load() != limited.Load() || other.Load() != 0 {
		t.Errorf("excess not refused as OVERLOADED with a retry-after hint, not sent")
	}
	if calmErr.Load() != 0 || calmOK.Load() < 50 {
		t.Errorf("the other connection lost calls: %d ok, %d failed", calmOK.Load(), calmErr.Load())
	}
	if got := n.Load(); got != ok.Load()+calmOK.Load() {
		t.Errorf("agent executed %d calls; %d succeeded", got, ok.Load()+calmOK.Load())
	}

	// HTTP: one keep-alive connection, 60 calls back to back past a burst
	// of 20: the excess is answered with the JSON-RPC error of
	// OVERLOADED and its retry-after hint, as the per-token limit is.
	tr := &http.Transport{MaxConnsPerHost: 1}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	codes := map[int]int{}
	hintedHTTP := 0
	for range 60 {
		res, err := hc.Post(m.HTTP+"/rpc", "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"echo.echo"}`))
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
}
