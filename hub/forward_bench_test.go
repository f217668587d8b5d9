package hub_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/envelope/binframe"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
)

// BenchmarkHubForward measures the hub alone on a routed call: its
// allocations per call are the benchmark's (allocs/op), because nothing
// else in this process allocates per call. The echo agent runs in another
// process (this test binary re-executed: benchAgentMain), and the caller
// here is a raw WebSocket that writes pre-encoded native request frames
// and reads the answers into one buffer, with no allocation of its own.
//
//	go test -run '^$' -bench HubForward -benchmem -count 6 ./hub | tee new.txt
//
// serial is one call at a time; pipelined16 writes 16 requests (seqs
// 1..16) in one message, a batch, and reads their 16 answers: an op is 16
// calls (ns/call is per call; divide allocs/op by 16).
func BenchmarkHubForward(b *testing.B) {
	m := meshtest.Start(b, hub.Config{})
	stop := startBenchAgent(b, m.WS)
	defer stop()
	b.Run("serial", func(b *testing.B) {
		rc := dialRaw(b, m.WS)
		defer rc.Close()
		req := rc.requests(1)
		rc.roundTrip(b, req, 1) // warm: the first call finds the route
		b.ReportAllocs()
		reportCPU(b)
		b.ResetTimer()
		for b.Loop() {
			rc.roundTrip(b, req, 1)
		}
	})
	b.Run("jsonrpc/serial", func(b *testing.B) {
		// The same call as plain JSON-RPC 2.0 over /ws (no subprotocol):
		// parsed at ingress, then the same route.
		rc := dialRawJSONRPC(b, m.WS)
		defer rc.Close()
		req := frameMasked([]byte(`{"jsonrpc":"2.0","id":1,"method":"echo.echo","params":` + string(testkit.Payload128) + `}`))
		rc.roundTripMarked(b, req, 1, `"jsonrpc"`)
		b.ReportAllocs()
		reportCPU(b)
		b.ResetTimer()
		for b.Loop() {
			rc.roundTripMarked(b, req, 1, `"jsonrpc"`)
		}
	})
	const pipe = 16
	b.Run("jsonrpc/pipelined16", func(b *testing.B) {
		// 16 plain JSON-RPC calls, each its own message, in one write:
		// beside pipelined16 (one native message of 16 frames), what a
		// message costs the hub when a client cannot batch calls into one.
		rc := dialRawJSONRPC(b, m.WS)
		defer rc.Close()
		var req []byte
		for i := range pipe {
			req = append(req, frameMasked([]byte(`{"jsonrpc":"2.0","id":`+strconv.Itoa(i+1)+`,"method":"echo.echo","params":`+string(testkit.Payload128)+`}`))...)
		}
		rc.roundTripMarked(b, req, pipe, `"jsonrpc"`)
		b.ReportAllocs()
		reportCPU(b)
		b.ResetTimer()
		for b.Loop() {
			rc.roundTripMarked(b, req, pipe, `"jsonrpc"`)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(pipe*b.N), "ns/call")
	})
	for _, n := range []int{1, pipe} {
		// The binary frames (agentmesh.v2), as the SDKs speak them: the
		// hub forwards params and results without looking at them.
		name := "v2/serial"
		if n > 1 {
			name = "v2/pipelined16"
		}
		b.Run(name, func(b *testing.B) {
			rc := dialRawWith(b, m.WS, websocket.Dialer{Subprotocols: []string{envelope.SubprotocolV2}})
			defer rc.Close()
			req := requestsV2(n)
			rc.roundTripV2(b, req, n, true)
			b.ReportAllocs()
			reportCPU(b)
			b.ResetTimer()
			for b.Loop() {
				rc.roundTripV2(b, req, n, false)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n*b.N), "ns/call")
		})
	}
	b.Run("pipelined16", func(b *testing.B) {
		rc := dialRaw(b, m.WS)
		defer rc.Close()
		req := rc.requests(pipe)
		rc.roundTrip(b, req, pipe)
		b.ReportAllocs()
		reportCPU(b)
		b.ResetTimer()
		for b.Loop() {
			rc.roundTrip(b, req, pipe)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(pipe*b.N), "ns/call")
	})
}

