package multica

// The Multica surface over Socket.IO, the transport of Multica's own
// Gateway and of its SDK (GatewayClient, socket.io-client 4.x):
//
//	/socket.io/   Socket.IO's default path
//	/ws/          the path GatewayClient uses by default (the hub's own
//	              WebSocket is /ws, without the slash: no conflict)
//
// Engine.IO (long-polling, WebSocket, the upgrade between them, the
// heartbeat) is github.com/zishang520/socket.io/servers/engine; the
// Socket.IO packets on top of it are read here, so that a RoutedMessage
// reaches decodeMultica as the bytes the device sent (the library's own
// Socket.IO layer decodes into map[string]any: numbers become float64
// and a repeated key silently wins, which the WebSocket surface refuses).
//
// As Multica's Gateway does: the device names itself in the handshake's
// query (deviceId, deviceType); once connected to the main namespace it
// gets "registered" {success, deviceId, deviceType, hubDeviceId}; it sends
// RoutedMessages with the event "send" and receives them with "receive";
// a message the hub cannot take is answered with "send_error" {messageId,
// error, code, meshCode?} (a request still gets its response); "ping"
// and "list-devices" answer their acknowledgement. Everything a
// RoutedMessage does on GET /multica it does here (requests, chat turns
// and streams as "stream" actions), over the same table of devices: a
// Socket.IO device and a WebSocket device reach each other.
//
// With a key, the bearer token comes in the CONNECT packet's auth
// ({token}) or the handshake's Authorization header; without one the
// CONNECT is refused (connect_error, data.code UNAUTHENTICATED). Origins
// are the hub's: a browser from an origin not allowed is refused (403)
// on every request. A deviceId in use by another identity is refused
// with "registered" {success: false, error}, as Multica's Gateway does.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	engine "github.com/zishang520/socket.io/servers/engine/v3"
	"github.com/zishang520/socket.io/servers/engine/v3/config"
	"github.com/zishang520/socket.io/servers/engine/v3/transports"
	"github.com/zishang520/socket.io/v3/pkg/types"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/link"
)

// sioConnectTimeout closes an Engine.IO session that has not connected
// to the namespace by then (Socket.IO's own connectTimeout).
const sioConnectTimeout = 45 * time.Second

// sioCloseGrace bounds the wait for a DISCONNECT to be written.
const sioCloseGrace = 2 * time.Second

// mountSocketIO serves the surface over Socket.IO on s's hub.
func mountSocketIO(s *server) {
	h := s.h
	cfg := h.ConnConfig()
	opts := config.DefaultServerOptions()
	ping, idle := cfg.PingInterval, cfg.IdleTimeout
	if ping <= 0 {
		ping = 5 * time.Second
	}
	if idle <= ping {
		idle = 2 * ping
	}
	// The hub's heartbeat: a device that vanished is gone within the
	// links' IdleTimeout (Socket.IO's 25 s + 20 s would keep it 45 s).
	opts.SetPingInterval(ping)
	opts.SetPingTimeout(idle - ping)
	// One Engine.IO packet carries one Socket.IO packet: a RoutedMessage
	// within the hub's limit, and its framing.
	opts.SetMaxHttpBufferSize(int64(cfg.Limits.MaxBytes) + 1024)
	// Origins are checked before the library sees a request (serve):
	// those that pass get their CORS headers.
	opts.SetCors(&types.Cors{Origin: true, Credentials: true})
	eng := engine.NewServer(opts)
	_ = eng.On("connection", func(a ...any) {
		if es, ok := a[0].(engine.Socket); ok {
			s.sioSession(es)
		}
	})
	serve := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !h.CheckOrigin(r) {
			http.Error(w, "origin not allowed", http.StatusForbidden)
			return
		}
		if h.Draining() {
			http.Error(w, "hub is draining", http.StatusServiceUnavailable)
			return
		}
		eng.ServeHTTP(w, r)
	})
	h.Handle("/socket.io/", serve)
	h.Handle("/ws/", serve)
	h.Track(engineCloser{eng})
}

// engineCloser closes the Engine.IO server (its sessions) with the hub.
type engineCloser struct{ eng engine.Server }

func (c engineCloser) Close() { c.eng.Close() }

// sioPacket is a decoded Socket.IO packet (protocol 5, text only).
type sioPacket struct {
	typ  byte   // '0' CONNECT … '6' BINARY_ACK
	nsp  string // "/" unless named
	ack  int64  // -1: none
	data []byte // the JSON payload, if any
}

