package wsconn

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/race"
)

// frameServer accepts WebSockets and runs a Conn on each, recording
// what it reads. capped: through a CapListener, so that the Conn reads
// with its frameReader; otherwise gorilla reads. Its tests dial it one
// connection at a time.
type frameServer struct {
	addr     string
	cfg      Config
	capped   bool
	bp       bool // Conn.WithBackpressure, as the hub's links have it
	accepted chan *served
}

// served is what the server's Conn on one connection did.
type served struct {
	c       *Conn
	fr      bool // it read with a frameReader
	mu      sync.Mutex
	got     []string      // the messages it read
	arrived chan struct{} // a message was read
	why     string        // why it closed
	closed  chan struct{} // closed once the Conn is closed, its goroutines gone
}

// waitMessage waits until the Conn has read a message since the last wait.
func (r *served) waitMessage(t testing.TB) {
	t.Helper()
	select {
	case <-r.arrived:
	case <-time.After(10 * time.Second):
		t.Fatal("the message did not arrive")
	}
}

func newFrameServer(t testing.TB, capped bool, cfg Config) *frameServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &frameServer{addr: ln.Addr().String(), cfg: cfg, capped: capped, accepted: make(chan *served, 1)}
	if capped {
		ln = NewCapListener(ln, 1000, nil)
	}
	var conns sync.WaitGroup
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := (&websocket.Upgrader{}).Upgrade(w, r, nil)
		if err != nil {
			return
		}
		c := NewConn(ws, s.cfg)
		if s.bp {
			c.WithBackpressure()
		}
		rec := &served{c: c, fr: c.fr != nil, arrived: make(chan struct{}, 1), closed: make(chan struct{})}
		conns.Add(1)
		c.Start(func(data []byte, refused *envelope.Error) {
			rec.mu.Lock()
			rec.got = append(rec.got, string(data))
			rec.mu.Unlock()
			select {
			case rec.arrived <- struct{}{}:
			default:
			}
		}, func(err error) {
			rec.mu.Lock()
			rec.why = fmt.Sprint(err)
			rec.mu.Unlock()
			go func() { c.Close(); close(rec.closed); conns.Done() }()
		})
		s.accepted <- rec
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); conns.Wait() })
	return s
}

