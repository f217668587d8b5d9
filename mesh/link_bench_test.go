package mesh_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/mesh"
)

// BenchmarkLinkCall measures the link alone (writer, reader, pending map,
// frame codec): calls over one native WebSocket to a peer Link that
// answers at once, serially and from many goroutines (where the writer can
// coalesce frames).
//
//	go test -run '^$' -bench LinkCall -benchmem -count 6 ./mesh
func BenchmarkLinkCall(b *testing.B) {
	up := websocket.Upgrader{Subprotocols: []string{envelope.Subprotocol}}
	echo := func(_ context.Context, req *envelope.Request) (*envelope.Response, error) {
		return &envelope.Response{ID: req.ID, Result: req.Params}, nil
	}
	var peers []*mesh.Link
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		peers = append(peers, mesh.NewLink(ws, mesh.ConnConfig{}, mesh.WithLinkHandler(echo)))
	}))
	defer func() {
		for _, p := range peers {
			p.Close()
		}
		srv.Close()
	}()
	l, err := mesh.DialLink(context.Background(), "ws"+strings.TrimPrefix(srv.URL, "http")+"/ws", mesh.ConnConfig{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	req := envelope.Request{ID: envelope.NewID(), Method: "echo.echo", Params: payload128}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		reportCPU(b)
		for b.Loop() {
			r := req
			if _, err := l.Call(context.Background(), &r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		reportCPU(b)
		b.SetParallelism(32)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				r := req
				if _, err := l.Call(context.Background(), &r); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
