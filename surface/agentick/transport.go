package agentick

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
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
// server-sent events, one JSON frame per "data:" line. The first write
// is "retry: 1000" (the reconnect delay suggested) and the connected
// frame; comment lines keep the stream alive while idle.
//
// Every event of a client carries an id: "id: N", N = 1, 2, … per
// client, in the order of its events. The connected frame carries the id
// the stream starts after (0 for a new client), so that a stream that
// drops before its first event resumes too. The client outlives its
// stream: its subscriptions, ids and the newest events (a ring of
// agentickRingEvents, at most agentickRingBytes) are kept for
// agentickResumeGrace after the stream ends, and events meanwhile go into
// the ring; past that the client is detached as a WebSocket client is.
//
// A request carrying Last-Event-ID (the header, or ?lastEventId= for
// EventSource polyfills that cannot set headers) resumes the client of
// its clientId, same caller, when that client issued the id: its
// connected frame says "resumed": true, then come the events after that
// id from the ring, in order, then live ones. Events the ring no longer
// holds are named by a gap frame first, {"type":"gap","from":F,"to":T}
// with "id: T" (the ids F..T are lost), then the stream goes on from the
// oldest held (a live stream whose reader fell further behind than the
// ring holds gets one too). A stream of that client still live is
// closed: the request is its reconnect, the old connection is dead
// though the gateway has not noticed yet. A request with Last-Event-ID
// that resumes nothing starts a new client ("resumed": false: subscribe
// again; its ids start at 1 again).
//
// A request without Last-Event-ID (or with one the client never issued)
// for a clientId whose stream or WebSocket is live is refused: HTTP 409,
// an error frame STATE_ALREADY_COMPLETE (an EventSource does not retry a
// non-200 answer, so two tabs with one clientId do not take the id from
// each other in turns). For a client in its grace period it starts a new
// client, the old one detached. A streaming method's events wait for the
// live stream (a slow reader holds the method back; while the client is
// away, for its return).
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
	last, given := lastEventID(r)
	_, addr := gw.h.Caller(r.Context())
	fresh := gw.newClient(addr, id, who)
	gw.sseClient(fresh)
	cctx, ccancel := context.WithCancel(r.Context())
	conn := &agConn{ctx: cctx, cancel: ccancel}
	c, from, resumed, e := gw.attachSSE(fresh, conn, last, given)
	if c != fresh {
		fresh.cancel()
	}
	if e != nil {
		ccancel()
		writeAgentickJSON(w, e.httpStatus(), agentickErrorFrame(e))
		return
	}
	defer gw.releaseSSE(c, conn)
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	write := func(b []byte) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(10 * time.Second))
		_, err := w.Write(b)
		return err == nil
	}
	flush := func() bool {
		_ = rc.SetWriteDeadline(time.Now().Add(10 * time.Second))
		return rc.Flush() == nil
	}
	var buf []byte
	sse := func(id uint64, frame []byte) bool {
		buf = append(buf[:0], "id: "...)
		buf = strconv.AppendUint(buf, id, 10)
		buf = append(buf, "\ndata: "...)
		buf = append(buf, frame...)
		buf = append(buf, "\n\n"...)
		return write(buf)
	}
	var hello *bool
	if given {
		hello = &resumed
	}
	if !write([]byte("retry: "+strconv.Itoa(agentickRetryMs)+"\n")) || !sse(from, gw.connected(c.ctx, hello)) || !flush() {
		return
	}
	tick := time.NewTicker(agentickKeepAlive)
	defer tick.Stop()
	var evs []agEvent
	for {
		var gapFrom, gapTo uint64
		var wake <-chan struct{}
		evs, gapFrom, gapTo, wake, ok = c.sse.next(conn, evs[:0])
		if !ok {
			return
		}
		if gapTo > 0 || len(evs) > 0 {
			if gapTo > 0 && !sse(gapTo, agentickGapFrame(gapFrom, gapTo)) {
				return
			}
			upTo := gapTo
			for _, ev := range evs {
				if !sse(ev.id, ev.frame) {
					return
				}
				upTo = ev.id
			}
			clear(evs) // keep no frame alive past the ring
			if !flush() {
				return
			}
			c.sse.wrote(conn, upTo)
			continue
		}
		select {
		case <-conn.ctx.Done():
			return
		case <-c.ctx.Done():
			return
		case <-wake:
		case <-tick.C:
			if !write([]byte(": keep-alive\n\n")) || !flush() {
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

	mu         sync.Mutex
	client     *agClient
	hello      chan struct{} // closed once the connected frame is queued: answers wait for it
	connecting bool          // connect answered, connected not queued yet: replies wait in early
	early      [][]byte      // the reader's own replies meanwhile, in order
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

// reply sends a frame the reader goroutine answers itself (a refusal at
// decode, a pong, …). While a connect is in progress it is queued behind
// connected, in order, for the connect goroutine to send: a frame sent
// right after connect is never answered before connected. Past
// agentickQueue of them the connection is cut.
func (a *agWS) reply(b []byte) {
	a.mu.Lock()
	if a.connecting {
		if len(a.early) >= agentickQueue {
			a.mu.Unlock()
			a.c.Shutdown(fmt.Errorf("agentick client sent more than %d frames to answer before connected", agentickQueue))
			return
		}
		a.early = append(a.early, b)
		a.mu.Unlock()
		return
	}
	a.mu.Unlock()
	a.send(b)
}

// onMessage runs on the reader goroutine: it must not block.
func (a *agWS) onMessage(data []byte) {
	f, e := decodeAgentickFrame(data, a.c.Config().Limits, false)
	if e != nil {
		if f.Type == "req" && f.ID != "" {
			a.reply(agentickRes(f.ID, nil, e))
		} else {
			a.reply(agentickErrorFrame(e))
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
		a.reply(b)
	case "connect":
		if c != nil {
			a.reply(agentickErrorFrame(agErr(agStateComplete, "already connected as %s", c.id)))
			return
		}
		a.connect(f.ClientID)
	case "req":
		if c == nil {
			a.reply(agentickRes(f.ID, nil, agErr(agValidationReq, "send {type:\"connect\", clientId} first")))
			return
		}
		select {
		case a.busy <- struct{}{}:
		default:
			a.reply(agentickRes(f.ID, nil, agentickFromMesh(envelope.Errorf(envelope.CodeOverloaded, "more than %d requests in flight on this connection", agentickInFlight), false)))
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
	a.client, a.hello, a.connecting = c, hello, true
	a.mu.Unlock()
	// The answer needs calls into the mesh: off the reader goroutine.
	// Then the replies the reader queued meanwhile, until none is left.
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		a.send(a.gw.connected(c.ctx, nil))
		close(hello)
		for {
			a.mu.Lock()
			early := a.early
			a.early = nil
			if len(early) == 0 {
				a.connecting = false
				a.mu.Unlock()
				return
			}
			a.mu.Unlock()
			for _, b := range early {
				a.send(b)
			}
		}
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