// dial opens a connection to s and shakes hands by hand; it returns the
// connection, its reader past the handshake, and the server's record.
func (s *frameServer) dial(t testing.TB) (net.Conn, *bufio.Reader, *served) {
	nc, err := net.Dial("tcp", s.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(nc, "GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(nc)
	res, err := http.ReadResponse(br, nil)
	if err != nil || res.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("handshake: %v %v", res, err)
	}
	select {
	case rec := <-s.accepted:
		if rec.fr != s.capped {
			t.Fatalf("the Conn read with a frameReader: %v; want %v", rec.fr, s.capped)
		}
		return nc, br, rec
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not take the connection")
		return nil, nil, nil
	}
}

// session dials s, writes raw in pieces of random sizes, half-closes,
// and returns what the server read, every frame it wrote back (opcode
// and payload), and why its Conn closed.
func (s *frameServer) session(t testing.TB, raw []byte, rnd *rand.Rand) (got []string, back [][]byte, why string) {
	nc, br, rec := s.dial(t)
	defer nc.Close()
	var back2 [][]byte
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		for {
			var h [2]byte
			if _, err := io.ReadFull(br, h[:]); err != nil {
				return
			}
			n := int(h[1] & 0x7f)
			switch n {
			case 126:
				var e [2]byte
				if _, err := io.ReadFull(br, e[:]); err != nil {
					return
				}
				n = int(binary.BigEndian.Uint16(e[:]))
			case 127:
				var e [8]byte
				if _, err := io.ReadFull(br, e[:]); err != nil {
					return
				}
				n = int(binary.BigEndian.Uint64(e[:]))
			}
			p := make([]byte, 1+n)
			p[0] = h[0] & 0x0f
			if _, err := io.ReadFull(br, p[1:]); err != nil {
				return
			}
			back2 = append(back2, p)
		}
	}()
	for len(raw) > 0 {
		n := min(len(raw), 1+rnd.IntN(64))
		if rnd.IntN(2) == 0 {
			n = min(len(raw), 1+rnd.IntN(16<<10))
		}
		if _, err := nc.Write(raw[:n]); err != nil {
			break // the server closed: what it read is what counts
		}
		raw = raw[n:]
		if rnd.IntN(4) == 0 {
			time.Sleep(time.Duration(rnd.IntN(200)) * time.Microsecond) // let the reader wait mid-frame
		}
	}
	_ = nc.(*net.TCPConn).CloseWrite()
	<-readDone
	select {
	case <-rec.closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the server's connection did not end")
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.got, back2, rec.why
}

// frame is one client frame (masked, RFC 6455 §5.2).
func frame(b []byte, fin bool, op byte, payload []byte, key [4]byte) []byte {
	h := op
	if fin {
		h |= 0x80
	}
	b = append(b, h)
	switch n := len(payload); {
	case n < 126:
		b = append(b, 0x80|byte(n))
	case n < 1<<16:
		b = append(b, 0x80|126)
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b = append(b, 0x80|127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	b = append(b, key[:]...)
	for i, c := range payload {
		b = append(b, c^key[i&3])
	}
	return b
}

// closeCode is the code of the close frame among back, or 0.
func closeCode(back [][]byte) int {
	for _, f := range back {
		if f[0] == websocket.CloseMessage && len(f) >= 3 {
			return int(binary.BigEndian.Uint16(f[1:]))
		}
	}
	return 0
}

// TestFrameReaderReadsWhatItIsSent writes messages of every size,
// fragmented at random, with pings and pongs between the fragments, in
// writes of random sizes, and with the reader's wait after each message
// handed to a new goroutine (idleSwap 0): the Conn reads them whole and
// in order, and answers each ping.
func TestFrameReaderReadsWhatItIsSent(t *testing.T) {
	old := idleSwap
	idleSwap = 0
	t.Cleanup(func() { idleSwap = old })
	s := newFrameServer(t, true, Config{PingInterval: time.Hour, PeerPingMin: -1})
	rnd := rand.New(rand.NewPCG(1, 2))
	handed, held := handoffs.Load(), readAheadHeld.Load()
	for round := range 12 {
		var raw []byte
		var want []string
		pings := 0
		for range 1 + rnd.IntN(20) {
			size := []int{0, 1, 100, 125, 126, 1000, 65535, 65536, 70000}[rnd.IntN(9)]
			msg := make([]byte, size)
			for i := range msg {
				msg[i] = byte('a' + rnd.IntN(26))
			}
			want = append(want, string(msg))
			for rest, first := msg, true; ; first = false {
				n := len(rest)
				if n > 0 && rnd.IntN(3) == 0 {
					n = rnd.IntN(n + 1)
				}
				if rnd.IntN(3) == 0 {
					raw = frame(raw, true, websocket.PingMessage, []byte(fmt.Sprint("p", pings)), [4]byte{9, 8, 7, 6})
					pings++
				}
				op := byte(websocket.TextMessage)
				if !first {
					op = 0
				}
				var key [4]byte
				binary.LittleEndian.PutUint32(key[:], rnd.Uint32())
				fin := n == len(rest)
				raw = frame(raw, fin, op, rest[:n], key)
				rest = rest[n:]
				if fin {
					break
				}
			}
		}
		got, back, _ := s.session(t, raw, rnd)
		if len(got) != len(want) {
			t.Fatalf("round %d: read %d messages; want %d (closed %d)", round, len(got), len(want), closeCode(back))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("round %d: message %d is %d bytes %.20q; want %d bytes %.20q", round, i, len(got[i]), got[i], len(want[i]), want[i])
			}
		}
		var pongs []string
		for _, f := range back {
			if f[0] == websocket.PongMessage {
				pongs = append(pongs, string(f[1:]))
			}
		}
		if len(pongs) != pings {
			t.Fatalf("round %d: %d pongs; want %d", round, len(pongs), pings)
		}
		for i, p := range pongs {
			if p != fmt.Sprint("p", i) {
				t.Fatalf("round %d: pong %d is %q", round, i, p)
			}
		}
	}
	if handoffs.Load() == handed {
		t.Error("no reader handed its wait to a new goroutine")
	}
	// Every connection closed: no read buffer is held.
	if n := readAheadHeld.Load(); n != held {
		t.Fatalf("%d read buffers held after the connections closed; %d before", n, held)
	}
}

// TestFrameReaderRefusals: a frame the protocol forbids ends the
// connection with gorilla's close code, after the messages before it.
func TestFrameReaderRefusals(t *testing.T) {
	s := newFrameServer(t, true, Config{PingInterval: time.Hour, Limits: envelope.Limits{MaxBytes: 1000, MaxDepth: 8}})
	k := [4]byte{1, 2, 3, 4}
	ok := frame(nil, true, websocket.TextMessage, []byte("ok"), k)
	unmasked := []byte{0x81, 0x02, 'h', 'i'}
	withCode := func(code int, text string) []byte {
		return frame(nil, true, websocket.CloseMessage, append(binary.BigEndian.AppendUint16(nil, uint16(code)), text...), k)
	}
	for _, tc := range []struct {
		name string
		raw  []byte
		code int
	}{
		{"unmasked", unmasked, websocket.CloseProtocolError},
		{"RSV1", append([]byte{0xc1}, frame(nil, true, 1, []byte("x"), k)[1:]...), websocket.CloseProtocolError},
		{"opcode 3", frame(nil, true, 3, nil, k), websocket.CloseProtocolError},
		{"opcode 11", frame(nil, true, 11, nil, k), websocket.CloseProtocolError},
		{"ping of 126 bytes", frame(nil, true, websocket.PingMessage, make([]byte, 126), k), websocket.CloseProtocolError},
		{"fragmented ping", frame(nil, false, websocket.PingMessage, nil, k), websocket.CloseProtocolError},
		{"continuation first", frame(nil, true, 0, []byte("x"), k), websocket.CloseProtocolError},
		{"text inside a message", append(frame(nil, false, 1, []byte("x"), k), frame(nil, true, 1, []byte("y"), k)...), websocket.CloseProtocolError},
		{"over the limit", frame(nil, true, 1, make([]byte, 2025), k), websocket.CloseMessageTooBig},
		{"over the limit in fragments", append(frame(nil, false, 1, make([]byte, 1000), k), frame(nil, true, 0, make([]byte, 1025), k)...), websocket.CloseMessageTooBig},
		{"close 1005 sent", withCode(1005, ""), websocket.CloseProtocolError},
		{"close 999", withCode(999, ""), websocket.CloseProtocolError},
		{"close reason not UTF-8", withCode(1000, "\xff"), websocket.CloseProtocolError},
		{"close 4000", withCode(4000, "bye"), 4000},
		{"close 1001", withCode(1001, ""), 1001},
		{"close without a code", frame(nil, true, websocket.CloseMessage, nil, k), 0},
		// 1 byte, then 2^63-1: the sum must not wrap past the limit.
		{"lengths that overflow", append(frame(nil, false, 1, []byte("x"), k), 0x80, 0xff, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1, 2, 3, 4, 'a', 'b'), websocket.CloseMessageTooBig},
		{"a 64-bit length with its top bit set", []byte{0x81, 0xff, 0x80, 0, 0, 0, 0, 0, 0, 1, 1, 2, 3, 4}, websocket.CloseProtocolError},
	} {
		got, back, _ := s.session(t, append(append([]byte(nil), ok...), tc.raw...), rand.New(rand.NewPCG(3, 4)))
		if len(got) != 1 || got[0] != "ok" {
			t.Errorf("%s: read %q; want the message before it", tc.name, got)
		}
		code := closeCode(back)
		if tc.code == 0 {
			// An empty close is echoed empty (RFC 6455 5.5.1).
			found := false
			for _, f := range back {
				found = found || f[0] == websocket.CloseMessage && len(f) == 1
			}
			if !found {
				t.Errorf("%s: frames back %q; want an empty close", tc.name, back)
			}
			continue
		}
		if code != tc.code {
			t.Errorf("%s: closed %d; want %d", tc.name, code, tc.code)
		}
	}
}

// FuzzFrameReader feeds the same bytes, after a handshake, to a Conn
// that reads with its frameReader and to one that gorilla reads: both
// must read the same messages and answer the same pings. Known
// difference: a 64-bit length with its top bit set (gorilla closes
// 1000, this reader 1002); both refuse it.
func FuzzFrameReader(f *testing.F) {
	k := [4]byte{0x11, 0x22, 0x33, 0x44}
	f.Add(frame(nil, true, 1, []byte(`{"a":1}`), k))
	f.Add(append(frame(nil, false, 2, []byte("ab"), k), append(frame(nil, true, 9, []byte("p"), k), frame(nil, true, 0, []byte("cd"), k)...)...))
	f.Add(frame(nil, true, 1, make([]byte, 300), k))
	f.Add(frame(nil, true, 8, []byte{3, 232, 'x'}, k))
	f.Add([]byte{0x81, 0xff, 0x80, 0, 0, 0, 0, 0, 0, 1, 1, 2, 3, 4})
	f.Add([]byte{0x81, 0xfe, 0x04})
	mine := newFrameServer(f, true, Config{PingInterval: time.Hour, Limits: envelope.Limits{MaxBytes: 64, MaxDepth: 8}})
	theirs := newFrameServer(f, false, Config{PingInterval: time.Hour, Limits: envelope.Limits{MaxBytes: 64, MaxDepth: 8}})
	f.Fuzz(func(t *testing.T, raw []byte) {
		if len(raw) > 4096 {
			return
		}
		got, back, why := mine.session(t, raw, rand.New(rand.NewPCG(uint64(len(raw)), 1)))
		want, wantBack, _ := theirs.session(t, raw, rand.New(rand.NewPCG(uint64(len(raw)), 1)))
		if strings.Join(got, "\x00|") != strings.Join(want, "\x00|") || len(got) != len(want) {
			t.Fatalf("read %q; gorilla read %q", got, want)
		}
		pongs := func(back [][]byte) [][]byte {
			var p [][]byte
			for _, f := range back {
				if f[0] == websocket.PongMessage {
					p = append(p, f)
				}
			}
			return p
		}
		if p, q := pongs(back), pongs(wantBack); len(p) != len(q) {
			t.Fatalf("%d pongs; gorilla %d", len(p), len(q))
		} else {
			for i := range p {
				if !bytes.Equal(p[i], q[i]) {
					t.Fatalf("pong %d is %q; gorilla's %q", i, p[i], q[i])
				}
			}
		}
		c, w := closeCode(back), closeCode(wantBack)
		known := w == websocket.CloseNormalClosure && c == websocket.CloseProtocolError && strings.Contains(why, "invalid payload length")
		if c != w && !known {
			t.Fatalf("closed %d (%s); gorilla %d", c, why, w)
		}
	})
}

// TestFrameReaderStalledHeaderHoldsLittle: a peer that stops in the
// middle of a frame's header makes its reader wait with those bytes in a
// 256-byte buffer, not a 64 KiB one; the frame reads whole once the rest
// comes.
func TestFrameReaderStalledHeaderHoldsLittle(t *testing.T) {
	s := newFrameServer(t, true, Config{PingInterval: time.Hour})
	// The count before the dial: the new connection's reader may still
	// hold the buffer its handshake was read with when dial returns, and
	// give it back only at its first wait.
	held := readAheadHeld.Load()
	nc, _, rec := s.dial(t)
	msg := frame(nil, true, websocket.TextMessage, []byte(strings.Repeat("x", 300)), [4]byte{5, 6, 7, 8})
	before := carried.Load()
	if _, err := nc.Write(msg[:3]); err != nil { // the header is 8 bytes
		t.Fatal(err)
	}
	for i := 0; carried.Load() == before; i++ {
		if i == 5000 {
			t.Fatal("the reader did not wait with the header's first bytes")
		}
		time.Sleep(time.Millisecond)
	}
	// The large buffer went back before the carry was counted; a reader
	// that waited with one would keep the count above held for good.
	for i := 0; readAheadHeld.Load() != held; i++ {
		if i == 5000 {
			t.Fatalf("%d read buffers held while the reader waits mid-header; want %d", readAheadHeld.Load(), held)
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := nc.Write(msg[3:]); err != nil {
		t.Fatal(err)
	}
	rec.waitMessage(t)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.got) != 1 || rec.got[0] != strings.Repeat("x", 300) {
		t.Fatalf("read %d messages, the first %.40q", len(rec.got), rec.got)
	}
}

// TestIdleReaderStackStays: a reader that handed its wait to a new
// goroutine (after a message, idleSwap 0) reads pongs and answers pings
// without growing that goroutine's 2 KiB stack and without handing over
// again: an idle link costs a ping's two system calls, not a goroutine
// start and a stack copy per ping.
func TestIdleReaderStackStays(t *testing.T) {
	old := idleSwap
	idleSwap = 0
	t.Cleanup(func() { idleSwap = old })
	s := newFrameServer(t, true, Config{PingInterval: time.Hour, PeerPingMin: -1})
	s.bp = true
	const n = 256 // stacks are counted in 32 KiB spans: growth of 2 KiB a reader shows as 512 KiB
	k := [4]byte{3, 1, 4, 1}
	handed := handoffs.Load()
	readers := make([]*bufio.Reader, n)
	conns := make([]net.Conn, n)
	recs := make([]*served, n)
	for i := range n {
		nc, br, rec := s.dial(t)
		conns[i], readers[i], recs[i] = nc, br, rec
		if _, err := nc.Write(frame(nil, true, websocket.TextMessage, []byte("call"), k)); err != nil {
			t.Fatal(err)
		}
		rec.waitMessage(t)
	}
	// Each reader hands its wait over once the message is read; the
	// counter is the only sign of it.
	for i := 0; handoffs.Load() < handed+n; i++ {
		if i == 5000 {
			t.Fatalf("%d of %d readers handed their wait over", handoffs.Load()-handed, n)
		}
		time.Sleep(time.Millisecond)
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	handed = handoffs.Load()
	for round := range 3 {
		for i, nc := range conns {
			// Heard from long ago: the ping moves the read deadline, as
			// an idle link's every ping does (heardFrom).
			recs[i].c.heard.Store(1)
			// A pong (as from a peer this side pings), then a ping: its
			// answer shows the pong was read.
			payload := []byte(fmt.Sprint("p", round, i))
			raw := frame(nil, true, websocket.PongMessage, []byte("unasked"), k)
			if _, err := nc.Write(frame(raw, true, websocket.PingMessage, payload, k)); err != nil {
				t.Fatal(err)
			}
			var h [2]byte
			if _, err := io.ReadFull(readers[i], h[:]); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, h[1]&0x7f)
			if _, err := io.ReadFull(readers[i], got); err != nil {
				t.Fatal(err)
			}
			if h[0]&0x0f != websocket.PongMessage || string(got) != string(payload) {
				t.Fatalf("answer to ping %q: opcode %d %q", payload, h[0]&0x0f, got)
			}
		}
	}
	runtime.ReadMemStats(&after) // no collection since: a grown stack is not shrunk yet
	if h := handoffs.Load() - handed; h != 0 {
		t.Errorf("%d waits handed over after pings; want 0", h)
	}
	if race.Enabled {
		t.Logf("stacks %+d KiB across %d readers (race detector: frames are larger, not judged)", (int64(after.StackInuse)-int64(before.StackInuse))>>10, n)
		return
	}
	// A reader whose pong outgrew 2 KiB would hold 4: 512 KiB more here.
	if grew := int64(after.StackInuse) - int64(before.StackInuse); grew >= n<<10 {
		t.Errorf("stacks grew %d KiB across %d readers reading pongs and answering pings; want < %d KiB", grew>>10, n, n)
	}
}
