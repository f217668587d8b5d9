package wsconn

import (
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/gorilla/websocket"
)

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

type countingListener struct {
	net.Listener
	writes atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{c, &l.writes}, nil
}

// TestCorkedWrites: a connection that cannot batch frames into one
// message (a plain JSON-RPC WebSocket) writes the messages queued
// together in one write to the socket, each still its own message, in
// order.
func TestCorkedWrites(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	counted := &countingListener{Listener: ln}
	accepted := make(chan *websocket.Conn, 1)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			t.Error(err)
			return
		}
		accepted <- ws
	})}
	go func() { _ = srv.Serve(NewCapListener(counted, 10, nil)) }()
	defer srv.Close()
	client, _, err := websocket.DefaultDialer.DialContext(t.Context(), "ws://"+ln.Addr().String()+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ws := <-accepted
	defer ws.Close()
	c := NewConn(ws, Config{}) // not started: writeFrames runs here
	var frames []*[]byte
	for i := range 10 {
		b := GetBuf()
		*b = fmt.Appendf(*b, `{"jsonrpc":"2.0","result":%d,"id":%d}`, i, i)
		frames = append(frames, b)
	}
	before := counted.writes.Load()
	if err := c.writeFrames(frames); err != nil {
		t.Fatal(err)
	}
	if n := counted.writes.Load() - before; n != 1 {
		t.Errorf("10 queued messages took %d writes; want 1", n)
	}
	for i := range 10 {
		_, msg, err := client.ReadMessage()
		if err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf(`{"jsonrpc":"2.0","result":%d,"id":%d}`, i, i); string(msg) != want {
			t.Fatalf("message %d: %s; want %s", i, msg, want)
		}
	}
}