// benchAgentEnv carries the hub's /ws URL to the agent process.
const benchAgentEnv = "AGENTMESH_BENCH_AGENT"

func init() { helperMains = append(helperMains, benchAgentMain) }

// benchAgentMain, in the agent process, runs an echo agent on the hub
// named by benchAgentEnv, prints "ready" once registered and stops when
// its stdin closes; in any other process it returns at once.
func benchAgentMain() {
	url := os.Getenv(benchAgentEnv)
	if url == "" {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	a := agents.NewEcho()
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx, url) }()
	select {
	case <-a.Registered():
		fmt.Println("ready")
	case err := <-done:
		fmt.Fprintln(os.Stderr, "bench agent:", err)
		os.Exit(2)
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	cancel()
	<-done
	os.Exit(0)
}

// startBenchAgent starts the agent process and waits for it to register.
func startBenchAgent(b *testing.B, ws string) (stop func()) {
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), benchAgentEnv+"="+ws)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	stop = func() { stdin.Close(); _ = cmd.Wait() }
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		stop()
		b.Fatalf("bench agent: %q, %v", line, err)
	}
	return stop
}

// rawConn is a native link's client end written by hand: masked frames
// out (with a zero mask, so the payload goes as is), whole messages in.
type rawConn struct {
	net.Conn
	in []byte
	h  [140]byte // a frame header, or a pong (here, not on the stack: it would escape through the interface)
}

func dialRaw(b *testing.B, ws string) *rawConn {
	return dialRawWith(b, ws, websocket.Dialer{Subprotocols: []string{envelope.Subprotocol}})
}

// dialRawJSONRPC dials a plain JSON-RPC WebSocket (no subprotocol).
func dialRawJSONRPC(b *testing.B, ws string) *rawConn { return dialRawWith(b, ws, websocket.Dialer{}) }

func dialRawWith(b *testing.B, ws string, d websocket.Dialer) *rawConn {
	c, _, err := d.Dial(ws, nil)
	if err != nil {
		b.Fatal(err)
	}
	return &rawConn{Conn: c.UnderlyingConn(), in: make([]byte, 0, 64<<10)}
}

// requests returns one message carrying n echo.echo requests with seqs
// 1..n (a JSON-array batch when n > 1), framed and masked, 10 s ttl.
func (rc *rawConn) requests(n int) []byte {
	var msg []byte
	if n > 1 {
		msg = append(msg, '[')
	}
	for i := range n {
		if i > 0 {
			msg = append(msg, ',')
		}
		r := envelope.Request{ID: "bench-" + strconv.Itoa(i), Method: "echo.echo", Params: testkit.Payload128}
		r.Headers.TTL = 10000
		msg = envelope.AppendRequestFrame(msg, uint64(i+1), &r)
	}
	if n > 1 {
		msg = append(msg, ']')
	}
	return frameMasked(msg)
}

// requestsV2 is requests in binary frames: one binary message of n
// frames back to back.
func requestsV2(n int) []byte {
	var msg []byte
	for i := range n {
		r := envelope.Request{ID: "bench-" + strconv.Itoa(i), Method: "echo.echo", Params: testkit.Payload128}
		r.Headers.TTL = 10000
		msg = binframe.AppendRequest(msg, uint64(i+1), &r)
	}
	f := frameMasked(msg)
	f[0] = 0x82 // FIN, binary
	return f
}

