// Package multica is the Multica surface (seeds multica-hub-rpc and
// multica-client-streaming): Multica's Gateway, where devices (web apps,
// desktops, the hub itself) exchange RoutedMessages {id, uid, from, to,
// action, payload} over one WebSocket each, and the hub answers
// "request"s addressed to it.
//
//	GET /multica?deviceId=ID&deviceType=TYPE   (WebSocket; subprotocol "multica" optional)
//
// The seeds name no mount path (Multica's gateway speaks Socket.io, whose
// handshake carries deviceId and deviceType, and so does this surface, at
// /socket.io/ and /ws/: socketio.go): here the device names itself in the
// query, and the hub greets it with
//
//	{id, uid: null, from: HUB, to: ID, action: "registered", payload: {deviceId, deviceType, hubDeviceId: HUB}}
//
// where HUB, the hub's deviceId, is its hub id (Host.ID). Then:
//
//   - A message to another connected device is delivered to it as sent (its
//     six fields, re-encoded; "from" must be the sender's own deviceId or
//     empty, and is filled in). Each device has a bounded send queue
//     (link.Config.QueueSize frames): a device whose queue is full is
//     disconnected (close 1008 "send queue full": it would otherwise miss
//     frames in the middle of a stream) and the sender is told, so that a
//     slow device never blocks its senders nor anyone else.
//   - A "request" to the hub, payload {requestId, method, params?, meta?},
//     is a call through the hub's ingress, like a native one (authorisation,
//     policies, tracing, metrics): the seed's method getAgentMessages is
//     the chat agent's chat.getAgentMessages, and every method of the mesh
//     is callable by its own name. meta, an addition to the seed, carries
//     the envelope headers as on /rpc (traceparent, ttl, idempotencyKey, …).
//     The answer is a "response" to the sender: {requestId, ok: true,
//     payload} or {requestId, ok: false, error: {code, message}} with the
//     seed's codes: METHOD_NOT_FOUND, INVALID_PARAMS (also for mesh's
//     INVALID_REQUEST and PARSE_ERROR), AGENT_NOT_FOUND, and RPC_ERROR for
//     every other mesh code, which then rides along as error.meshCode
//     (UNAVAILABLE, TIMEOUT, OVERLOADED, PERMISSION_DENIED, …) so that a
//     client can tell a retryable failure.
//   - A request of chat.send, or a "message" to the hub with payload
//     {agentId, content}, runs a turn of that chat agent as a stream
//     (chat.send is a streaming method) and relays the turn's events to
//     the sender, each as a "stream" message with the seed's
//     StreamPayload {streamId, agentId, event}, before the request's
//     response. A request of any other streaming method sends its chunks
//     as "stream" messages {streamId: the requestId, agentId, event:
//     {type: "chunk", seq, data}}, then an event {type: "end"}. A
//     "message" gets no answer but the stream, or an "error" if it failed.
//   - A message the hub cannot take (not JSON, a field of the wrong type,
//     an unknown destination, an action the hub does not serve) is answered
//     with {action: "error", payload: {messageId, code, message[, meshCode]}},
//     or, for a "request", with its "response" (ok false), so that the
//     seed's SDK rejects at once instead of timing out.
//
// Authentication and origins are those of /ws: a browser from an origin
// not allowed is refused before anything (403); with a key, a bearer token
// (Authorization header or "bearer.TOKEN" subprotocol) is required and the
// device is disconnected when it expires. A second connection with a
// deviceId in use replaces the first when it is the same principal (a
// reconnect), and is refused with 409 otherwise. Devices are those of this
// hub: a device attached to another hub of a cluster is not reachable.
package multica

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/stream"
	"github.com/agentmesh/agentmesh/surface"
)

const (
	// multicaSubprotocol may be offered by a browser (beside its
	// bearer.TOKEN); the hub then selects it.
	multicaSubprotocol = "multica"
	// multicaMaxInflight bounds the requests and turns in flight per
	// device; past it a request is answered RPC_ERROR (meshCode OVERLOADED).
	multicaMaxInflight = 1000
	// multicaMaxID bounds deviceIds, message ids and requestIds.
	multicaMaxID = envelope.MulticaMaxID
)

// multicaMethods maps the seed's method names to the mesh's.
var multicaMethods = map[string]string{
	"getAgentMessages": "chat.getAgentMessages",
}

