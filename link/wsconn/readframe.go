package wsconn

import (
	"encoding/binary"
	"io"
	"strconv"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/mono"
)

// frameReader reads the WebSocket frames (RFC 6455 §5) of a connection
// this side accepted, in place from its readAhead's pooled buffer, which
// it holds only while bytes are in it: gorilla's reader copied every
// small frame through its own buffer, then into the scratch buffer, and
// allocated a reader per message.
//
// Owning the reader also lets an idle connection give its reader
// goroutine back. A reader that ran calls has grown its stack to 4 or 8
// KiB, and the runtime never shrinks a stack that waits in a read below
// half of it (the wait itself uses more than a quarter of 2 KiB). So a
// reader that finds nothing to read, at a message's end, idleSwap after
// the last message, starts a new goroutine (a 2 KiB stack) to wait for
// the socket and exits (Conn.readLoop): an idle link holds one small
// goroutine and no buffer. It does so once per message that came since
// its goroutine started, not per ping: the reader waits for the socket
// and answers a ping from its loop's own frame (readLoop), a path that
// fits the fresh goroutine's 2 KiB, so that pings alone never grow it.
//
// Control frames are handled as gorilla's reader handles them (the
// connection's ping, pong and close handlers); their errors and a
// protocol violation end the read with the close code gorilla would
// send.
type frameReader struct {
	ra    *readAhead
	limit int64 // message bytes past which the read fails (close 1009)
	// The data frame being read: its payload bytes not yet read, its
	// mask and the mask's position, whether it ends its message.
	remain int64
	key    [4]byte
	pos    int
	fin    bool
	total  int64 // the message's bytes so far
	// lastMsg (mono) is when the last data message was read: a reader
	// idle for idleSwap hands its wait to a new goroutine, if a data
	// message came (ran) since this one started.
	lastMsg int64
	ran     bool
	// A ping read and not yet answered, a pong read and not yet noted:
	// next stops at them, and readLoop handles them from its own frame
	// (the shallow path that keeps an idle reader's stack at 2 KiB).
	pinged, ponged bool
	ping           string
}

// idleSwap is how long after its last message a connection's reader
// hands its wait to a fresh goroutine: a link that carries calls never
// does (a goroutine start per call would cost more than the stack it
// saves), one that goes idle does once. A variable for tests (0: every
// wait after a message is handed over).
var idleSwap = time.Second

// handoffs counts the waits handed to a new goroutine (tests).
var handoffs atomic.Int64

// maxControl is the largest control frame payload (RFC 6455 §5.5).
const maxControl = 125

// newFrameReader reads the connection ws accepted through a CapListener
// (whose readAhead buffers it), or returns nil: a connection under TLS,
// or one this side dialled, is read through gorilla.
func newFrameReader(ws *websocket.Conn, limit int) *frameReader {
	cc, ok := ws.NetConn().(*cappedConn)
	if !ok || !isServer(ws) {
		return nil
	}
	return &frameReader{ra: &cc.readAhead, limit: int64(limit), fin: true, lastMsg: mono.Now()}
}

// idle reports whether the reader should hand its wait to a new
// goroutine: nothing is buffered or in the socket, and the last message,
// which came since this goroutine started, came idleSwap ago or more. A
// connection with no RawConn never does.
func (fr *frameReader) idle() (bool, error) {
	if fr.ra.raw == nil || fr.ra.buf != nil || !fr.ran || mono.Now()-fr.lastMsg < int64(idleSwap) {
		return false, nil
	}
	got, err := fr.ra.fill(false)
	return !got && err == nil, err
}

// between reports whether the reader is between messages with nothing
// buffered.
func (fr *frameReader) between() bool { return fr.fin && fr.ra.buf == nil }

// ensure makes at least n (≤ maxControl + 14) bytes buffered, waiting
// for the socket if need be.
func (fr *frameReader) ensure(n int) ([]byte, error) {
	for {
		b := fr.ra.buffered()
		if len(b) >= n {
			return b, nil
		}
		if _, err := fr.ra.fill(true); err != nil {
			return nil, err
		}
	}
}

// protocolError ends the read: the connection closes 1002.
func protocolError(text string) error {
	return &closeError{code: websocket.CloseProtocolError, text: "websocket: protocol error: " + text}
}

// noFrame is next's answer when it read only control frames, between
// messages, and nothing more is buffered: the reader checks whether it
// is idle before it waits.
const noFrame = -1

