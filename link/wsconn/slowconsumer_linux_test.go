package wsconn

import (
	"errors"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/envelope"
)

// TestSlowConsumerCloseFrame: on a real loopback socket, a peer that
// reads nothing. The connection's writer hands the kernel whole frames
// only, stops when the buffer is half full, and after WriteTimeout with
// no progress closes with 1008 "slow consumer", counted once; the peer,
// reading afterwards, gets every frame the writer wrote, whole and in
// order, then that close frame (without the whole-frames rule it gets a
// frame cut short and 1006).
func TestSlowConsumerCloseFrame(t *testing.T) {
	sws, cws := loopbackWS(t)
	var slow atomic.Int32
	const writeTimeout = 500 * time.Millisecond
	c := NewConn(sws, Config{WriteTimeout: writeTimeout, SlowConsumer: func() { slow.Add(1) }})
	c.WithBackpressure()
	closed := make(chan error, 1)
	c.Start(func([]byte, *envelope.Error) {}, func(err error) { closed <- err })
	defer c.Close()

	// 60 KiB frames, numbered, until the connection closes.
	frame := func(i int) []byte {
		b := []byte(strings.Repeat(string(rune('a'+i%26)), 60<<10))
		return b
	}
	sent := 0
	start := time.Now()
	go func() {
		for i := 0; ; i++ {
			b := GetBuf()
			*b = append((*b)[:0], frame(i)...)
			if !c.Send(b) {
				return
			}
		}
	}()
	var cerr error
	select {
	case cerr = <-closed:
	case <-time.After(10 * writeTimeout):
		t.Fatal("a peer reading nothing was not closed")
	}
	took := time.Since(start)
	if !errors.Is(cerr, errSlowConsumer) {
		t.Errorf("closed with %v; want errSlowConsumer", cerr)
	}
	if took > writeTimeout+time.Second {
		t.Errorf("closed %v after the first frame; want about the write timeout %v", took, writeTimeout)
	}
	if n := slow.Load(); n != 1 {
		t.Errorf("SlowConsumer told %d times; want 1", n)
	}
	// The peer reads at last.
	_ = cws.SetReadDeadline(time.Now().Add(5 * time.Second))
	for {
		_, msg, err := cws.ReadMessage()
		if err != nil {
			var ce *websocket.CloseError
			if !errors.As(err, &ce) || ce.Code != websocket.ClosePolicyViolation || ce.Text != "slow consumer" {
				t.Errorf("after %d frames the peer read %v; want close 1008 slow consumer", sent, err)
			}
			break
		}
		if want := frame(sent); string(msg) != string(want) {
			t.Fatalf("frame %d: %d bytes, not the frame written", sent, len(msg))
		}
		sent++
	}
	t.Logf("closed %v after the first frame; the peer read %d frames of 60 KiB, then the close frame", took.Round(time.Millisecond), sent)
	if sent == 0 {
		t.Error("the peer read no frame before the close")
	}
}

// TestShutdownNotReadingDoesNotWait: Shutdown starts closing without
// waiting, even for a peer that stopped reading on a connection that
// keeps no room for a close frame (no backpressure), whose writer is
// stuck on the peer's full socket buffer. Sending the close frame there
// waited for the writer until the frame's 1 s deadline, and whoever
// called Shutdown with it (a Multica sender whose message found a
// device's queue full) was held that second.
func TestShutdownNotReadingDoesNotWait(t *testing.T) {
	sws, _ := loopbackWS(t) // the peer: it reads nothing
	c := NewConn(sws, Config{QueueSize: 4})
	closed := make(chan error, 1)
	c.Start(func([]byte, *envelope.Error) {}, func(err error) { closed <- err })
	defer c.Close()
	// Frames until the queue stays full: the writer is stuck in the
	// kernel, on the peer's full buffer (it would otherwise drain it).
	big := strings.Repeat("x", 60<<10)
	var full time.Time
	for full.IsZero() || time.Since(full) < 200*time.Millisecond {
		b := GetBuf()
		*b = append((*b)[:0], big...)
		if c.TrySend(b) {
			full = time.Time{}
			continue
		}
		if full.IsZero() {
			full = time.Now()
		}
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	c.Shutdown(NotReading("send queue full"))
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("Shutdown took %v: it waited for the stuck writer (the close frame's deadline is 1 s)", took)
	}
	if err := <-closed; !errors.Is(err, ErrNotReading) {
		t.Errorf("closed with %v; want ErrNotReading", err)
	}
}

// loopbackWS returns both ends of a WebSocket over a real loopback
// socket: the server's (accepted) and the client's (dialed, closed when
// the test ends).
func loopbackWS(t *testing.T) (server, client *websocket.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *websocket.Conn, 1)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err == nil {
			got <- ws
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	cws, _, err := websocket.DefaultDialer.Dial("ws://"+ln.Addr().String()+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cws.Close() })
	return <-got, cws
}
