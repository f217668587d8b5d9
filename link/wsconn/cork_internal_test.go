package wsconn

import (
	"fmt"
	"net"
	"runtime"
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

// TestGroupBuffersStayApart: the buffer a group of queued answers is
// written from does not come back as a frame's buffer (GetBuf). An answer
// owed to a peer counts its buffer's capacity towards MaxUnwrittenBytes,
// so small answers in group-sized buffers filled the bound: a JSON-RPC
// client with 128 calls in flight was refused OVERLOADED now and then.
func TestGroupBuffersStayApart(t *testing.T) {
	ws, client := acceptedPair(t, nil)
	c := NewConn(ws, Config{}) // not started: writeFrames runs here
	go func() {
		for {
			if _, _, err := client.ReadMessage(); err != nil {
				return
			}
		}
	}()
	// Two collections empty the pools: what GetBuf hands out below came
	// from this test.
	runtime.GC()
	runtime.GC()
	for range 4 {
		var frames []*[]byte
		for i := range maxBatchFrames {
			b := GetBuf()
			*b = fmt.Appendf(*b, `{"jsonrpc":"2.0","result":"%0200d","id":%d}`, i, i)
			frames = append(frames, b)
		}
		if err := c.writeFrames(frames); err != nil {
			t.Fatal(err)
		}
	}
	var held []*[]byte
	for range 4 * maxBatchFrames {
		b := GetBuf()
		if cap(*b) > 4<<10 {
			t.Fatalf("GetBuf gave a buffer of %d bytes after group writes; want a frame's (at most 4 KiB here)", cap(*b))
		}
		held = append(held, b)
	}
	for _, b := range held {
		PutBuf(b)
	}
}