// errMulticaSlow closes a device whose send queue is full: 1008, after
// the frames already written whole (the device's link keeps room for
// the close frame, WithBackpressure), and without blocking the sender
// that found the queue full.
var errMulticaSlow = link.NotReading("send queue full")

// multicaDevices is the table of the devices connected to one hub, by
// deviceId (the surface's own state, made by Mount). The zero value is
// ready.
type multicaDevices struct {
	mu sync.Mutex
	m  map[string]*multicaDevice
}

// add registers d; a device connected with the same id is returned to be
// closed when replace allows it, else d is refused (ok false).
func (t *multicaDevices) add(d *multicaDevice, replace func(old *multicaDevice) bool) (old *multicaDevice, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]*multicaDevice{}
	}
	if old = t.m[d.id]; old != nil && !replace(old) {
		return nil, false
	}
	t.m[d.id] = d
	return old, true
}

func (t *multicaDevices) remove(d *multicaDevice) {
	t.mu.Lock()
	if t.m[d.id] == d {
		delete(t.m, d.id)
	}
	t.mu.Unlock()
}

// list returns the devices connected, as Multica's list-devices does.
func (t *multicaDevices) list() []deviceInfo {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]deviceInfo, 0, len(t.m))
	for _, d := range t.m {
		out = append(out, deviceInfo{d.id, d.typ})
	}
	return out
}

// deviceInfo is Multica's DeviceInfo.
type deviceInfo struct {
	DeviceID   string `json:"deviceId"`
	DeviceType string `json:"deviceType"`
}

func (t *multicaDevices) get(id string) *multicaDevice {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.m[id]
}

// deviceConn is a device's transport: a plain WebSocket (*link.Conn) or
// a Socket.IO session (sioConn). Frames are RoutedMessages as JSON.
type deviceConn interface {
	// TrySend queues a frame without waiting; false: the queue is full
	// or the transport closed.
	TrySend(b *[]byte) bool
	// SendRoomy queues a frame, waiting while the queue is half full;
	// false: the transport closed.
	SendRoomy(b *[]byte) bool
	// Shutdown closes the transport for err (after what is queued);
	// Close closes it now and waits for its goroutines.
	Shutdown(err error)
	Close()
	Done() <-chan struct{}
}

// multicaDevice is one connected device.
type multicaDevice struct {
	s      *server
	id     string
	typ    string
	who    *auth.Principal
	c      deviceConn
	lim    envelope.Limits
	sio    bool            // on Socket.IO: errors go as send_error events
	ctx    context.Context // ends when the device disconnects
	cancel context.CancelFunc
	busy   atomic.Int64 // requests and turns in flight
	wg     sync.WaitGroup
}

// multicaMsg is a decoded RoutedMessage (envelope.DecodeMulticaMessage).
type multicaMsg = envelope.MulticaMessage

// multicaWire is a RoutedMessage to write (appendMultica).
type multicaWire struct {
	ID      string
	UID     json.RawMessage // a JSON string, or empty for null
	From    string
	To      string
	Action  string
	Payload json.RawMessage // JSON, or empty for null
}

// validDeviceID: 1..multicaMaxID bytes, no control characters.
func validDeviceID(s string) bool {
	if s == "" || len(s) > multicaMaxID {
		return false
	}
	for _, r := range s {
		if r == unicode.ReplacementChar || unicode.IsControl(r) {
			return false
		}
	}
	return true
}

// Mount serves the Multica surface on h at GET /multica, with a table
// of devices of its own.
func Mount(h surface.Host) {
	s := &server{h: h}
	s.up = websocket.Upgrader{
		Subprotocols: []string{multicaSubprotocol},
		// The hub's origin policy and buffers, as its own upgrader's
		// (Host.Upgrade), but selecting Multica's subprotocol.
		CheckOrigin:     h.CheckOrigin,
		ReadBufferSize:  1024,
		WriteBufferPool: &sync.Pool{},
	}
	h.Handle("GET /multica", http.HandlerFunc(s.serve))
	mountSocketIO(s)
}

// server is the surface mounted on one hub.
type server struct {
	h       surface.Host
	up      websocket.Upgrader
	devices multicaDevices
}

