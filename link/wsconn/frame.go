package wsconn

// The writing half of RFC 6455 is done here rather than by gorilla, which
// keeps the handshake and the reading half. Gorilla copies a message into
// a write buffer borrowed from its WriteBufferPool and gives the buffer
// back boxed in an interface: one allocation per message written, two per
// call a hub routes (the hub keeps no write buffer on an idle link, so it
// needs the pool). Here a message is framed into a pooled *[]byte, which
// goes back without boxing, and a batch of frames is one WebSocket frame
// in one write, where gorilla cut it into write-buffer-sized frames, a
// system call each.

import (
	"encoding/binary"
	"math/rand/v2"
	"net"
	"os"
	"reflect"
	"sync"
	"time"

	"github.com/gorilla/websocket"
)

// wire serializes what is written on a connection: one message at a time,
// and nothing after the close frame. Data messages (the writer, inline
// senders) and control frames (pings, pongs, the close) all go through
// it, so each write sets its own deadline undisturbed.
type wire struct {
	// sem holds one token, taken to write: a channel, not a mutex, so
	// that a control frame can wait for it with a deadline, and wake the
	// moment a data write gives it back.
	sem       chan struct{}
	closeSent bool // under sem
	server    bool // frames go out unmasked (RFC 6455 5.1)
}

func newWire(ws *websocket.Conn) wire {
	w := wire{sem: make(chan struct{}, 1), server: isServer(ws)}
	w.sem <- struct{}{}
	return w
}

// isServer reports whether ws is the accepting end: gorilla does not say,
// so its field is read (it has been isServer since gorilla's first
// release; TestWireFramesBothWays fails if that changes).
func isServer(ws *websocket.Conn) bool {
	f := reflect.ValueOf(ws).Elem().FieldByName("isServer")
	return f.IsValid() && f.Kind() == reflect.Bool && f.Bool()
}

// appendHeader appends the header of a final frame of type op carrying n
// bytes; mask is where the masking key went (-1 for a server's frame),
// to be applied once the n bytes follow (maskFrom).
func (w *wire) appendHeader(b []byte, op int, n int) (_ []byte, mask int) {
	b0 := byte(op) | 0x80 // FIN
	var mbit byte
	if !w.server {
		mbit = 0x80
	}
	switch {
	case n <= 125:
		b = append(b, b0, mbit|byte(n))
	case n <= 0xffff:
		b = append(b, b0, mbit|126)
		b = binary.BigEndian.AppendUint16(b, uint16(n))
	default:
		b = append(b, b0, mbit|127)
		b = binary.BigEndian.AppendUint64(b, uint64(n))
	}
	if w.server {
		return b, -1
	}
	// A client masks with a key its peer cannot predict (RFC 6455 10.3):
	// math/rand/v2's generator is ChaCha8, seeded from the system.
	b = binary.LittleEndian.AppendUint32(b, rand.Uint32())
	return b, len(b) - 4
}

// maskFrom masks what follows the key at mask (a client's frame).
func maskFrom(b []byte, mask int) {
	if mask < 0 {
		return
	}
	maskBytes([4]byte(b[mask:mask+4]), 0, b[mask+4:])
}

// appendMessage appends payload as one message of type op.
func (w *wire) appendMessage(b []byte, op int, payload []byte) []byte {
	return appendFrame(w, b, op, payload)
}

// appendFrame is appendMessage for a payload of either kind (a ping's
// is a string).
func appendFrame[P string | []byte](w *wire, b []byte, op int, payload P) []byte {
	b, mask := w.appendHeader(b, op, len(payload))
	b = append(b, payload...)
	maskFrom(b, mask)
	return b
}