// next reads frame headers up to the next data frame, handling control
// frames on the way, and returns its opcode (or noFrame). Like gorilla,
// it judges a frame by its first two bytes, before it waits for the rest
// of its header.
func (fr *frameReader) next(c *Conn) (int, error) {
	for {
		b, err := fr.ensure(2)
		if err != nil {
			return 0, err
		}
		b0, b1 := b[0], b[1]
		op, fin := int(b0&0x0f), b0&0x80 != 0
		if err := fr.judge(b0, b1, op, fin); err != nil {
			return 0, err
		}
		n := 2 + 4 // a client's frames are masked (judge)
		switch b1 & 0x7f {
		case 126:
			n += 2
		case 127:
			n += 8
		}
		if b, err = fr.ensure(n); err != nil {
			return 0, err
		}
		size := int64(b1 & 0x7f)
		switch size {
		case 126:
			size = int64(binary.BigEndian.Uint16(b[2:]))
		case 127:
			size = int64(binary.BigEndian.Uint64(b[2:]))
			if size < 0 {
				return 0, protocolError("invalid payload length")
			}
		}
		var key [4]byte
		copy(key[:], b[n-4:n])
		fr.ra.take(n)
		switch op {
		case websocket.CloseMessage, websocket.PingMessage, websocket.PongMessage:
			if err := fr.control(c, op, int(size), key); err != nil {
				return 0, err
			}
			if fr.pinged || fr.ponged || fr.between() {
				return noFrame, nil // a ping or pong to handle; the reader may go idle (readLoop)
			}
			continue
		case websocket.TextMessage, websocket.BinaryMessage:
			fr.total = 0
		}
		if size > fr.limit-fr.total { // not total+size: 2^63-1 more would wrap
			return 0, &closeError{code: websocket.CloseMessageTooBig, text: "websocket: read limit exceeded"}
		}
		fr.total += size
		if fr.total > fr.limit {
			return 0, &closeError{code: websocket.CloseMessageTooBig, text: "websocket: read limit exceeded"}
		}
		fr.fin, fr.remain, fr.key, fr.pos = fin, size, key, 0
		return op, nil
	}
}

// settleControl handles the pong or ping next stopped at, if any: a pong
// moves the read deadline (as gorilla's pong handler does here); a ping
// gets the policy's check, then the pong (Conn.onPing), each called from
// this frame.
func (fr *frameReader) settleControl(c *Conn) error {
	if fr.ponged {
		fr.ponged = false
		if err := c.setReadDeadline(time.Now().Add(c.cfg.IdleTimeout)); err != nil {
			return err
		}
	}
	if !fr.pinged {
		return nil
	}
	ping := fr.ping
	fr.pinged, fr.ping = false, ""
	if err := c.heardPing(); err != nil {
		return err
	}
	return c.pong(ping)
}

// judge refuses a frame its first two bytes show the protocol forbids
// (RFC 6455 §5.2, §5.4, §5.5): close 1002.
func (fr *frameReader) judge(b0, b1 byte, op int, fin bool) error {
	if b0&0x70 != 0 {
		return protocolError("RSV bits set")
	}
	switch op {
	case websocket.CloseMessage, websocket.PingMessage, websocket.PongMessage:
		if b1&0x7f > maxControl {
			return protocolError("len > 125 for control")
		}
		if !fin {
			return protocolError("FIN not set on control")
		}
	case websocket.TextMessage, websocket.BinaryMessage:
		if !fr.fin {
			return protocolError("data before FIN")
		}
	case 0: // continuation
		if fr.fin {
			return protocolError("continuation after FIN")
		}
	default:
		return protocolError("bad opcode " + strconv.Itoa(op))
	}
	if b1&0x80 == 0 {
		return protocolError("bad MASK")
	}
	return nil
}

