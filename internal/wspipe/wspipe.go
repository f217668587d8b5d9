// Package wspipe gives tests a WebSocket over net.Pipe: no socket, so
// that a test runs in a testing/synctest bubble.
package wspipe

import (
	"context"
	"net"
	"net/http"
	"sync"
	"testing"

	"github.com/gorilla/websocket"
)

// pipeListener hands out the server ends of net.Pipe connections: an
// http.Server over it upgrades WebSockets with no socket at all, so that
// a test runs in a synctest bubble.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *pipeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

func (l *pipeListener) dial(ctx context.Context, _, _ string) (net.Conn, error) {
	c, s := net.Pipe()
	select {
	case l.conns <- s:
		return c, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Pair returns the two ends of a WebSocket over net.Pipe: the server's
// (for a Conn) and the client's. Both are closed when the test ends.
func Pair(t *testing.T) (server, client *websocket.Conn) {
	t.Helper()
	l := newPipeListener()
	got := make(chan *websocket.Conn, 1)
	up := websocket.Upgrader{}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := up.Upgrade(w, r, nil)
		if err != nil {
			t.Error(err)
			return
		}
		got <- ws
	})}
	go func() { _ = srv.Serve(l) }()
	d := websocket.Dialer{NetDialContext: l.dial}
	client, _, err := d.Dial("ws://pipe/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	server = <-got
	t.Cleanup(func() {
		_ = srv.Close()
		_ = client.Close()
		_ = server.Close()
	})
	return server, client
}

// TestBackpressureBounds: a Conn with backpressure stops reading when
// the answers it owes its peer and could not write reach a bound (calls
// or bytes), and reads on once the peer takes them; calls read past the
// bounds on calls running and answers owed are refused (tryAdmit false),
// not waited for, so that the reader goes on carrying the peer's other
// frames (an agent's answers, heartbeats, cancels). Nothing of this on a
// connection without backpressure. In a synctest bubble over net.Pipe:
// "stops reading" is every goroutine blocked with the peer's messages