// serve is GET /multica.
func (s *server) serve(w http.ResponseWriter, r *http.Request) {
	h := s.h
	who, ok := h.Admit(w, r) // as /ws: origin, draining, credential
	if !ok {
		return
	}
	q := r.URL.Query()
	id, typ := q.Get("deviceId"), q.Get("deviceType")
	if !validDeviceID(id) || id == h.ID() || len(typ) > 64 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write(envelope.AppendJSONRPCError(nil, nil, envelope.Errorf(envelope.CodeInvalidParams,
			"deviceId (query) must be 1..%d bytes without control characters, not the hub's, and deviceType at most 64 bytes", multicaMaxID)))
		return
	}
	if old := s.devices.get(id); old != nil && !s.mayReplace(who)(old) {
		http.Error(w, "deviceId "+strconv.Quote(id)+" is connected with another identity", http.StatusConflict)
		return
	}
	ws, err := s.up.Upgrade(w, r, nil)
	if err != nil {
		return // the upgrader has answered
	}
	// The device's calls run in a context of the socket's life, naming
	// the device's principal and the connection it came over.
	_, conn := h.Caller(r.Context())
	c := link.NewConn(ws, h.ConnConfig())
	c.WithBackpressure()
	d := s.newDevice(id, typ, who, conn, c)
	if !h.Track(d) {
		d.cancel()
		_ = ws.Close()
		return
	}
	// No message-level check on this connection (c.check is nil): the
	// surface decodes and refuses its frames itself.
	c.Start(func(data []byte, _ *envelope.Error) { d.onMessage(data) }, func(error) { d.gone() })
	if !s.register(d) {
		return
	}
	// Greeted once routable: a device told it is registered can be sent to
	// at once (greeted before, a message sent to it on its greeting could
	// find no such device).
	greeting, _ := json.Marshal(map[string]string{"deviceId": id, "deviceType": typ, "hubDeviceId": h.ID()})
	d.send(d.fromHub("registered", nil, greeting))
}

// newDevice makes device id of who on transport c, arriving over conn
// (its remote address, for the per-connection limits).
func (s *server) newDevice(id, typ string, who *auth.Principal, conn string, c deviceConn) *multicaDevice {
	base := s.h.WithCaller(context.Background(), who, conn)
	d := &multicaDevice{s: s, id: id, typ: typ, who: who, c: c, lim: s.h.ConnConfig().Limits}
	d.ctx, d.cancel = context.WithCancel(base)
	return d
}

// mayReplace reports whether a new connection of who may take the
// deviceId of old: always without auth, else only the same subject.
func (s *server) mayReplace(who *auth.Principal) func(old *multicaDevice) bool {
	return func(old *multicaDevice) bool { return !s.h.AuthOn() || sameSubject(old.who, who) }
}

// register puts d, running, in the table of devices (closing an older
// connection of the same device) and arms its token's expiry. false:
// another identity took the id meanwhile, and d is shut down.
func (s *server) register(d *multicaDevice) bool {
	// In the table once running, so that whoever closes it (a newer
	// connection of the same device) runs its onClose.
	old, ok := s.devices.add(d, s.mayReplace(d.who))
	if !ok {
		d.c.Shutdown(errors.New("deviceId in use"))
		return false
	}
	if old != nil {
		old.c.Shutdown(errors.New("replaced by a new connection of the same device"))
	}
	if who := d.who; who != nil && who.Claims != nil && !who.ExpiresAt.IsZero() {
		t := time.AfterFunc(time.Until(who.ExpiresAt), func() {
			d.c.Shutdown(envelope.NewError(envelope.CodeUnauthenticated, "token expired; reconnect with a fresh one"))
		})
		context.AfterFunc(d.ctx, func() { t.Stop() })
	}
	return true
}

// gone runs once the device's transport closed.
func (d *multicaDevice) gone() {
	d.cancel()
	d.s.devices.remove(d)
	d.s.h.Untrack(d)
}

// Close disconnects the device and waits for its calls to end.
func (d *multicaDevice) Close() {
	d.c.Close()
	d.cancel()
	d.wg.Wait()
}

// fromHub builds a message from the hub to the device.
func (d *multicaDevice) fromHub(action string, uid, payload json.RawMessage) *multicaWire {
	return &multicaWire{ID: envelope.NewID(), UID: uid, From: d.s.h.ID(), To: d.id, Action: action, Payload: payload}
}

