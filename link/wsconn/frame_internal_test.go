package wsconn

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// TestWireFramesBothWays: what this side frames (frame.go) reads back
// through gorilla's reader, which refuses a client's unmasked frame and a
// server's masked one: every length encoding (7-bit, 16-bit, 64-bit),
// single messages, native batches (JSON and binary) and groups of plain
// messages, from the accepting end and from the dialling end; then pings,
// pongs and the close frame, after which nothing more is written.
func TestWireFramesBothWays(t *testing.T) {
	sizes := []int{0, 1, 125, 126, 127, 1000, 65535, 65536, 70000, 300 << 10} // 10 messages
	payload := func(n, salt int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte('a' + (i*7+salt)%26)
		}
		return b
	}
	frames := func(ns ...int) []*[]byte {
		var out []*[]byte
		for i, n := range ns {
			b := GetBuf()
			*b = append(*b, payload(n, i)...)
			out = append(out, b)
		}
		return out
	}
	for _, dir := range []string{"server", "client"} {
		t.Run(dir, func(t *testing.T) {
			accepted, dialled := acceptedPair(t, nil)
			from, to := accepted, dialled
			if dir == "client" {
				from, to = dialled, accepted
			}
			c := NewConn(from, Config{})
			if c.wire.server != (dir == "server") {
				t.Fatalf("wire.server = %v for the %s end", c.wire.server, dir)
			}
			to.SetReadLimit(4 << 20)
			// The peer reads the 15 data messages all along (a write as
			// large as the kernel's buffers must not wait for the test to
			// read them); the control frames the test reads itself.
			type msg struct {
				typ  int
				data []byte
			}
			msgs := make(chan msg, 32)
			go func() {
				defer close(msgs)
				_ = to.SetReadDeadline(time.Now().Add(10 * time.Second))
				for range 15 { // the data messages written below
					typ, data, err := to.ReadMessage()
					if err != nil {
						return
					}
					msgs <- msg{typ, data}
				}
			}()
			read := func(want []byte, typ int) {
				t.Helper()
				m, ok := <-msgs
				if !ok {
					t.Fatal("the peer's reader ended early")
				}
				gt, got := m.typ, m.data
				if gt != typ || !bytes.Equal(got, want) {
					t.Fatalf("read type %d, %d bytes; want type %d, %d bytes (equal: %v)", gt, len(got), typ, len(want), bytes.Equal(got, want))
				}
			}
			for _, n := range sizes {
				if err := c.writeFrames(frames(n)); err != nil {
					t.Fatal(err)
				}
				read(payload(n, 0), websocket.TextMessage)
			}
			// Plain messages queued together: one write, each its own message.
			if err := c.writeFrames(frames(3, 200, 70000)); err != nil {
				t.Fatal(err)
			}
			for i, n := range []int{3, 200, 70000} {
				read(payload(n, i), websocket.TextMessage)
			}
			// A native batch: one JSON array.
			c.batch = true
			if err := c.writeFrames(frames(5, 130, 66000)); err != nil {
				t.Fatal(err)
			}
			read([]byte(fmt.Sprintf("[%s,%s,%s]", payload(5, 0), payload(130, 1), payload(66000, 2))), websocket.TextMessage)
			// Binary: frames back to back in one binary message.
			c.binary, c.msgType = true, websocket.BinaryMessage
			if err := c.writeFrames(frames(7, 9)); err != nil {
				t.Fatal(err)
			}
			read(append(payload(7, 0), payload(9, 1)...), websocket.BinaryMessage)

			if _, ok := <-msgs; ok {
				t.Fatal("more messages than written")
			}
			// Control frames: a ping, with its data, then the close.
			ping := make(chan string, 1)
			to.SetPingHandler(func(s string) error { ping <- s; return nil })
			if err := writeControl(c, websocket.PingMessage, []byte("tick"), time.Now().Add(time.Second)); err != nil {
				t.Fatal(err)
			}
			if err := writeControl(c, websocket.CloseMessage, websocket.FormatCloseMessage(4001, "bye"), time.Now().Add(time.Second)); err != nil {
				t.Fatal(err)
			}
			if err := c.writeMessage([]byte("after close")); !errors.Is(err, websocket.ErrCloseSent) {
				t.Fatalf("a message after the close frame: %v; want ErrCloseSent", err)
			}
			_ = to.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, _, err := to.ReadMessage()
			var ce *websocket.CloseError
			if !errors.As(err, &ce) || ce.Code != 4001 || ce.Text != "bye" {
				t.Fatalf("after the ping: %v; want close 4001 bye", err)
			}
			if s := <-ping; s != "tick" {
				t.Fatalf("ping %q; want tick", s)
			}
		})
	}
}

// TestMaskFrom: the word-at-a-time masking equals RFC 6455's byte rule
// at every length around the word size.
func TestMaskFrom(t *testing.T) {
	for n := range 40 {
		key := []byte{0x12, 0x9a, 0xfe, 0x01}
		b := append(append([]byte{0xff}, key...), bytes.Repeat([]byte{0x5c}, n)...)
		maskFrom(b, 1)
		for i, v := range b[5:] {
			if want := byte(0x5c) ^ key[i%4]; v != want {
				t.Fatalf("n=%d byte %d: %#x; want %#x", n, i, v, want)
			}
		}
	}
}
