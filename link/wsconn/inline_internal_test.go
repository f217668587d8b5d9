package wsconn

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/envelope"
)

// acceptedPair is the accepting end of a real WebSocket (its listener
// wrapped by wrap, if not nil) and the client's.
func acceptedPair(t testing.TB, wrap func(net.Listener) net.Listener) (*websocket.Conn, *websocket.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if wrap != nil {
		ln = wrap(ln)
	}
	accepted := make(chan *websocket.Conn, 1)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			t.Error(err)
			return
		}
		accepted <- ws
	})}
	go func() { _ = srv.Serve(NewCapListener(ln, 10, nil)) }()
	t.Cleanup(func() { _ = srv.Close() })
	client, _, err := websocket.DefaultDialer.DialContext(t.Context(), "ws://"+addr+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	ws := <-accepted
	t.Cleanup(func() { _ = ws.Close() })
	return ws, client
}

// inlinePair is an accepted connection with backpressure (the hub's side
// of a link: it knows the kernel's room), started, and its client.
func inlinePair(t *testing.T) (*Conn, *websocket.Conn) {
	ws, client := acceptedPair(t, nil)
	c := NewConn(ws, Config{PingInterval: time.Hour})
	c.WithBackpressure()
	c.Start(func([]byte, *envelope.Error) {}, func(error) {})
	t.Cleanup(c.Close)
	return c, client
}

func sendText(c *Conn, s string) bool {
	b := GetBuf()
	*b = append(*b, s...)
	return c.TrySend(b)
}

// TestLoneFramesWrittenBySender: frames that come one at a time, apart,
// are written by their senders (no writer goroutine woken for each); a
// burst goes to the writer, at most its first frame written by its
// sender; every frame arrives, in order.
func TestLoneFramesWrittenBySender(t *testing.T) {
	c, client := inlinePair(t)
	read := func(want string) {
		t.Helper()
		_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, msg, err := client.ReadMessage()
		if err != nil || string(msg) != want {
			t.Fatalf("read %q, %v; want %q", msg, err, want)
		}
	}
	for i := range 6 {
		time.Sleep(2 * inlineGap) // apart: lone
		sendText(c, "lone-"+strconv.Itoa(i))
		read("lone-" + strconv.Itoa(i))
	}
	if n := c.inlined.Load(); n < 4 {
		t.Errorf("%d of 6 lone frames written by their senders; want at least 4 (the first finds no room known yet)", n)
	}
	before := c.inlined.Load()
	time.Sleep(2 * inlineGap)
	for i := range 50 {
		sendText(c, "burst-"+strconv.Itoa(i))
	}
	for i := range 50 {
		read("burst-" + strconv.Itoa(i))
	}
	if n := c.inlined.Load() - before; n > 10 { // the race detector's pace can open a gap or two
		t.Errorf("%d frames of a burst of 50 written by their senders; want the writer to take nearly all", n)
	}
}

// TestInlineWritesKeepOrder: senders writing their own frames and the
// writer goroutine writing queued ones never reorder one sender's frames
// nor interleave two messages.
func TestInlineWritesKeepOrder(t *testing.T) {
	c, client := inlinePair(t)
	const senders, each = 3, 300
	var wg sync.WaitGroup
	for s := range senders {
		wg.Go(func() {
			for i := range each {
				if rand.IntN(2) == 0 { // apart (lone, written by the sender) or in a burst (the writer)
					time.Sleep(time.Duration(rand.IntN(300)) * time.Microsecond)
				}
				for !sendText(c, fmt.Sprintf("%d:%d", s, i)) {
					time.Sleep(time.Millisecond) // queue full: wait for room
				}
			}
		})
	}
	next := make([]int, senders)
	for range senders * each {
		_ = client.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, msg, err := client.ReadMessage()
		if err != nil {
			t.Fatal(err)
		}
		a, b, _ := strings.Cut(string(msg), ":")
		s, _ := strconv.Atoi(a)
		i, _ := strconv.Atoi(b)
		if s < 0 || s >= senders || i != next[s] {
			t.Fatalf("message %q; want %d:%d", msg, s, next[s])
		}
		next[s]++
	}
	wg.Wait()
	if c.inlined.Load() == 0 {
		t.Error("no frame written by its sender: the test did not mix the two ways")
	}
	t.Logf("%d of %d frames written by their senders", c.inlined.Load(), senders*each)
}

// TestRawWritesOutliveRoomTracking: the writer drops the socket it reads
// the kernel's room from when that fails (waitSendRoom: not a socket that
// says, or closed); the non-waiting first write keeps its own, and the
// messages still arrive, in order (a nil socket there was a panic on
// every link where sendQueue cannot answer: darwin, the BSDs).
func TestRawWritesOutliveRoomTracking(t *testing.T) {
	ws, client := acceptedPair(t, nil)
	c := NewConn(ws, Config{PingInterval: time.Hour})
	c.WithBackpressure()
	if c.wraw == nil {
		t.Fatal("no raw writes on a plain TCP connection")
	}
	c.raw = nil // as waitSendRoom leaves it once sendQueue failed
	c.Start(func([]byte, *envelope.Error) {}, func(error) {})
	t.Cleanup(c.Close)
	const n = 200
	for i := range n {
		for !sendText(c, strconv.Itoa(i)) {
			time.Sleep(time.Millisecond)
		}
	}
	for i := range n {
		_ = client.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, msg, err := client.ReadMessage()
		if err != nil {
			t.Fatal(err)
		}
		if string(msg) != strconv.Itoa(i) {
			t.Fatalf("message %q, want %d", msg, i)
		}
	}
}