// send queues m for the device without waiting; a device whose queue is
// full is disconnected (errMulticaSlow). It reports whether m was queued.
func (d *multicaDevice) send(m *multicaWire) bool {
	b := link.GetBuf()
	*b = appendMultica(*b, m)
	if d.c.TrySend(b) {
		return true
	}
	select {
	case <-d.c.Done():
	default:
		d.c.Shutdown(errMulticaSlow)
	}
	return false
}

// appendMultica appends m as JSON. UID and Payload are valid JSON already
// (decoded or made by the hub): they are copied, not re-validated, which
// would cost a pass over every routed payload.
func appendMultica(b []byte, m *multicaWire) []byte {
	b = append(b, `{"id":`...)
	b = append(b, mustQuote(m.ID)...)
	b = append(b, `,"uid":`...)
	if len(m.UID) == 0 {
		b = append(b, "null"...)
	} else {
		b = append(b, m.UID...)
	}
	b = append(b, `,"from":`...)
	b = append(b, mustQuote(m.From)...)
	b = append(b, `,"to":`...)
	b = append(b, mustQuote(m.To)...)
	b = append(b, `,"action":`...)
	b = append(b, mustQuote(m.Action)...)
	b = append(b, `,"payload":`...)
	if len(m.Payload) == 0 {
		b = append(b, "null"...)
	} else {
		b = append(b, m.Payload...)
	}
	return append(b, '}')
}

// multicaErr is the error of a response {code, message} in the seed's
// codes, with the mesh's code when the seed's catch-all hides it.
type multicaErr struct {
	Code     string `json:"code"`
	Message  string `json:"message"`
	MeshCode string `json:"meshCode,omitempty"`
}

func multicaError(err error) *multicaErr {
	e := envelope.AsError(err)
	out := &multicaErr{Message: e.Message}
	if out.Message == "" {
		out.Message = e.Code.String()
	}
	switch e.Code {
	case envelope.CodeMethodNotFound:
		out.Code = "METHOD_NOT_FOUND"
	case envelope.CodeInvalidParams, envelope.CodeInvalidRequest, envelope.CodeParseError:
		out.Code = "INVALID_PARAMS"
	case envelope.CodeAgentNotFound:
		out.Code = "AGENT_NOT_FOUND"
	case envelope.CodeRPCError:
		out.Code = "RPC_ERROR"
	default:
		out.Code, out.MeshCode = "RPC_ERROR", e.Code.String()
	}
	return out
}

// sendError answers a message the hub could not take.
func (d *multicaDevice) sendError(m *multicaMsg, err error) {
	e := multicaError(err)
	id := ""
	var uid json.RawMessage
	if m != nil {
		id, uid = m.ID, m.UID
	}
	if d.sio {
		d.c.(*sioConn).event("send_error", sioSendError(id, e))
		return
	}
	p, _ := json.Marshal(struct {
		MessageID string `json:"messageId"`
		*multicaErr
	}{id, e})
	d.send(d.fromHub("error", uid, p))
}

// respond sends the response to a request.
func (d *multicaDevice) respond(m *multicaMsg, requestID string, result json.RawMessage, err error) {
	var p []byte
	if err != nil {
		p, _ = json.Marshal(struct {
			RequestID string      `json:"requestId"`
			OK        bool        `json:"ok"`
			Error     *multicaErr `json:"error"`
		}{requestID, false, multicaError(err)})
	} else {
		if len(result) == 0 {
			result = json.RawMessage("null")
		}
		p, _ = json.Marshal(struct {
			RequestID string          `json:"requestId"`
			OK        bool            `json:"ok"`
			Payload   json.RawMessage `json:"payload"`
		}{requestID, true, result})
	}
	d.send(d.fromHub("response", m.UID, p))
}

// onMessage runs on the reader goroutine: it routes or starts the work of
// one message, and never blocks.
func (d *multicaDevice) onMessage(data []byte) {
	m, derr := decodeMultica(data, d.lim)
	if derr != nil {
		d.sendError(m, derr)
		return
	}
	if m.From == "" {
		m.From = d.id
	} else if m.From != d.id {
		d.sendError(m, envelope.Errorf(envelope.CodeInvalidParams, "from must be your deviceId %q", d.id))
		return
	}
	if m.To == d.s.h.ID() {
		d.toHub(m)
		return
	}
	to := d.s.devices.get(m.To)
	if to == nil {
		err := envelope.Errorf(envelope.CodeUnavailable, "device %q is not connected", m.To)
		if m.Action == "request" {
			if rid := requestIDOf(m.Payload); rid != "" {
				d.respond(m, rid, nil, err)
				return
			}
		}
		d.sendError(m, err)
		return
	}
	if !to.send(&multicaWire{ID: m.ID, UID: m.UID, From: m.From, To: m.To, Action: m.Action, Payload: m.Payload}) {
		d.sendError(m, envelope.Errorf(envelope.CodeUnavailable, "device %q does not read its messages: disconnected", m.To))
	}
}

