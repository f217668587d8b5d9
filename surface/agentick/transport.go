package agentick

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/link"
)

// ---- transports ----

// routes mounts the surface's handlers on the hub.
func (gw *gateway) routes() {
	gw.h.Handle("GET /agentick/ws", http.HandlerFunc(gw.serveWS))
	// The seed's clients connect to ws://host:port: a WebSocket upgrade at
	// the root is agentick's (the root's POST is NEXUS3's; the mesh's own
	// WebSocket is /ws). A plain GET / is not a method the root serves.
	gw.h.Handle("GET /{$}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !websocket.IsWebSocketUpgrade(r) {
			w.Header().Set("Allow", "POST")
			http.Error(w, "GET / serves only agentick's WebSocket upgrade; POST / is NEXUS3 JSON-RPC", http.StatusMethodNotAllowed)
			return
		}
		gw.serveWS(w, r)
	}))
	gw.h.Handle("GET /events", http.HandlerFunc(gw.serveEvents))
	gw.h.Handle("POST /invoke", http.HandlerFunc(gw.serveInvoke))
}

func writeAgentickJSON(w http.ResponseWriter, status int, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// serveInvoke is POST /invoke.
func (gw *gateway) serveInvoke(w http.ResponseWriter, r *http.Request) {
	h := gw.h
	who, ok := h.Admit(w, r)
	if !ok {
		return
	}
	lim := h.ConnConfig().Limits
	limit := lim.MaxBytes
	if r.ContentLength > int64(limit) {
		writeAgentickJSON(w, http.StatusRequestEntityTooLarge, agentickRes("", nil, agErr(agValidationType, "body exceeds the limit of %d bytes", limit)))
		return
	}
	data, err := link.ReadExact(http.MaxBytesReader(w, r.Body, int64(limit)), limit)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeAgentickJSON(w, http.StatusRequestEntityTooLarge, agentickRes("", nil, agErr(agValidationType, "body exceeds the limit of %d bytes", limit)))
			return
		}
		writeAgentickJSON(w, http.StatusBadRequest, agentickRes("", nil, agErr(agValidationType, "cannot read the request body")))
		return
	}
	f, e := decodeAgentickFrame(data, lim, true)
	if e == nil && f.Type != "req" {
		e = agErr(agValidationType, "/invoke takes a request {method, params}")
	}
	if f.ID == "" {
		f.ID = envelope.NewID()
	}
	if e != nil {
		writeAgentickJSON(w, e.httpStatus(), agentickRes(f.ID, nil, e))
		return
	}
	if f.ClientID == "" {
		f.ClientID = r.URL.Query().Get("clientId")
	}
	tc := http.Header{}
	for _, k := range []string{"traceparent", "tracestate", "baggage"} {
		if v := r.Header.Get(k); v != "" {
			tc.Set(k, v)
		}
	}
	ctx := h.WithCaller(context.WithValue(r.Context(), agTraceKey{}, tc), who, "")
	var c *agClient
	if f.ClientID != "" {
		// The client's event stream, if it has one here and is the same caller.
		if cl := gw.client(f.ClientID); cl != nil && (!h.AuthOn() || sameSubject(cl.who, who)) {
			c = cl
		}
	}
	b, e := gw.answer(ctx, c, f)
	status := http.StatusOK
	if e != nil {
		status = e.httpStatus()
	}
	writeAgentickJSON(w, status, b)
}

// serveEvents is GET /events?clientId=: the client's events as
// server-sent events, one JSON frame per "data:" line, the first the
// connected frame; comment lines keep it alive; it ends with the request.
func (gw *gateway) serveEvents(w http.ResponseWriter, r *http.Request) {
	who, ok := gw.h.Admit(w, r)
	if !ok {
		return
	}
	id := r.URL.Query().Get("clientId")
	if id == "" || len(id) > 128 || !utf8.ValidString(id) {
		writeAgentickJSON(w, http.StatusBadRequest, agentickErrorFrame(agErr(agValidationReq, "clientId is required (1 to 128 bytes)")))
		return
	}
	_, conn := gw.h.Caller(r.Context())
	c := gw.newClient(conn, id, who)
	out := make(chan []byte, agentickQueue)
	c.push = func(b []byte) bool {
		select {
		case out <- b:
			return true
		default:
			return false
		}
	}
	// A stream's events wait for the writer (a slow reader holds the
	// stream back) on a queue of their own: the subscriptions' events,
	// which never wait, keep theirs.
	sout := make(chan []byte)
	c.stream = func(ctx context.Context, b []byte) bool {
		select {
		case sout <- b:
			return true
		case <-ctx.Done():
		case <-c.ctx.Done():
		}
		return false
	}
	if e := gw.attach(c); e != nil {
		c.cancel()
		writeAgentickJSON(w, e.httpStatus(), agentickErrorFrame(e))
		return
	}
	defer gw.detach(c)
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	write := func(b []byte) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(10 * time.Second))
		if _, err := w.Write(b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	sse := func(frame []byte) bool {
		b := make([]byte, 0, len(frame)+8)
		b = append(b, "data: "...)
		b = append(b, frame...)
		b = append(b, "\n\n"...)
		return write(b)
	}
	if !sse(gw.connected(c.ctx)) {
		return
	}
	tick := time.NewTicker(agentickKeepAlive)
	defer tick.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-c.ctx.Done():
			return
		case f := <-out:
			if !sse(f) {
				return
			}
		case f := <-sout:
			if !sse(f) {
				return
			}
		case <-tick.C:
			if !write([]byte(": keep-alive\n\n")) {
				return
			}
		}
	}
}

