package wsconn

import (
	"fmt"
	"net"
	"sync/atomic"
	"testing"
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
	counted := new(countingListener)
	ws, client := acceptedPair(t, func(ln net.Listener) net.Listener { counted.Listener = ln; return counted })
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
