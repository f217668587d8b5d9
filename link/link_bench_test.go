package link_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/cpustat"
	"github.com/agentmesh/agentmesh/link"
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
	var peers []*link.Link
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		peers = append(peers, link.New(ws, link.Config{}, link.WithHandler(echo)))
	}))
	defer func() {
		for _, p := range peers {
			p.Close()
		}
		srv.Close()
	}()
	l, err := link.Dial(context.Background(), "ws"+strings.TrimPrefix(srv.URL, "http")+"/ws", link.Config{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	req := envelope.Request{ID: envelope.NewID(), Method: "echo.echo", Params: payload128}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		cpustat.Report(b)
		for b.Loop() {
			r := req
			if _, err := l.Call(context.Background(), &r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		cpustat.Report(b)
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

// payload128 is the 128-byte params of the benchmarks (as mesh's).
var payload128 = json.RawMessage(`{"data":"` + strings.Repeat("x", 128-11) + `"}`)