// control reads a control frame's payload and runs its handler; a ping's
// and a pong's are readLoop's to run (settleControl).
func (fr *frameReader) control(c *Conn, op, size int, key [4]byte) error {
	b, err := fr.ensure(size)
	if err != nil {
		return err
	}
	var buf [maxControl]byte
	p := buf[:size]
	copy(p, b)
	fr.ra.take(size)
	maskBytes(key, 0, p)
	switch op {
	case websocket.PingMessage:
		fr.pinged, fr.ping = true, string(p)
		return nil
	case websocket.PongMessage:
		fr.ponged = true
		return nil
	}
	code, text := websocket.CloseNoStatusReceived, ""
	if len(p) >= 2 {
		code = int(binary.BigEndian.Uint16(p))
		if !validCloseCode(code) {
			return protocolError("bad close code " + strconv.Itoa(code))
		}
		text = string(p[2:])
		if !utf8.ValidString(text) {
			return protocolError("invalid utf8 payload in close frame")
		}
	}
	// Echo the peer's close (RFC 6455 5.5.1), as Conn's gorilla handler
	// does.
	_ = writeControl(c, websocket.CloseMessage, websocket.FormatCloseMessage(code, ""), time.Now().Add(time.Second))
	return &websocket.CloseError{Code: code, Text: text}
}

// validCloseCode is gorilla's list of the codes a peer may send.
func validCloseCode(code int) bool {
	switch code {
	case websocket.CloseNormalClosure, websocket.CloseGoingAway, websocket.CloseProtocolError,
		websocket.CloseUnsupportedData, websocket.CloseInvalidFramePayloadData, websocket.ClosePolicyViolation,
		websocket.CloseMessageTooBig, websocket.CloseMandatoryExtension, websocket.CloseInternalServerErr,
		websocket.CloseServiceRestart, websocket.CloseTryAgainLater:
		return true
	}
	return code >= 3000 && code <= 4999
}

// msgReader reads the payload of the message whose first frame next
// returned, across its frames (and the control frames between them), to
// io.EOF at its end.
type msgReader struct {
	fr *frameReader
	c  *Conn
}

func (m msgReader) Read(p []byte) (int, error) {
	n, err := m.read(p)
	if err == io.EOF && (m.fr.remain > 0 || !m.fr.fin) {
		err = io.ErrUnexpectedEOF // the stream ended inside the message
	}
	return n, err
}

func (m msgReader) read(p []byte) (int, error) {
	fr := m.fr
	for fr.remain == 0 {
		if fr.fin {
			return 0, io.EOF
		}
		op, err := fr.next(m.c)
		if err == nil {
			err = fr.settleControl(m.c) // inside a message: at once
		}
		if err != nil {
			return 0, err
		}
		if op != 0 && op != noFrame {
			return 0, protocolError("data before FIN")
		}
	}
	if int64(len(p)) > fr.remain {
		p = p[:fr.remain]
	}
	var n int
	if b := fr.ra.buffered(); len(b) > 0 {
		n = copy(p, b)
		fr.ra.take(n)
	} else {
		var err error
		if n, err = fr.ra.readInto(p); err != nil {
			return 0, err
		}
	}
	fr.pos = maskBytes(fr.key, fr.pos, p[:n])
	fr.remain -= int64(n)
	return n, nil
}

// readLoop reads messages until the connection ends. resumed: this
// goroutine took over an idle reader's wait (frameReader), and waits for
// the socket first.
//
// Its own frame is kept small, and an idle reader's waits and pongs run
// from it, not from deep in the frame reader: a fresh goroutine's 2 KiB
// stack then holds them (TestIdleReaderStackStays).
func (c *Conn) readLoop(onMessage func([]byte, *envelope.Error), resumed bool) {
	defer c.wg.Done()
	if !resumed {
		c.readSetup()
	}
	for {
		if c.bp {
			if ok, _ := c.underBounds(); !ok {
				c.readerExit()
				return
			}
		}
		if c.fr != nil {
			park, err := c.fr.idle()
			if err != nil {
				c.Shutdown(err)
				c.readerExit()
				return
			}
			if park {
				// One hand-over per run of messages: the new goroutine
				// hands over again only after a message has grown its
				// stack (pings and pongs do not).
				c.fr.ran = false
				handoffs.Add(1)
				c.wg.Add(1) // under this goroutine's own count: Close waits for both
				go c.readLoop(onMessage, true)
				return
			}
			if c.fr.between() {
				// Between messages, nothing buffered: wait here. (A
				// frame cut short by the network is waited for deep in
				// the frame reader, ensure, which may grow the stack;
				// peers write a control frame whole.)
				if _, err := c.fr.ra.fill(true); err != nil {
					c.Shutdown(err)
					c.readerExit()
					return
				}
			}
		}
		typ, data, refused, err := c.readMessage()
		if err != nil {
			c.Shutdown(err)
			c.readerExit()
			return
		}
		if typ == noFrame {
			if err := c.fr.settleControl(c); err != nil {
				c.Shutdown(err)
				c.readerExit()
				return
			}
			continue
		}
		c.heardFrom()
		if c.cfg.Bytes != nil {
			c.cfg.Bytes(len(data), 0)
		}
		if typ != websocket.TextMessage && typ != websocket.BinaryMessage {
			continue
		}
		onMessage(data, refused)
	}
}