// serveWS is GET /agentick/ws (and an upgrade on GET /).
func (gw *gateway) serveWS(w http.ResponseWriter, r *http.Request) {
	who, ok := gw.h.Admit(w, r)
	if !ok {
		return
	}
	ws, err := gw.h.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	_, conn := gw.h.Caller(r.Context())
	gw.startWS(ws, who, conn)
}

// agWS is one agentick WebSocket. Until connect it has no client.
type agWS struct {
	gw   *gateway
	c    *link.Conn
	who  *auth.Principal
	conn string        // the connection's remote address, for rate limits
	busy chan struct{} // a token per request in flight

	mu     sync.Mutex
	client *agClient
	hello  chan struct{} // closed once the connected frame is queued: answers wait for it
}

func (gw *gateway) startWS(ws *websocket.Conn, who *auth.Principal, conn string) {
	h := gw.h
	a := &agWS{gw: gw, c: link.NewConn(ws, h.ConnConfig()), who: who, conn: conn, busy: make(chan struct{}, agentickInFlight)}
	if !h.Track(a) {
		_ = ws.Close()
		return
	}
	// No message-level check on this connection (c.check is nil): the
	// surface decodes and refuses its frames itself.
	a.c.Start(func(data []byte, _ *envelope.Error) { a.onMessage(data) }, func(error) {
		go func() {
			a.end()
			h.Untrack(a)
		}()
	})
}

func (a *agWS) send(b []byte) bool {
	buf := link.GetBuf()
	*buf = append(*buf, b...)
	return a.c.Send(buf)
}

// onMessage runs on the reader goroutine: it must not block.
func (a *agWS) onMessage(data []byte) {
	f, e := decodeAgentickFrame(data, a.c.Config().Limits, false)
	if e != nil {
		if f.Type == "req" && f.ID != "" {
			a.send(agentickRes(f.ID, nil, e))
		} else {
			a.send(agentickErrorFrame(e))
		}
		return
	}
	a.mu.Lock()
	c, hello := a.client, a.hello
	a.mu.Unlock()
	switch f.Type {
	case "ping":
		b, _ := json.Marshal(map[string]any{"type": "pong", "timestamp": f.Stamp})
		if len(f.Stamp) == 0 {
			b, _ = json.Marshal(map[string]any{"type": "pong", "timestamp": time.Now().UnixMilli()})
		}
		a.send(b)
	case "connect":
		if c != nil {
			a.send(agentickErrorFrame(agErr(agStateComplete, "already connected as %s", c.id)))
			return
		}
		a.connect(f.ClientID)
	case "req":
		if c == nil {
			a.send(agentickRes(f.ID, nil, agErr(agValidationReq, "send {type:\"connect\", clientId} first")))
			return
		}
		select {
		case a.busy <- struct{}{}:
		default:
			a.send(agentickRes(f.ID, nil, agentickFromMesh(envelope.Errorf(envelope.CodeOverloaded, "more than %d requests in flight on this connection", agentickInFlight), false)))
			return
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			defer func() { <-a.busy }()
			// A req sent right after connect is served after connected is
			// queued, never before: its answer, and a stream's events,
			// may be ready first.
			select {
			case <-hello:
			case <-c.ctx.Done():
				return
			}
			b, _ := a.gw.answer(c.ctx, c, f)
			a.send(b)
		}()
	}
}

// connect makes the socket the client id; it answers connected.
func (a *agWS) connect(id string) {
	c := a.gw.newClient(a.conn, id, a.who)
	c.push = func(b []byte) bool {
		buf := link.GetBuf()
		*buf = append(*buf, b...)
		return a.c.TrySend(buf)
	}
	c.stream = func(_ context.Context, b []byte) bool { // waits while the queue is half full
		buf := link.GetBuf()
		*buf = append(*buf, b...)
		return a.c.SendRoomy(buf)
	}
	c.close = func() { a.c.Shutdown(errors.New("agentick client closed")) }
	if e := a.gw.attach(c); e != nil {
		c.cancel()
		a.send(agentickErrorFrame(e))
		return
	}
	hello := make(chan struct{})
	a.mu.Lock()
	a.client, a.hello = c, hello
	a.mu.Unlock()
	// The answer needs calls into the mesh: off the reader goroutine.
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		a.send(a.gw.connected(c.ctx))
		close(hello)
	}()
}

// end runs once the socket closed: the client goes, with its goroutines.
func (a *agWS) end() {
	a.mu.Lock()
	c := a.client
	a.mu.Unlock()
	if c != nil {
		a.gw.detach(c)
	}
}

// Close closes the socket and waits for its goroutines.
func (a *agWS) Close() {
	a.c.Close()
	a.end()
}