// toHub serves a message addressed to the hub.
func (d *multicaDevice) toHub(m *multicaMsg) {
	switch m.Action {
	case "request":
		rp, err := decodeMulticaRequest(m.Payload, d.lim)
		if err != nil {
			if rp != nil && rp.requestID != "" {
				d.respond(m, rp.requestID, nil, err)
			} else {
				d.sendError(m, err)
			}
			return
		}
		d.spawn(m, rp.requestID, func() {
			var res *envelope.Response
			var err error
			if agent, ok := chatSendAgent(rp.req); ok {
				res, err = d.turn(rp.req, agent)
			} else if d.s.h.Streaming(rp.req.Method) {
				res, err = d.stream(rp.req, rp.requestID)
			} else {
				res, err = d.s.h.Invoke(d.ctx, rp.req)
			}
			var result json.RawMessage
			if err == nil {
				result = res.Result
			}
			d.respond(m, rp.requestID, result, err)
		})
	case "message":
		agentID, content, err := envelope.DecodeCheckedMulticaChat(m.Payload)
		if err != nil {
			d.sendError(m, err)
			return
		}
		params, _ := json.Marshal(map[string]json.RawMessage{"agentId": mustQuote(agentID), "content": content})
		req := &envelope.Request{ID: envelope.NewID(), Origin: d.id, Method: "chat.send", Params: params,
			Timestamp: time.Now().UnixMilli(), Version: envelope.Version}
		d.spawn(m, "", func() {
			if _, err := d.turn(req, agentID); err != nil {
				d.sendError(m, err)
			}
		})
	case "response":
		// A device answering the hub: the hub asks nothing; ignored.
	default:
		d.sendError(m, envelope.Errorf(envelope.CodeMethodNotFound, "the hub takes the actions request and message, not %q", m.Action))
	}
}

// spawn runs fn for message m on its own goroutine, within the device's
// bound of work in flight.
func (d *multicaDevice) spawn(m *multicaMsg, requestID string, fn func()) {
	if d.busy.Add(1) > multicaMaxInflight {
		d.busy.Add(-1)
		err := envelope.NewError(envelope.CodeOverloaded, "too many requests in flight on this connection").MarkNotSent()
		if requestID != "" {
			d.respond(m, requestID, nil, err)
		} else {
			d.sendError(m, err)
		}
		return
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer d.busy.Add(-1)
		fn()
	}()
}

// mustQuote is s as a JSON string.
func mustQuote(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}

// chatSendAgent reports whether req is a chat.send, and of which agent.
func chatSendAgent(req *envelope.Request) (string, bool) {
	if req.Method != "chat.send" {
		return "", false
	}
	var p struct {
		AgentID  string `json:"agentId"`
		AgentID2 string `json:"agent_id"`
	}
	if json.Unmarshal(req.Params, &p) != nil {
		return "", false // the chat agent answers INVALID_PARAMS
	}
	if p.AgentID == "" {
		p.AgentID = p.AgentID2
	}
	return p.AgentID, p.AgentID != ""
}

// turn runs req (a chat.send of agent) as a stream: its chunks are the
// turn's events, each sent to the device as a "stream" message with the
// seed's StreamPayload {streamId, agentId, event}, waiting while its
// queue is half full (the stream is held back meanwhile, never the turn),
// before it returns the turn's answer. Only this turn's events: another caller's
// turn on the same agent is not this request's stream.
func (d *multicaDevice) turn(req *envelope.Request, _ string) (*envelope.Response, error) {
	return stream.Relay(d.ctx, d.s.h.Invoke, req, stream.RelayWindow, func(_ uint64, data json.RawMessage) error {
		var e surface.ChatEvent
		if err := json.Unmarshal(data, &e); err != nil {
			return envelope.Errorf(envelope.CodeInternal, "chat.send streamed a chunk that is not an event: %v", err)
		}
		p, _ := json.Marshal(struct {
			StreamID string          `json:"streamId"`
			AgentID  string          `json:"agentId"`
			Event    json.RawMessage `json:"event"`
		}{e.StreamID, e.AgentID, e.Event})
		b := link.GetBuf()
		*b = appendMultica(*b, d.fromHub("stream", nil, p))
		if !d.c.SendRoomy(b) {
			return envelope.NewError(envelope.CodeCancelled, "the device is gone")
		}
		return nil
	})
}