// roundTripV2 writes req and reads binary messages until n frames came;
// check decodes them and fails on anything but the echo (the loop only
// counts them, so that the caller allocates nothing).
func (rc *rawConn) roundTripV2(b *testing.B, req []byte, n int, check bool) {
	if _, err := rc.Write(req); err != nil {
		b.Fatal(err)
	}
	for got := 0; got < n; {
		msg, err := rc.readMessage()
		if err != nil {
			b.Fatal(err)
		}
		if check {
			binframe.Each(msg, envelope.Limits{}, true, new(envelope.Frame), func(f *envelope.Frame, e *envelope.Error) {
				if e != nil || f.Err != nil || !bytes.Equal(f.Response.Result, testkit.Payload128) {
					b.Fatalf("answer %+v %v", f, e)
				}
			})
		}
		for len(msg) >= 4 {
			msg = msg[4+int(binary.BigEndian.Uint32(msg)):]
			got++
		}
	}
}

// frameMasked frames msg as one masked text frame (a zero mask).
func frameMasked(msg []byte) []byte {
	f := []byte{0x81} // FIN, text
	switch l := len(msg); {
	case l < 126:
		f = append(f, 0x80|byte(l))
	case l < 1<<16:
		f = append(f, 0x80|126, byte(l>>8), byte(l))
	default:
		f = append(f, 0x80|127)
		f = binary.BigEndian.AppendUint64(f, uint64(l))
	}
	f = append(f, 0, 0, 0, 0) // the mask: zero
	return append(f, msg...)
}

// roundTrip writes req and reads messages until n responses came.
func (rc *rawConn) roundTrip(b *testing.B, req []byte, n int) {
	rc.roundTripMarked(b, req, n, `"type":"res"`)
}

// roundTripMarked is roundTrip for answers that each carry marker once.
func (rc *rawConn) roundTripMarked(b *testing.B, req []byte, n int, marker string) {
	if _, err := rc.Write(req); err != nil {
		b.Fatal(err)
	}
	for got := 0; got < n; {
		msg, err := rc.readMessage()
		if err != nil {
			b.Fatal(err)
		}
		k := bytes.Count(msg, []byte(marker))
		if k == 0 || bytes.Contains(msg, []byte(`"error"`)) {
			b.Fatalf("answer %.300q", msg)
		}
		got += k
	}
}

// readMessage reads one unmasked server message (its fragments joined).
func (rc *rawConn) readMessage() ([]byte, error) {
	rc.in = rc.in[:0]
	for {
		h := rc.h[:]
		if _, err := io.ReadFull(rc.Conn, h[:2]); err != nil {
			return nil, err
		}
		if h[1]&0x80 != 0 {
			return nil, fmt.Errorf("frame header %x: masked", h[:2])
		}
		fin, op := h[0]&0x80 != 0, h[0]&0x0f
		l := uint64(h[1] & 0x7f)
		switch l {
		case 126:
			if _, err := io.ReadFull(rc.Conn, h[:2]); err != nil {
				return nil, err
			}
			l = uint64(binary.BigEndian.Uint16(h[:2]))
		case 127:
			if _, err := io.ReadFull(rc.Conn, h[:8]); err != nil {
				return nil, err
			}
			l = binary.BigEndian.Uint64(h[:8])
		}
		n := len(rc.in)
		if uint64(n)+l > uint64(cap(rc.in)) {
			return nil, fmt.Errorf("message over %d bytes", cap(rc.in))
		}
		rc.in = rc.in[:n+int(l)]
		if _, err := io.ReadFull(rc.Conn, rc.in[n:]); err != nil {
			return nil, err
		}
		if op >= 8 { // a control frame: a ping gets its pong
			ctl := rc.in[n:]
			rc.in = rc.in[:n]
			if op == 9 {
				if len(ctl) > 125 {
					return nil, fmt.Errorf("ping of %d bytes", len(ctl))
				}
				pong := append(append(rc.h[:0], 0x8a, 0x80|byte(len(ctl)), 0, 0, 0, 0), ctl...)
				if _, err := rc.Write(pong); err != nil {
					return nil, err
				}
			}
			continue
		}
		if fin {
			return rc.in, nil
		}
	}
}