// parseSIO decodes one Socket.IO packet:
// <type>[<attachments>-][<namespace>,][<ack id>][<JSON>].
func parseSIO(b []byte) (sioPacket, error) {
	p := sioPacket{nsp: "/", ack: -1}
	if len(b) == 0 || b[0] < '0' || b[0] > '6' {
		return p, errors.New("not a Socket.IO packet: it must start with a packet type 0 to 6")
	}
	p.typ, b = b[0], b[1:]
	if p.typ == '5' || p.typ == '6' {
		return p, errors.New("binary attachments are not supported: send RoutedMessages as JSON")
	}
	if len(b) > 0 && b[0] == '/' {
		i := bytes.IndexByte(b, ',')
		if i < 0 {
			p.nsp, b = string(b), nil
		} else {
			p.nsp, b = string(b[:i]), b[i+1:]
		}
	}
	i := 0
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	if i > 0 {
		n, err := strconv.ParseInt(string(b[:i]), 10, 64)
		if err != nil || i > 15 {
			return p, errors.New("the acknowledgement id is out of range")
		}
		p.ack, b = n, b[i:]
	}
	p.data = b
	return p, nil
}

// sioSession is one Engine.IO session: before CONNECT it has no device.
type sioSession struct {
	s    *server
	es   engine.Socket
	conn *sioConn

	mu     sync.Mutex
	device *multicaDevice
	closed bool
}

// sioSession serves a new Engine.IO session.
func (s *server) sioSession(es engine.Socket) {
	ss := &sioSession{s: s, es: es, conn: newSIOConn(es, s.h.ConnConfig().QueueSize)}
	t := time.AfterFunc(sioConnectTimeout, func() {
		ss.mu.Lock()
		d := ss.device
		ss.mu.Unlock()
		if d == nil {
			es.Close(true)
		}
	})
	_ = es.On("message", func(a ...any) {
		if len(a) == 0 {
			return
		}
		switch m := a[0].(type) {
		case string:
			ss.onPacket([]byte(m))
		case types.BufferInterface:
			ss.onPacket(m.Bytes())
		}
	})
	_ = es.Once("close", func(...any) {
		t.Stop()
		ss.conn.closed()
		ss.mu.Lock()
		d := ss.device
		ss.closed = true
		ss.mu.Unlock()
		if d != nil {
			d.gone()
		}
	})
}

// onPacket runs on the session's reader: it must not block.
func (ss *sioSession) onPacket(b []byte) {
	p, err := parseSIO(b)
	if err != nil {
		ss.sendError("", "INVALID_MESSAGE", err.Error())
		return
	}
	if p.nsp != "/" {
		// Socket.IO's answer to a namespace the server does not have.
		ss.conn.write(append([]byte("4"+p.nsp+","), `{"message":"Invalid namespace"}`...))
		return
	}
	ss.mu.Lock()
	d := ss.device
	ss.mu.Unlock()
	switch p.typ {
	case '0':
		if d != nil {
			return // connected already
		}
		ss.connect(p.data)
	case '1':
		ss.es.Close(false)
	case '2':
		if d == nil {
			ss.sendError("", "NOT_REGISTERED", "connect to the namespace first")
			return
		}
		ss.onEvent(d, p)
	case '3':
		// An acknowledgement: the hub asks none.
	default:
		ss.sendError("", "INVALID_MESSAGE", "a client does not send Socket.IO packets of type "+string(p.typ))
	}
}

// connectError refuses the CONNECT, as Socket.IO's middlewares do.
func (ss *sioSession) connectError(code, msg string) {
	b, _ := json.Marshal(map[string]any{"message": msg, "data": map[string]string{"code": code}})
	ss.conn.write(append([]byte("4"), b...))
}