// stream runs req, a call to a streaming method, as a stream, and sends
// the device each chunk as a "stream" message, the seed's StreamPayload
// {streamId: the requestId, agentId: the destination (if named), event:
// {type: "chunk", seq, data}}, waiting while its queue is half full (the
// stream is held back meanwhile; the other half stays for its other
// messages, which never wait), then an event {type: "end", chunks,
// error?}, before the request's response.
func (d *multicaDevice) stream(req *envelope.Request, requestID string) (*envelope.Response, error) {
	streamID := requestID
	if streamID == "" {
		streamID = req.ID
	}
	payload := func(event any) json.RawMessage {
		p, _ := json.Marshal(struct {
			StreamID string `json:"streamId"`
			AgentID  string `json:"agentId"`
			Event    any    `json:"event"`
		}{streamID, req.Destination, event})
		return p
	}
	var n uint64
	res, err := stream.Relay(d.ctx, d.s.h.Invoke, req, stream.RelayWindow, func(seq uint64, data json.RawMessage) error {
		n = seq
		b := link.GetBuf()
		*b = appendMultica(*b, d.fromHub("stream", nil, payload(map[string]any{"type": "chunk", "seq": seq, "data": data})))
		if !d.c.SendRoomy(b) {
			return envelope.NewError(envelope.CodeCancelled, "the device is gone")
		}
		return nil
	})
	end := map[string]any{"type": "end", "chunks": n}
	if err != nil {
		end["error"] = multicaError(err)
	}
	b := link.GetBuf()
	*b = appendMultica(*b, d.fromHub("stream", nil, payload(end)))
	d.c.SendRoomy(b)
	return res, err
}

// sameSubject reports whether a and b are tokens of one subject (a
// reconnect of the same device may replace its earlier connection).
func sameSubject(a, b *auth.Principal) bool {
	return a != nil && b != nil && a.Claims != nil && b.Claims != nil && a.Subject == b.Subject
}

// requestIDOf digs the requestId out of a request's payload, if any (as
// decodeMulticaRequest reads it).
func requestIDOf(payload json.RawMessage) string { return envelope.MulticaRequestID(payload) }

// decodeMultica decodes one RoutedMessage within lim
// (envelope.DecodeMulticaMessage: one pass, keys matched exactly, a key
// given twice refused). Messages are re-encoded from what was decoded, so
// a receiver never sees another value than the hub routed by. On an error
// the message is returned as far as it was read (its id, for the answer).
func decodeMultica(data []byte, lim envelope.Limits) (*multicaMsg, *envelope.Error) {
	return envelope.DecodeMulticaMessage(data, lim)
}

// multicaRequest is a decoded RequestPayload.
type multicaRequest struct {
	requestID string
	req       *envelope.Request
}

// decodeMulticaRequest decodes a RequestPayload {requestId, method,
// params?, meta?} of a message decodeMultica accepted (within its limits)
// into the request it calls (envelope.DecodeCheckedMulticaRequest: meta is
// read as on /rpc); the seed's method names are mapped to the mesh's.
func decodeMulticaRequest(payload json.RawMessage, _ envelope.Limits) (*multicaRequest, *envelope.Error) {
	rid, req, err := envelope.DecodeCheckedMulticaRequest(payload)
	out := &multicaRequest{requestID: rid}
	if err != nil {
		return out, err
	}
	if m, ok := multicaMethods[req.Method]; ok {
		req.Method = m
	}
	req.Headers.Hops = 0 // a device is not a peer hub
	if req.ID == "" {
		req.ID = envelope.NewID()
	}
	req.Timestamp = time.Now().UnixMilli()
	req.Version = envelope.Version
	out.req = &req
	return out, nil
}
