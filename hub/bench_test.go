package hub_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
)

// BenchmarkRoutedCall measures one call client → hub → echo agent → hub →
// client over real loopback WebSockets (and over HTTP for comparison).
//
//	go test -run '^$' -bench RoutedCall -benchmem -count 6 ./mesh | tee new.txt
func BenchmarkRoutedCall(b *testing.B) {
	m := meshtest.Start(b, hub.Config{})
	m.RunAgent(b, agents.NewEcho())
	ctx := context.Background()
	run := func(c *mesh.Client) func(b *testing.B) {
		return func(b *testing.B) {
			var out json.RawMessage
			if err := c.Call(ctx, "echo.echo", testkit.Payload128, &out); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			reportCPU(b)
			b.SetBytes(int64(len(testkit.Payload128)))
			b.ResetTimer()
			for b.Loop() {
				if err := c.Call(ctx, "echo.echo", testkit.Payload128, &out); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	parallel := func(c *mesh.Client) func(b *testing.B) {
		return func(b *testing.B) {
			b.ReportAllocs()
			reportCPU(b)
			b.SetBytes(int64(len(testkit.Payload128)))
			b.SetParallelism(8) // 8 × GOMAXPROCS callers share the one connection
			b.RunParallel(func(pb *testing.PB) {
				var out json.RawMessage
				for pb.Next() {
					if err := c.Call(ctx, "echo.echo", testkit.Payload128, &out); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
	}
	ws, hc := m.Client(b), m.HTTPClient(b)
	b.Run("ws/serial", run(ws))
	b.Run("ws/parallel", parallel(ws))
	b.Run("http/serial", run(hc))
}

// BenchmarkBaselineWSEcho is the floor the routed call is compared with:
// one gorilla WebSocket round trip to an echo server over loopback, with
// no hub, no envelope and no second hop.
func BenchmarkBaselineWSEcho(b *testing.B) {
	up := websocket.Upgrader{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		defer c.Close()
		for {
			t, msg, err := c.ReadMessage()
			if err != nil {
				return
			}
			if err := c.WriteMessage(t, msg); err != nil {
				return
			}
		}
	}))
	defer srv.Close()
	c, _, err := websocket.DefaultDialer.Dial("ws"+strings.TrimPrefix(srv.URL, "http"), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	b.ReportAllocs()
	b.SetBytes(int64(len(testkit.Payload128)))
	for b.Loop() {
		if err := c.WriteMessage(websocket.TextMessage, testkit.Payload128); err != nil {
			b.Fatal(err)
		}
		if _, _, err := c.ReadMessage(); err != nil {
			b.Fatal(err)
		}
	}
}