// connect serves the CONNECT of the main namespace: the device names
// itself in the handshake's query (or in auth, for a client that cannot
// set a query), and authenticates with auth.token or the handshake's
// Authorization header.
func (ss *sioSession) connect(data []byte) {
	h := ss.s.h
	var a struct {
		Token      string `json:"token"`
		DeviceID   string `json:"deviceId"`
		DeviceType string `json:"deviceType"`
	}
	if len(data) > 0 && json.Unmarshal(data, &a) != nil {
		ss.connectError("INVALID_PARAMS", "the CONNECT packet's auth must be an object {token?, deviceId?, deviceType?}")
		return
	}
	req := ss.es.Request()
	q := req.Query()
	id, typ := q.Peek("deviceId"), q.Peek("deviceType")
	if id == "" {
		id, typ = a.DeviceID, a.DeviceType
	}
	if !validDeviceID(id) || id == h.ID() || len(typ) > 64 {
		ss.connectError("INVALID_PARAMS", "deviceId (query or auth) must be 1.."+strconv.Itoa(multicaMaxID)+" bytes without control characters, not the hub's, and deviceType at most 64 bytes")
		return
	}
	var who *auth.Principal
	if h.AuthOn() {
		r := req.Request().Clone(context.Background())
		if a.Token != "" {
			r.Header.Set("Authorization", "Bearer "+a.Token)
		}
		var aerr *envelope.Error
		if who, aerr = h.Authenticate(r); aerr != nil {
			ss.connectError(aerr.Code.String(), aerr.Message)
			return
		}
	}
	d := ss.s.newDevice(id, typ, who, ss.es.RemoteAddress(), ss.conn)
	d.sio = true
	ss.mu.Lock()
	if ss.closed {
		ss.mu.Unlock()
		d.cancel()
		return
	}
	ss.device = d
	ss.mu.Unlock()
	if !h.Track(d) {
		d.cancel()
		ss.es.Close(true)
		return
	}
	registered := func(ok bool, msg string) {
		r := map[string]any{"success": ok, "deviceId": id, "deviceType": typ, "hubDeviceId": h.ID()}
		if !ok {
			r["error"] = msg
		}
		b, _ := json.Marshal(r)
		ss.conn.event("registered", b)
	}
	ss.conn.write([]byte(`0{"sid":` + string(mustQuote(ss.es.Id())) + `}`))
	if old := ss.s.devices.get(id); old != nil && !ss.s.mayReplace(who)(old) {
		registered(false, "deviceId "+strconv.Quote(id)+" is connected with another identity")
		d.c.Shutdown(errors.New("deviceId in use"))
		return
	}
	if !ss.s.register(d) {
		registered(false, "deviceId "+strconv.Quote(id)+" is connected with another identity")
		return
	}
	select {
	case <-ss.conn.done:
		d.gone() // closed while registering: out of the table again
		return
	default:
	}
	registered(true, "")
}

// onEvent serves an EVENT of a connected device.
func (ss *sioSession) onEvent(d *multicaDevice, p sioPacket) {
	var args []json.RawMessage
	var name string
	if json.Unmarshal(p.data, &args) != nil || len(args) == 0 || json.Unmarshal(args[0], &name) != nil {
		ss.sendError("", "INVALID_MESSAGE", "an event is a JSON array [name, ...args]")
		return
	}
	switch name {
	case "send":
		if len(args) < 2 {
			ss.sendError("", "INVALID_MESSAGE", `"send" takes a RoutedMessage {id, uid, from, to, action, payload}`)
			return
		}
		d.onMessage(args[1])
	case "ping":
		// Multica's Gateway answers {event: "pong", data}; its SDK reads
		// the acknowledgement, others the event.
		if p.ack >= 0 {
			ss.conn.write([]byte("3" + strconv.FormatInt(p.ack, 10) + `[{"event":"pong","data":"pong"}]`))
		} else {
			ss.conn.event("pong", []byte(`"pong"`))
		}
	case "list-devices":
		if p.ack >= 0 {
			b, _ := json.Marshal(map[string]any{"devices": ss.s.devices.list()})
			ss.conn.write(append(append([]byte("3"+strconv.FormatInt(p.ack, 10)+"["), b...), ']'))
		}
	default:
		ss.sendError("", "UNKNOWN_EVENT", "the hub takes the events send, ping and list-devices, not "+strconv.Quote(name))
	}
}

// sendError answers a packet the hub could not take, as Multica's
// Gateway does: "send_error" {messageId, error, code}.
func (ss *sioSession) sendError(messageID, code, msg string) {
	ss.conn.event("send_error", sioSendError(messageID, &multicaErr{Code: code, Message: msg}))
}

// sioSendError is the payload of a send_error: Multica's {messageId,
// error, code}, with the WebSocket surface's message and meshCode.
func sioSendError(messageID string, e *multicaErr) []byte {
	b, _ := json.Marshal(struct {
		MessageID string `json:"messageId"`
		Error     string `json:"error"`
		*multicaErr
	}{messageID, e.Message, e})
	return b
}