// writeWire writes b, one or more whole frames (one control frame, if
// control), by deadline. Once a close frame went out, nothing more does.
func (c *Conn) writeWire(b []byte, deadline time.Time, control bool) error {
	select {
	case <-c.wire.sem:
	default:
		if err := c.waitWire(deadline, control); err != nil {
			return err
		}
	}
	var err error
	if c.wire.closeSent {
		err = websocket.ErrCloseSent
	} else {
		// First without a deadline, never waiting: the socket nearly
		// always has room, and a write deadline is a runtime timer set
		// per write that then fires (a second later for a pong: at
		// 10,000 idle links, 2,000 firings a second for nothing). Only
		// what did not fit waits, under the deadline, which is then
		// cleared.
		var n int
		n, err = c.tryWrite(b)
		if err == nil && n < len(b) {
			err = c.writeRest(b[n:], deadline)
		}
		if err != nil || control && len(b) > 0 && b[0]&0x0f == websocket.CloseMessage {
			c.wire.closeSent = true // after a failed write the stream is cut mid-frame: nothing may follow
		}
	}
	c.wire.sem <- struct{}{}
	return err
}

// waitWire takes the wire's token from another write in progress (a data
// write cannot block where the kernel's room is tracked, but may
// without). A data message waits for it; a control frame only until its
// own deadline, as gorilla's WriteControl did. Out of writeWire's line,
// as writeRest is: an idle reader answers a ping on a 2 KiB stack
// (TestIdleReaderStackStays).
//
//go:noinline
func (c *Conn) waitWire(deadline time.Time, control bool) error {
	if !control {
		<-c.wire.sem
		return nil
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-c.wire.sem:
		return nil
	case <-t.C:
		return errWriteTimeout
	}
}

// writeRest writes what the socket did not take at once, waiting for it
// until deadline.
//
//go:noinline
func (c *Conn) writeRest(b []byte, deadline time.Time) error {
	nc := c.ws.NetConn()
	_ = nc.SetWriteDeadline(deadline)
	_, err := nc.Write(b)
	if err == nil && c.wraw != nil {
		_ = nc.SetWriteDeadline(time.Time{})
	}
	return err
}

// tryWrite writes what of b the socket takes now, without waiting (under
// wire.sem); with no plain socket beneath, it writes nothing.
func (c *Conn) tryWrite(b []byte) (int, error) {
	if c.wraw == nil {
		return 0, nil
	}
	w := fdWrites.Get().(*fdWrite)
	w.b = b
	err := c.wraw.Write(w.fn)
	n, werr := w.n, w.err
	*w = fdWrite{fn: w.fn}
	fdWrites.Put(w)
	switch {
	case err != nil:
		return 0, err
	case werr != nil:
		return 0, sysError("write", c.ws.NetConn(), werr)
	}
	return n, nil
}

// sysError reports a raw read(2) or write(2)'s errno on nc as the
// net.Conn's own Read or Write would.
func sysError(op string, nc net.Conn, errno error) error {
	return &net.OpError{Op: op, Net: nc.LocalAddr().Network(), Source: nc.LocalAddr(), Addr: nc.RemoteAddr(), Err: os.NewSyscallError(op, errno)}
}

// fdWrite is one tryWrite: its buffer and outcome, and its write func
// bound once (a closure per write would be an allocation; fields of
// the Conn, 70 bytes more per idle link).
type fdWrite struct {
	b   []byte
	n   int
	err error                 // nil when the socket had no room (EAGAIN) or the call was interrupted
	fn  func(fd uintptr) bool // w.write
}

var fdWrites = sync.Pool{New: func() any {
	w := new(fdWrite)
	w.fn = w.write
	return w
}}

// writeControl writes a control frame (a ping, a pong, a close) of at
// most 125 bytes, waiting for a data write in progress until deadline.
func writeControl[P string | []byte](c *Conn, op int, data P, deadline time.Time) error {
	b := GetBuf() // a frame on the stack would escape with tryWrite's
	*b = appendFrame(&c.wire, *b, op, data[:min(len(data), maxControl)])
	err := c.writeWire(*b, deadline, true)
	PutBuf(b)
	return err
}

// writeMessage writes payload as one message of the connection's type.
func (c *Conn) writeMessage(payload []byte) error {
	b := GetBuf() // framed in the pool the queued frames come from
	*b = c.wire.appendMessage(*b, c.msgType, payload)
	err := c.writeWire(*b, time.Now().Add(c.cfg.WriteTimeout), false)
	PutBuf(b)
	return err
}

// errWriteTimeout is a control frame that found the connection busy
// writing past its deadline: a timeout, as a net.Conn's write would say.
var errWriteTimeout = &net.OpError{Op: "write", Net: "websocket", Err: os.ErrDeadlineExceeded}
