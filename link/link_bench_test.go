package link_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

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
//	go test -run '^$' -bench LinkCall -benchmem -count 6 ./link
func BenchmarkLinkCall(b *testing.B) {
	l := echoLink(b)
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
	b.Run("serial-deadline", func(b *testing.B) {
		b.ReportAllocs()
		cpustat.Report(b)
		for b.Loop() {
			r := req
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := l.Call(ctx, &r)
			cancel()
			if err != nil {
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

// BenchmarkLinkGo is BenchmarkLinkCall with Link.Go, the forward path's
// primitive: no goroutine waits on the call, no context or timer per
// call (the deadline goes in the link's heap). The caller here waits on
// a channel of its own, as the benchmark's loop must.
//
//	go test -run '^$' -bench 'Link(Call|Go)' -benchmem -count 6 ./link
func BenchmarkLinkGo(b *testing.B) {
	l := echoLink(b)
	req := envelope.Request{ID: envelope.NewID(), Method: "echo.echo", Params: payload128}
	// one waiter per goroutine: its completion is made once, not per call
	type waiter struct {
		ch   chan *envelope.Error
		done link.Completion
	}
	newWaiter := func() *waiter {
		w := &waiter{ch: make(chan *envelope.Error, 1)}
		w.done = link.CompletionFunc(func(_ *envelope.Response, err *envelope.Error) { w.ch <- err })
		return w
	}
	serial := func(ttl time.Duration) func(b *testing.B) {
		return func(b *testing.B) {
			b.ReportAllocs()
			cpustat.Report(b)
			w := newWaiter()
			for b.Loop() {
				var deadline time.Time
				if ttl > 0 {
					deadline = time.Now().Add(ttl)
				}
				if _, err := l.Go(&req, deadline, w.done); err != nil {
					b.Fatal(err)
				}
				if err := <-w.ch; err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	b.Run("serial", serial(0))
	b.Run("serial-deadline", serial(10*time.Second))
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		cpustat.Report(b)
		b.SetParallelism(32)
		b.RunParallel(func(pb *testing.PB) {
			w := newWaiter()
			for pb.Next() {
				if _, err := l.Go(&req, time.Now().Add(10*time.Second), w.done); err != nil {
					b.Error(err)
					return
				}
				if err := <-w.ch; err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// echoLink dials a link to a peer Link over loopback that answers every
// call at once with its params; both close when the benchmark ends.
func echoLink(b *testing.B) *link.Link {
	up := websocket.Upgrader{Subprotocols: []string{envelope.Subprotocol}}
	echo := func(_ context.Context, req *envelope.Request) (*envelope.Response, error) {
		return &envelope.Response{ID: req.ID, Result: req.Params}, nil
	}
	var mu sync.Mutex
	var peers []*link.Link
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		mu.Lock()
		peers = append(peers, link.New(ws, link.Config{}, link.WithHandler(echo)))
		mu.Unlock()
	}))
	l, err := link.Dial(context.Background(), "ws"+strings.TrimPrefix(srv.URL, "http")+"/ws", link.Config{})
	if err != nil {
		srv.Close()
		b.Fatal(err)
	}
	b.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, p := range peers {
			p.Close()
		}
		mu.Unlock()
		srv.Close()
	})
	return l
}