// sioConn is a device's transport over an Engine.IO session
// (deviceConn): each frame is a "receive" event. Its queue is the
// session's packets not yet written to a transport (a long-polling
// device holds them until its next poll), bounded as a WebSocket
// device's link.Config.QueueSize.
type sioConn struct {
	es  engine.Socket
	max int

	mu      sync.Mutex
	pending int
	room    chan struct{} // closed (and replaced) when pending falls
	done    chan struct{}
	over    atomic.Bool
}

func newSIOConn(es engine.Socket, max int) *sioConn {
	if max <= 0 {
		max = 256
	}
	return &sioConn{es: es, max: max, room: make(chan struct{}), done: make(chan struct{})}
}

// write sends one Socket.IO packet of the hub's own (an answer, an
// acknowledgement, an error) without waiting. It counts in the queue's
// bound: a client that sends packets and never polls for their answers
// is cut off as a device that does not read.
func (c *sioConn) write(pkt []byte) {
	c.mu.Lock()
	if c.pending >= c.max {
		c.mu.Unlock()
		c.es.Close(true)
		return
	}
	c.pending++
	c.mu.Unlock()
	c.es.Send(types.NewStringBuffer(pkt), nil, func(transports.Transport) { c.sent() })
}

// event writes the event name with one JSON argument.
func (c *sioConn) event(name string, arg []byte) {
	pkt := make([]byte, 0, len(name)+len(arg)+8)
	pkt = append(pkt, `2["`...)
	pkt = append(pkt, name...)
	pkt = append(pkt, `",`...)
	pkt = append(pkt, arg...)
	c.write(append(pkt, ']'))
}

// enqueue sends a "receive" of frame b within the queue's bound; with
// wait, it waits while the queue is half full.
func (c *sioConn) enqueue(b *[]byte, wait bool) bool {
	pkt := make([]byte, 0, len(*b)+16)
	pkt = append(pkt, `2["receive",`...)
	pkt = append(pkt, *b...)
	pkt = append(pkt, ']')
	link.PutBuf(b)
	c.mu.Lock()
	for {
		select {
		case <-c.done:
			c.mu.Unlock()
			return false
		default:
		}
		if wait && c.pending >= c.max/2 {
			room := c.room
			c.mu.Unlock()
			select {
			case <-room:
			case <-c.done:
				return false
			}
			c.mu.Lock()
			continue
		}
		if c.pending >= c.max {
			c.mu.Unlock()
			return false
		}
		break
	}
	c.pending++
	c.mu.Unlock()
	c.es.Send(types.NewStringBuffer(pkt), nil, func(transports.Transport) { c.sent() })
	return true
}

// sent runs once a queued packet went to a transport.
func (c *sioConn) sent() {
	c.mu.Lock()
	c.pending--
	close(c.room)
	c.room = make(chan struct{})
	c.mu.Unlock()
}

// closed runs once the session closed.
func (c *sioConn) closed() {
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-c.done:
	default:
		close(c.done)
	}
}

func (c *sioConn) TrySend(b *[]byte) bool   { return c.enqueue(b, false) }
func (c *sioConn) SendRoomy(b *[]byte) bool { return c.enqueue(b, true) }
func (c *sioConn) Done() <-chan struct{}    { return c.done }

// Shutdown disconnects the device for err: a device that does not read
// loses its transport (and reconnects, as after a network failure); any
// other reason is sent as a send_error, then Socket.IO's DISCONNECT (the
// client does not reconnect on its own: it was replaced, or its token
// expired).
func (c *sioConn) Shutdown(err error) {
	if !c.over.CompareAndSwap(false, true) {
		return
	}
	if err == errMulticaSlow {
		c.es.Close(true)
		return
	}
	e := &multicaErr{Code: "DISCONNECTED", Message: err.Error()} // replaced, or the id taken
	if ee := (*envelope.Error)(nil); errors.As(err, &ee) {
		e = multicaError(ee) // an expired token: RPC_ERROR, meshCode UNAUTHENTICATED
	}
	c.event("send_error", sioSendError("", e))
	// Closed once the DISCONNECT is written (closed at once, the
	// WebSocket transport would drop it), or after a grace for a
	// long-polling device that does not poll again.
	t := time.AfterFunc(sioCloseGrace, func() { c.es.Close(true) })
	c.es.Send(types.NewStringBufferString("1"), nil, func(transports.Transport) {
		t.Stop()
		c.es.Close(false)
	})
}

// Close closes the session now and waits until it has.
func (c *sioConn) Close() {
	c.over.Store(true)
	c.es.Close(true)
	<-c.done
}