// readSetup is the first reader's: the read deadline and gorilla's
// handlers (a dialled connection's reader is gorilla's).
func (c *Conn) readSetup() {
	idle := c.cfg.IdleTimeout
	_ = c.setReadDeadline(time.Now().Add(idle))
	c.ws.SetPongHandler(func(string) error { return c.setReadDeadline(time.Now().Add(idle)) })
	c.ws.SetPingHandler(c.onPing)
	c.ws.SetCloseHandler(func(code int, _ string) error {
		// Echo the peer's close (RFC 6455 5.5.1), as gorilla's default
		// handler does, on this side's wire: Shutdown's own close frame
		// then finds it sent.
		_ = writeControl(c, websocket.CloseMessage, websocket.FormatCloseMessage(code, ""), time.Now().Add(time.Second))
		return nil
	})
}

// readMessage reads one message through a pooled scratch buffer and
// returns it in a slice of its exact size (decoded frames keep pointing
// into it, so it is not reused): one allocation per message, none for a
// message refused while it is read. A message refused by c.check comes
// back as its first envelope.RecoverHeadLen bytes, with the refusal.
func (c *Conn) readMessage() (int, []byte, *envelope.Error, error) {
	if c.fr != nil {
		return c.readFrames()
	}
	typ, r, err := c.ws.NextReader()
	if err != nil {
		return typ, nil, nil, err
	}
	var check func([]byte, envelope.Limits) *envelope.Error
	if typ == websocket.TextMessage || typ == websocket.BinaryMessage {
		check = c.check
	}
	pc, _ := c.ws.NetConn().(pacer) // not a TLS connection's: its reads are the TLS layer's
	buf, refused, err := readChecked(r, pc, c.cfg.Limits.MaxBytes+1024, check, c.cfg.Limits, envelope.RecoverHeadLen)
	return typ, buf, refused, err
}

// readFrames is readMessage for a connection with a frameReader: a
// message whose one frame is all in the buffer is unmasked and checked
// there and copied out once; any other goes through readChecked.
func (c *Conn) readFrames() (int, []byte, *envelope.Error, error) {
	fr := c.fr
	op, err := fr.next(c)
	if err != nil || op == noFrame {
		return op, nil, nil, err
	}
	fr.lastMsg, fr.ran = mono.Now(), true
	if b := fr.ra.buffered(); fr.fin && int64(len(b)) >= fr.remain {
		msg := b[:fr.remain]
		maskBytes(fr.key, 0, msg)
		fr.remain = 0
		var data []byte
		var refused *envelope.Error
		if c.check != nil {
			refused = c.check(msg, c.cfg.Limits)
		}
		if refused != nil {
			data = append([]byte(nil), msg[:min(len(msg), envelope.RecoverHeadLen)]...)
		} else {
			data = make([]byte, len(msg))
			copy(data, msg)
		}
		fr.ra.take(len(msg))
		return op, data, refused, nil
	}
	fr.ra.waits = 0 // pacing counts this message's reads only
	data, refused, err := readChecked(msgReader{fr, c}, fr.ra, int(fr.limit), c.check, c.cfg.Limits, envelope.RecoverHeadLen)
	return op, data, refused, err
}

// maskBytes applies the mask key to b from position pos in it (RFC 6455
// §5.3) and returns the position after b.
func maskBytes(key [4]byte, pos int, b []byte) int {
	if len(b) >= 8 {
		var k [8]byte
		for i := range k {
			k[i] = key[(pos+i)&3]
		}
		kw := binary.NativeEndian.Uint64(k[:])
		for len(b) >= 8 {
			binary.NativeEndian.PutUint64(b, binary.NativeEndian.Uint64(b)^kw)
			b = b[8:]
		}
	}
	for i := range b {
		b[i] ^= key[pos&3]
		pos++
	}
	return pos & 3
}
