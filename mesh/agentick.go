package mesh

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/envelope"
)

// The agentick surface (seed agentick-gateway-protocol): the gateway
// protocol of @agentick/gateway, so that its clients work against a hub.
//
//	GET  / (upgrade), /agentick/ws  WebSocket: {type:"connect", clientId} → {type:"connected", …};
//	                           {type:"req", id, method, params} → {type:"res", id, ok, payload|error};
//	                           pushed {type:"event", event, category, sessionId, data}
//	GET  /events?clientId=ID   the same client's event stream over SSE
//	POST /invoke               {method, params[, id][, clientId]} → the res envelope
//
// The seed's WebSocket is at the root of the gateway: an upgrade on GET /
// is agentick's (the root's POST is NEXUS3's, /ws the mesh's own
// dialect); /agentick/ws is the same endpoint under an unambiguous name.
//
// It is a dialect at the edge, not a dispatcher: each agentick method is
// translated into calls of the chat agent (package agents/chat; a session
// is a chat agent, its id the session name) or of the mesh, run through
// the hub's ingress like native calls (authentication, authorisation,
// policies, tracing, metrics), and their answers and errors translated
// back. What the gateway keeps itself is only what the protocol has and
// the mesh has not: the clients connected here, their subscriptions, the
// channels, and the order of a send's lifecycle events. A method name the
// seed does not list is a custom method: the mesh method of that name.
//
// Methods and their backing:
//
//	send              chat.get_context (chat.create on first use), then a turn chat.send in the background → {messageId};
//	                  the turn names the conversation it was sent to, so a reset in between cancels it
//	abort             chat.cancel of the turn this gateway started
//	status            mesh.methods, chat.list, chat.get_context
//	history           chat.getAgentMessages (ids "msg-N", N the index in the history)
//	close             chat.destroy
//	apps              mesh.methods: app "chat" when an agent serves chat.send
//	sessions          chat.list
//	subscribe         chat.events (tail, then long polls: Hub.FollowChat)
//	unsubscribe       the gateway's own subscription: nothing of the session reaches the client after its answer
//	channel           chat.get_context, then the gateway's own channel fan-out
//	channel-subscribe chat.get_context, then the gateway's own subscription
//	schema            mesh.schema, translated
//	tool-catalog      mesh.schema: the methods agents serve, which a session reaches with its mesh_call tool
//	tool-dispatch     that method, called with input
//	reset             chat.reset: the sends in flight are cancelled (the running turn and those waiting here
//	                  end with result aborted), the session file is moved aside, the history starts empty
//	tool-confirm      NOT_FOUND_RESOURCE: the chat runtime runs tools without confirmation, so no call awaits one
//
// Roles: every mesh call it makes is authorised by the ingress as usual
// (the role table's entry for chat.send guards send, …); on top, the
// role table may guard an agentick method by the name "agentick.<method>"
// ("agentick.*" for all).

const (
	agentickVersion = "1.0"
	agentickApp     = "chat" // the one app: the chat runtime
	// agentickQueue bounds the frames waiting for a client (events and
	// answers); a client that falls that far behind is disconnected.
	agentickQueue = 1024
	// agentickInFlight bounds the requests in flight per WebSocket client.
	agentickInFlight = 64
	agentickMaxID    = 256
	// agentickMaxTurns bounds the sends of one session started here and
	// not finished (running or waiting for the running one).
	agentickMaxTurns = 16
)

// agentickKeepAlive is how often an idle SSE stream gets a comment line.
var agentickKeepAlive = 15 * time.Second

// Error codes of the seed (@agentick/shared).
const (
	agNotFoundResource = "NOT_FOUND_RESOURCE"
	agNotFoundTool     = "NOT_FOUND_TOOL"
	agGuardDenied      = "GUARD_DENIED"
	agValidationReq    = "VALIDATION_REQUIRED"
	agValidationType   = "VALIDATION_TYPE"
	agStateComplete    = "STATE_ALREADY_COMPLETE"
	agMethodError      = "METHOD_ERROR"
	agInternalError    = "INTERNAL_ERROR"
)

// agentickErrors is the schema's errors record (the seed's descriptions).
var agentickErrors = map[string]string{
	agNotFoundResource: "Resource not found (session, method, tool)",
	agNotFoundTool:     "Tool not found",
	agGuardDenied:      "Access denied by guard (role, permission)",
	agValidationReq:    "Required parameter missing",
	agValidationType:   "Parameter type mismatch",
	agStateComplete:    "Operation on closed/completed resource",
	agMethodError:      "Unhandled error in method handler",
	agInternalError:    "Unexpected internal error",
}

// agentickEvents are the event types this gateway emits, with their
// categories.
var agentickEvents = []SchemaEvent{
	{"execution_start", "orchestration"},
	{"message_start", "model"},
	{"content_delta", "model"},
	{"message", "model"},
	{"tick_end", "orchestration"},
	{"tool_call_start", "model"},
	{"tool_result", "orchestration"},
	{"compaction_start", "orchestration"},
	{"compaction_end", "orchestration"},
	{"execution_end", "orchestration"},
	{"result", "result"},
	{"channel", "gateway"},
}

func agentickCategory(event string) string {
	for _, e := range agentickEvents {
		if e.Type == event {
			return e.Category
		}
	}
	return "gateway"
}

// agError is an agentick error object. meshCode, when set, is the mesh's
// code it comes from (its HTTP status answers /invoke).
type agError struct {
	Code     string         `json:"code"`
	Message  string         `json:"message"`
	Details  map[string]any `json:"details,omitempty"`
	meshCode envelope.Code
	fromMesh bool
}

func (e *agError) Error() string { return e.Code + ": " + e.Message }

func agErr(code, format string, args ...any) *agError {
	return &agError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// agentickFromMesh maps a mesh error to the seed's codes; the mesh's code
// rides in details.meshCode (with retryAfterMs when it has one), as the
// seed's table has no room for UNAVAILABLE or TIMEOUT.
func agentickFromMesh(err error, tool bool) *agError {
	var ae *agError
	if errors.As(err, &ae) {
		return ae
	}
	e := envelope.AsError(err)
	code := agInternalError
	switch e.Code {
	case envelope.CodeAgentNotFound:
		code = agNotFoundResource
	case envelope.CodeMethodNotFound:
		code = agNotFoundResource
		if tool {
			code = agNotFoundTool
		}
	case envelope.CodeInvalidParams, envelope.CodeInvalidRequest, envelope.CodeParseError:
		code = agValidationType
		if strings.Contains(e.Message, "Missing required parameter") {
			code = agValidationReq
		}
	case envelope.CodePermissionDenied, envelope.CodeUnauthenticated:
		code = agGuardDenied
	case envelope.CodeRPCError, envelope.CodeCancelled:
		code = agMethodError
	}
	msg := e.Message
	if msg == "" {
		msg = e.Code.String()
	}
	ae = &agError{Code: code, Message: msg, meshCode: e.Code, fromMesh: true}
	switch e.Code {
	case envelope.CodeAgentNotFound, envelope.CodeMethodNotFound, envelope.CodeInvalidParams, envelope.CodePermissionDenied, envelope.CodeRPCError:
		// The seed's code says it all.
	default:
		ae.Details = map[string]any{"meshCode": e.Code.String()}
		if ra := e.RetryAfter(); ra > 0 {
			ae.Details["retryAfterMs"] = ra.Milliseconds()
		}
	}
	return ae
}

// httpStatus is the status of an /invoke answer failing with e.
func (e *agError) httpStatus() int {
	if e.fromMesh && e.meshCode != envelope.CodeOK {
		return e.meshCode.HTTPStatus()
	}
	switch e.Code {
	case agNotFoundResource, agNotFoundTool:
		return http.StatusNotFound
	case agValidationReq, agValidationType:
		return http.StatusBadRequest
	case agGuardDenied:
		return http.StatusForbidden
	case agStateComplete:
		return http.StatusConflict
	}
	return http.StatusInternalServerError
}

// ---- frames ----

// agFrame is a decoded client frame (or /invoke body).
type agFrame struct {
	Type     string // connect, req, ping
	ID       string
	Method   string
	Params   json.RawMessage // a JSON object, or nil
	ClientID string
	Stamp    json.RawMessage // ping's timestamp
}

// decodeAgentickFrame decodes one client frame within lim. invoke: an
// /invoke body, whose type is "req" unless it says otherwise and whose id
// is optional. On error the frame returned holds what could be read (its
// id, to answer with).
func decodeAgentickFrame(data []byte, lim envelope.Limits, invoke bool) (*agFrame, *agError) {
	f := &agFrame{}
	if lim.MaxBytes <= 0 {
		lim = envelope.DefaultLimits()
	}
	if len(data) > lim.MaxBytes {
		return f, agErr(agValidationType, "frame exceeds the limit of %d bytes", lim.MaxBytes)
	}
	if !json.Valid(data) {
		return f, agErr(agValidationType, "frame is not valid JSON")
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil || m == nil {
		return f, agErr(agValidationType, "frame must be a JSON object")
	}
	if d := jsonDepth(data); d > lim.MaxDepth && lim.MaxDepth > 0 {
		// Refused, but answered to its id when it has one.
		_ = json.Unmarshal(m["type"], &f.Type)
		if f.Type == "req" || (invoke && f.Type == "") {
			f.Type = "req"
			_ = json.Unmarshal(m["id"], &f.ID)
		}
		return f, agErr(agValidationType, "frame nests %d levels deep; at most %d", d, lim.MaxDepth)
	}
	str := func(k string, required bool, maxLen int) (string, *agError) {
		raw, ok := m[k]
		if !ok || string(raw) == "null" {
			if required {
				return "", agErr(agValidationReq, "%s is required", k)
			}
			return "", nil
		}
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return "", agErr(agValidationType, "%s must be a string", k)
		}
		if required && s == "" {
			return "", agErr(agValidationReq, "%s is required", k)
		}
		if len(s) > maxLen || !utf8.ValidString(s) || strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return "", agErr(agValidationType, "%s must be at most %d bytes of printable text", k, maxLen)
		}
		return s, nil
	}
	var e *agError
	if f.Type, e = str("type", !invoke, 32); e != nil {
		return f, e
	}
	if invoke && f.Type == "" {
		f.Type = "req"
	}
	switch f.Type {
	case "connect":
		f.ClientID, e = str("clientId", true, 128)
		return f, e
	case "ping":
		f.Stamp = m["timestamp"]
		return f, nil
	case "req":
	default:
		return f, agErr(agValidationType, "unknown frame type %q", f.Type)
	}
	if f.ID, e = str("id", !invoke, agentickMaxID); e != nil {
		return f, e
	}
	if invoke {
		if f.ClientID, e = str("clientId", false, 128); e != nil {
			return f, e
		}
	}
	if f.Method, e = str("method", true, 256); e != nil {
		return f, e
	}
	if p, ok := m["params"]; ok && string(p) != "null" {
		if p = bytes.TrimSpace(p); len(p) == 0 || p[0] != '{' {
			return f, agErr(agValidationType, "params must be an object")
		}
		f.Params = p
	}
	return f, nil
}

// agRes is a res frame.
type agRes struct {
	Type    string          `json:"type"`
	ID      string          `json:"id"`
	OK      bool            `json:"ok"`
	Payload json.RawMessage `json:"payload,omitempty"`
	Error   *agError        `json:"error,omitempty"`
}

func agentickRes(id string, payload json.RawMessage, e *agError) []byte {
	b, err := json.Marshal(agRes{Type: "res", ID: id, OK: e == nil, Payload: payload, Error: e})
	if err != nil {
		b, _ = json.Marshal(agRes{Type: "res", ID: id, Error: agErr(agInternalError, "cannot encode the answer")})
	}
	return b
}

func agentickErrorFrame(e *agError) []byte {
	b, _ := json.Marshal(struct {
		Type    string `json:"type"`
		Code    string `json:"code"`
		Message string `json:"message"`
	}{"error", e.Code, e.Message})
	return b
}

func agentickEventFrame(event, session string, data any) []byte {
	b, err := json.Marshal(struct {
		Type      string `json:"type"`
		Event     string `json:"event"`
		Category  string `json:"category"`
		SessionID string `json:"sessionId"`
		Data      any    `json:"data"`
	}{"event", event, agentickCategory(event), session, data})
	if err != nil {
		return nil
	}
	return b
}

// ---- the gateway's state ----

// agentickHolder is the Hub's agentick state, made on first use.
type agentickHolder struct {
	once sync.Once
	gw   *agentickGW
}

type agentickGW struct {
	h      *Hub
	id     string
	start  time.Time
	ctx    context.Context // ends with the hub
	cancel context.CancelFunc
	wg     sync.WaitGroup // turns, the drain watcher

	mu       sync.Mutex
	closed   bool
	clients  map[string]*agClient
	sessions map[string]*agSession
	activity map[string]time.Time // session → its last send here
}

// agSession is what the gateway keeps about a session: its subscribers
// here, and its turns started here (one at a time, so that each turn's
// execution_start … result … execution_end bracket its events).
type agSession struct {
	subs    map[*agSub]struct{}
	turn    chan struct{} // a token while a turn runs
	running string        // messageId of the running turn
	pending int           // turns started or waiting
}

func (h *Hub) agentick() *agentickGW {
	h.ag.once.Do(func() {
		ctx, cancel := context.WithCancel(context.Background())
		gw := &agentickGW{h: h, id: "gw-" + h.cfg.ID, start: time.Now(), ctx: ctx, cancel: cancel,
			clients: map[string]*agClient{}, sessions: map[string]*agSession{}, activity: map[string]time.Time{}}
		if !h.track(gw) {
			gw.closed = true
			cancel()
		} else {
			gw.wg.Add(1)
			go gw.watchDrain()
		}
		h.ag.gw = gw
	})
	return h.ag.gw
}

// watchDrain closes the clients once the hub drains: their long polls
// would otherwise hold the drain up.
func (gw *agentickGW) watchDrain() {
	defer gw.wg.Done()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-gw.ctx.Done():
			return
		case <-t.C:
			if gw.h.draining.Load() {
				gw.killAll()
				return
			}
		}
	}
}

func (gw *agentickGW) killAll() {
	gw.mu.Lock()
	cs := make([]*agClient, 0, len(gw.clients))
	for _, c := range gw.clients {
		cs = append(cs, c)
	}
	gw.mu.Unlock()
	for _, c := range cs {
		c.kill()
	}
}

// Close ends the clients and the turns, and waits for them.
func (gw *agentickGW) Close() {
	gw.mu.Lock()
	gw.closed = true
	gw.mu.Unlock()
	gw.cancel()
	gw.killAll()
	gw.wg.Wait()
}

func (gw *agentickGW) session(id string) *agSession {
	s := gw.sessions[id]
	if s == nil {
		s = &agSession{subs: map[*agSub]struct{}{}, turn: make(chan struct{}, 1)}
		gw.sessions[id] = s
	}
	return s
}

// tidy forgets a session nothing refers to (gw.mu held).
func (gw *agentickGW) tidy(id string) {
	if s := gw.sessions[id]; s != nil && len(s.subs) == 0 && s.pending == 0 {
		delete(gw.sessions, id)
	}
}

// ---- clients ----

// agClient is one connected client: a WebSocket, or an SSE stream.
type agClient struct {
	gw     *agentickGW
	id     string
	who    *Principal
	ctx    context.Context // carries who; ends with the connection
	cancel context.CancelFunc
	push   func([]byte) bool // queues a frame without blocking
	close  func()            // closes the transport
	wg     sync.WaitGroup    // followers, request handlers

	mu       sync.Mutex
	subs     map[string]*agSub
	channels map[string]struct{} // session + "\x00" + channel
}

// newClient makes client id of who, arriving on connection conn (its
// remote address, for the per-connection rate limit; "" if unknown).
func (gw *agentickGW) newClient(conn, id string, who *Principal) *agClient {
	base := gw.ctx
	if conn != "" {
		base = withConn(base, conn)
	}
	if who != nil {
		base = context.WithValue(base, principalKey{}, who)
	}
	ctx, cancel := context.WithCancel(base)
	return &agClient{gw: gw, id: id, who: who, ctx: ctx, cancel: cancel, subs: map[string]*agSub{}, channels: map[string]struct{}{}}
}

// attach makes c the client of its id. A client of that id already
// connected is replaced (a reconnect that came first) when it is the
// same caller; another caller's id is refused.
func (gw *agentickGW) attach(c *agClient) *agError {
	gw.mu.Lock()
	if gw.closed {
		gw.mu.Unlock()
		return agErr(agInternalError, "hub is shutting down")
	}
	old := gw.clients[c.id]
	if old != nil && gw.h.guard.on() && !sameSubject(old.who, c.who) {
		gw.mu.Unlock()
		return agErr(agGuardDenied, "clientId %q is connected as another caller", c.id)
	}
	gw.clients[c.id] = c
	gw.mu.Unlock()
	if old != nil {
		old.kill()
	}
	return nil
}

// kill closes the client's transport; detach follows from it.
func (c *agClient) kill() {
	c.cancel()
	if c.close != nil {
		c.close()
	}
}

// detach forgets c and waits for its goroutines (not from one of them).
func (gw *agentickGW) detach(c *agClient) {
	c.cancel()
	gw.mu.Lock()
	if gw.clients[c.id] == c {
		delete(gw.clients, c.id)
	}
	gw.mu.Unlock()
	c.wg.Wait()
	c.mu.Lock()
	subs := c.subs
	c.subs = map[string]*agSub{}
	c.mu.Unlock()
	gw.mu.Lock()
	for sid, s := range subs {
		if ss := gw.sessions[sid]; ss != nil {
			delete(ss.subs, s)
			gw.tidy(sid)
		}
	}
	gw.mu.Unlock()
}

func (gw *agentickGW) client(id string) *agClient {
	gw.mu.Lock()
	defer gw.mu.Unlock()
	return gw.clients[id]
}

func (gw *agentickGW) clientCount() int {
	gw.mu.Lock()
	defer gw.mu.Unlock()
	return len(gw.clients)
}

// ---- subscriptions ----

// agSub follows one session's chat events for one client and merges the
// gateway's own events for that session into them: a gateway event waits
// until the chat events before it (seq ≤ its barrier) are delivered.
type agSub struct {
	c       *agClient
	session string
	cancel  context.CancelFunc

	mu      sync.Mutex
	last    uint64 // seq of the last chat event delivered
	ended   bool
	stopped bool // unsubscribed: deliver nothing more
	pending []agPending
	text    map[string]string // streamId → text delivered so far
}

type agPending struct {
	barrier uint64
	frame   []byte
}

// offer delivers a gateway event once the chat events up to barrier are.
func (s *agSub) offer(frame []byte, barrier uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended || barrier <= s.last {
		s.deliver(frame)
		return
	}
	s.pending = append(s.pending, agPending{barrier, frame})
}

// deliver pushes frame to the client (s.mu held).
func (s *agSub) deliver(frame []byte) {
	if s.stopped {
		return
	}
	if frame != nil && !s.c.push(frame) {
		go s.c.kill() // too slow: its queue is full
	}
}

// flush delivers the pending events whose barrier is passed (s.mu held).
func (s *agSub) flush() {
	keep := s.pending[:0]
	for _, p := range s.pending {
		if s.ended || p.barrier <= s.last {
			s.deliver(p.frame)
		} else {
			keep = append(keep, p)
		}
	}
	s.pending = keep
}

func (s *agSub) end() {
	s.mu.Lock()
	s.ended = true
	s.flush()
	s.mu.Unlock()
}

// onChat translates one chat event into agentick events.
func (s *agSub) onChat(e ChatEvent) bool {
	var ev struct {
		Type    string `json:"type"`
		Message *struct {
			Role       string          `json:"role"`
			Content    json.RawMessage `json:"content"`
			StopReason string          `json:"stopReason"`
		} `json:"message"`
		ToolCallID string          `json:"toolCallId"`
		ToolName   string          `json:"toolName"`
		Args       json.RawMessage `json:"args"`
		Result     *string         `json:"result"`
		IsError    *bool           `json:"isError"`
		Removed    *int            `json:"removed"`
		Kept       *int            `json:"kept"`
		Reason     string          `json:"reason"`
	}
	_ = json.Unmarshal(e.Event, &ev)
	var frames [][]byte
	add := func(event string, data any) {
		frames = append(frames, agentickEventFrame(event, s.session, data))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch ev.Type {
	case "message_start":
		s.text[e.StreamID] = ""
		add("message_start", map[string]any{"streamId": e.StreamID, "role": "assistant"})
	case "message_update":
		if ev.Message != nil {
			t := contentText(ev.Message.Content)
			prev := s.text[e.StreamID]
			if d, ok := strings.CutPrefix(t, prev); ok && d != "" {
				add("content_delta", map[string]any{"streamId": e.StreamID, "blockType": "text", "delta": d})
			} else if !ok {
				add("content_delta", map[string]any{"streamId": e.StreamID, "blockType": "text", "delta": t, "replace": true})
			}
			s.text[e.StreamID] = t
		}
	case "message_end":
		delete(s.text, e.StreamID)
		msg := map[string]any{"role": "assistant"}
		stop := ""
		if ev.Message != nil {
			msg["content"] = ev.Message.Content
			stop = ev.Message.StopReason
			msg["stopReason"] = stop
		}
		add("message", map[string]any{"streamId": e.StreamID, "message": msg})
		add("tick_end", map[string]any{"streamId": e.StreamID, "stopReason": stop})
	case "tool_execution_start":
		add("tool_call_start", map[string]any{"streamId": e.StreamID, "callId": ev.ToolCallID, "name": ev.ToolName, "input": ev.Args})
	case "tool_execution_end":
		d := map[string]any{"streamId": e.StreamID, "callId": ev.ToolCallID, "isError": ev.IsError != nil && *ev.IsError}
		if ev.Result != nil {
			d["result"] = *ev.Result
		}
		add("tool_result", d)
	case "compaction_start":
		add("compaction_start", map[string]any{})
	case "compaction_end":
		add("compaction_end", map[string]any{"removed": ev.Removed, "kept": ev.Kept, "reason": ev.Reason})
	}
	for _, f := range frames {
		s.deliver(f)
	}
	if e.Seq > s.last {
		s.last = e.Seq
	}
	s.flush()
	return s.c.ctx.Err() == nil && !s.stopped
}

// contentText joins the text blocks of a chat message's content.
func contentText(raw json.RawMessage) string {
	var blocks []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	_ = json.Unmarshal(raw, &blocks)
	var b strings.Builder
	for _, bl := range blocks {
		if bl.Type == "text" {
			b.WriteString(bl.Text)
		}
	}
	return b.String()
}

// subscribe starts following session for c (a no-op when it does already).
func (gw *agentickGW) subscribe(c *agClient, session string) *agError {
	c.mu.Lock()
	_, ok := c.subs[session]
	c.mu.Unlock()
	if ok {
		return nil
	}
	tail, err := gw.h.ChatTail(c.ctx, session)
	if err != nil {
		return agentickFromMesh(err, false)
	}
	ctx, cancel := context.WithCancel(c.ctx)
	s := &agSub{c: c, session: session, cancel: cancel, last: tail, text: map[string]string{}}
	c.mu.Lock()
	if c.ctx.Err() != nil || c.subs[session] != nil {
		c.mu.Unlock()
		cancel()
		return nil
	}
	c.subs[session] = s
	c.wg.Add(1)
	c.mu.Unlock()
	gw.mu.Lock()
	gw.session(session).subs[s] = struct{}{}
	gw.mu.Unlock()
	go func() {
		defer c.wg.Done()
		_, _ = gw.h.FollowChat(ctx, session, tail, s.onChat)
		s.end()
		cancel()
		gw.mu.Lock()
		if ss := gw.sessions[session]; ss != nil {
			delete(ss.subs, s)
			gw.tidy(session)
		}
		gw.mu.Unlock()
		c.mu.Lock()
		if c.subs[session] == s {
			delete(c.subs, session)
		}
		c.mu.Unlock()
	}()
	return nil
}

// unsubscribe stops following session for c. Nothing of the session is
// delivered after it returns: the follower may still hold a page of
// events, and the gateway's events may be waiting for their barrier, so
// the subscription is stopped under its lock (what it delivered before
// is queued ahead of unsubscribe's answer) and leaves the session's
// subscribers at once.
func (gw *agentickGW) unsubscribe(c *agClient, session string) {
	c.mu.Lock()
	s := c.subs[session]
	delete(c.subs, session)
	c.mu.Unlock()
	if s == nil {
		return
	}
	s.mu.Lock()
	s.stopped = true
	s.pending = nil
	s.mu.Unlock()
	s.cancel()
	gw.mu.Lock()
	if ss := gw.sessions[session]; ss != nil {
		delete(ss.subs, s)
		gw.tidy(session)
	}
	gw.mu.Unlock()
}

// emit sends a gateway event of session to its subscribers here, after
// the chat events up to barrier.
func (gw *agentickGW) emit(session, event string, data any, barrier uint64) {
	frame := agentickEventFrame(event, session, data)
	gw.mu.Lock()
	var subs []*agSub
	if s := gw.sessions[session]; s != nil {
		for sub := range s.subs {
			subs = append(subs, sub)
		}
	}
	gw.mu.Unlock()
	for _, s := range subs {
		s.offer(frame, barrier)
	}
}

// ---- calls into the mesh ----

// agTraceKey carries the W3C trace context of an /invoke request (its
// HTTP headers): agentick frames have no field for it.
type agTraceKey struct{}

// call runs method through the hub's ingress with ctx's caller (and the
// trace context of /invoke's headers).
func (gw *agentickGW) call(ctx context.Context, method string, params any) (json.RawMessage, error) {
	raw, isRaw := params.(json.RawMessage)
	if params != nil && !isRaw {
		b, err := json.Marshal(params)
		if err != nil {
			return nil, envelope.WrapError(envelope.CodeInvalidParams, "cannot encode params", err)
		}
		raw = b
	}
	req := &envelope.Request{ID: envelope.NewID(), Method: method, Params: raw,
		Timestamp: time.Now().UnixMilli(), Version: envelope.Version}
	if tc, ok := ctx.Value(agTraceKey{}).(http.Header); ok {
		for _, k := range []string{"traceparent", "tracestate", "baggage"} {
			if v := tc.Get(k); v != "" && len(v) <= 512 {
				req.Headers.Set(k, v)
			}
		}
	}
	res, err := gw.h.ingress(ctx, req)
	if err != nil {
		return nil, err
	}
	return res.Result, nil
}

func (gw *agentickGW) callInto(ctx context.Context, method string, params, out any) error {
	raw, err := gw.call(ctx, method, params)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return envelope.Errorf(envelope.CodeInternal, "%s: unexpected answer: %v", method, err)
	}
	return nil
}

// sessionName turns a session key ("name" or "chat:name") into the chat
// agent's id.
func sessionName(key string) (string, *agError) {
	name := key
	if app, rest, ok := strings.Cut(key, ":"); ok {
		if app != agentickApp {
			return "", agErr(agNotFoundResource, "app not found: %s", app)
		}
		name = rest
	}
	if name == "" {
		return "", agErr(agValidationReq, "sessionId is required")
	}
	return name, nil
}

type agContext struct {
	AgentID      string `json:"agent_id"`
	MessageCount int    `json:"message_count"`
	HistoryCount int    `json:"history_count"`
	CreatedAt    string `json:"created_at"`
	Busy         bool   `json:"busy"`
	Conversation int    `json:"conversation"` // resets so far
}

// ensureSession checks that the session exists, creating it when create
// is set (sessions are made on first use, as agentick's session keys).
func (gw *agentickGW) ensureSession(ctx context.Context, name string, create bool) (*agContext, *agError) {
	var info agContext
	err := gw.callInto(ctx, "chat.get_context", map[string]string{"agentId": name}, &info)
	if err == nil {
		return &info, nil
	}
	if !create || envelope.CodeOf(err) != envelope.CodeAgentNotFound {
		return nil, agentickFromMesh(err, false)
	}
	_, err = gw.call(ctx, "chat.create", map[string]string{"agent_id": name})
	if err != nil {
		if !strings.Contains(envelope.AsError(err).Message, "already exists") {
			return nil, agentickFromMesh(err, false)
		}
		// Made meanwhile by another caller: its context, as above.
		return gw.ensureSession(ctx, name, false)
	}
	return &agContext{AgentID: name}, nil
}

// apps lists the apps: "chat" when an agent serves chat.send.
func (gw *agentickGW) apps(ctx context.Context) ([]string, error) {
	var ms []MethodInfo
	if err := gw.callInto(ctx, "mesh.methods", nil, &ms); err != nil {
		return nil, err
	}
	for _, m := range ms {
		if m.Method == "chat.send" {
			return []string{agentickApp}, nil
		}
	}
	return []string{}, nil
}

type agListed struct {
	AgentID      string `json:"agent_id"`
	CreatedAt    string `json:"created_at"`
	MessageCount int    `json:"message_count"`
}

func (gw *agentickGW) listSessions(ctx context.Context) ([]agListed, error) {
	var l struct {
		Agents []agListed `json:"agents"`
	}
	if err := gw.callInto(ctx, "chat.list", nil, &l); err != nil {
		return nil, err
	}
	return l.Agents, nil
}

func (gw *agentickGW) lastActivity(name, createdAt string) string {
	gw.mu.Lock()
	defer gw.mu.Unlock()
	if t, ok := gw.activity[name]; ok {
		return t.UTC().Format(time.RFC3339Nano)
	}
	return createdAt
}

// ---- methods ----

// agParams reads a method's params by field: required, type-checked.
type agParams struct {
	m map[string]json.RawMessage
}

func newAgParams(raw json.RawMessage) (*agParams, *agError) {
	p := &agParams{m: map[string]json.RawMessage{}}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &p.m); err != nil {
			return nil, agErr(agValidationType, "params must be an object")
		}
	}
	return p, nil
}

func (p *agParams) has(k string) bool {
	v, ok := p.m[k]
	return ok && string(v) != "null"
}

func (p *agParams) str(k string, required bool) (string, *agError) {
	if !p.has(k) {
		if required {
			return "", agErr(agValidationReq, "%s is required", k)
		}
		return "", nil
	}
	var s string
	if json.Unmarshal(p.m[k], &s) != nil {
		return "", agErr(agValidationType, "%s must be a string", k)
	}
	if required && s == "" {
		return "", agErr(agValidationReq, "%s is required", k)
	}
	return s, nil
}

func (p *agParams) session() (string, *agError) {
	key, e := p.str("sessionId", true)
	if e != nil {
		return "", e
	}
	return sessionName(key)
}

// agentickMethods lists the seed's built-in methods.
var agentickMethods = []string{"send", "abort", "status", "history", "reset", "close", "apps", "sessions",
	"subscribe", "unsubscribe", "channel", "channel-subscribe", "schema", "tool-catalog", "tool-confirm", "tool-dispatch"}

// invoke runs one method for a caller (ctx carries it); c is its client
// when it has an event stream here.
func (gw *agentickGW) invoke(ctx context.Context, c *agClient, method string, raw json.RawMessage) (any, *agError) {
	if !slices.Contains(agentickMethods, method) {
		return gw.custom(ctx, method, raw)
	}
	if who := PrincipalOf(ctx); !gw.h.guard.mayCall(who, "agentick."+method) {
		gw.h.metrics().Refused("permission_denied")
		need, _ := gw.h.guard.roles.lookup("agentick." + method)
		return nil, agErr(agGuardDenied, "%s needs one of the roles %s", method, strings.Join(need, ", "))
	}
	p, e := newAgParams(raw)
	if e != nil {
		return nil, e
	}
	switch method {
	case "send":
		return gw.send(ctx, c, p)
	case "abort":
		return gw.abort(ctx, p)
	case "status":
		return gw.status(ctx, p)
	case "history":
		return gw.history(ctx, p)
	case "reset":
		return gw.reset(ctx, p)
	case "close":
		return gw.closeSession(ctx, p)
	case "apps":
		apps, err := gw.apps(ctx)
		if err != nil {
			return nil, agentickFromMesh(err, false)
		}
		out := []map[string]any{}
		for _, a := range apps {
			out = append(out, map[string]any{"id": a, "name": a, "description": "The chat-agent runtime (agents/chat)", "isDefault": a == agentickApp})
		}
		return map[string]any{"apps": out}, nil
	case "sessions":
		l, err := gw.listSessions(ctx)
		if err != nil {
			return nil, agentickFromMesh(err, false)
		}
		out := []map[string]any{}
		for _, a := range l {
			out = append(out, map[string]any{"id": a.AgentID, "appId": agentickApp, "createdAt": a.CreatedAt,
				"lastActivityAt": gw.lastActivity(a.AgentID, a.CreatedAt), "messageCount": a.MessageCount})
		}
		return map[string]any{"sessions": out}, nil
	case "subscribe", "unsubscribe":
		name, e := p.session()
		if e != nil {
			return nil, e
		}
		if c == nil {
			return nil, agErr(agNotFoundResource, "no event stream for this client: open GET /events?clientId=… and pass the same clientId")
		}
		if method == "unsubscribe" {
			gw.unsubscribe(c, name)
			return map[string]bool{"ok": true}, nil
		}
		if _, e := gw.ensureSession(ctx, name, true); e != nil {
			return nil, e
		}
		if e := gw.subscribe(c, name); e != nil {
			return nil, e
		}
		return map[string]bool{"ok": true}, nil
	case "channel", "channel-subscribe":
		return gw.channel(ctx, c, p, method == "channel")
	case "schema":
		return gw.schema(ctx)
	case "tool-catalog":
		return gw.toolCatalog(ctx, p)
	case "tool-confirm":
		return gw.toolConfirm(ctx, p)
	case "tool-dispatch":
		return gw.toolDispatch(ctx, p)
	}
	return nil, agErr(agNotFoundResource, "method not found: %s", method)
}

// custom runs a method the seed does not list: the mesh's method of that
// name, params passed as they are.
func (gw *agentickGW) custom(ctx context.Context, method string, raw json.RawMessage) (any, *agError) {
	if strings.HasPrefix(method, "agent.") {
		return nil, agErr(agNotFoundResource, "method not found: %s", method)
	}
	res, err := gw.call(ctx, method, raw)
	if err != nil {
		return nil, agentickFromMesh(err, false)
	}
	return res, nil
}

func (gw *agentickGW) send(ctx context.Context, c *agClient, p *agParams) (any, *agError) {
	name, e := p.session()
	if e != nil {
		return nil, e
	}
	msg, e := p.str("message", true)
	if e != nil {
		return nil, e
	}
	if p.has("attachments") {
		var a []json.RawMessage
		if json.Unmarshal(p.m["attachments"], &a) != nil {
			return nil, agErr(agValidationType, "attachments must be an array")
		}
		if len(a) > 0 {
			return nil, agErr(agValidationType, "attachments are not supported: the chat runtime takes text only")
		}
	}
	info, e := gw.ensureSession(ctx, name, true)
	if e != nil {
		return nil, e
	}
	if c != nil {
		if e := gw.subscribe(c, name); e != nil {
			return nil, e
		}
	}
	id := "msg-" + envelope.NewID()
	gw.mu.Lock()
	if gw.closed {
		gw.mu.Unlock()
		return nil, agErr(agInternalError, "hub is shutting down")
	}
	s := gw.session(name)
	if s.pending >= agentickMaxTurns {
		gw.mu.Unlock()
		return nil, agentickFromMesh(envelope.Errorf(envelope.CodeOverloaded, "session %s has %d sends waiting already", name, s.pending), false)
	}
	s.pending++
	gw.activity[name] = time.Now()
	gw.wg.Add(1)
	gw.mu.Unlock()
	// The turn outlives the request: it runs with the gateway's context
	// and the caller's principal.
	tctx := context.WithoutCancel(ctx)
	go gw.turn(tctx, s, name, id, msg, info.Conversation)
	return map[string]string{"messageId": id}, nil
}

// turn runs one send: execution_start, the chat turn (its events come
// through the subscriptions), result and execution_end. conv is the
// session's conversation when it was sent: after a reset since, the chat
// agent refuses the send (CANCELLED) instead of running it in the new,
// empty conversation.
func (gw *agentickGW) turn(ctx context.Context, s *agSession, name, id, msg string, conv int) {
	defer gw.wg.Done()
	defer func() {
		gw.mu.Lock()
		s.pending--
		gw.tidy(name)
		gw.mu.Unlock()
	}()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(gw.ctx, cancel)()
	select {
	case s.turn <- struct{}{}:
	case <-ctx.Done():
		return
	}
	defer func() { <-s.turn }()
	gw.mu.Lock()
	s.running = id
	gw.mu.Unlock()
	t0, _ := gw.h.ChatTail(ctx, name)
	gw.emit(name, "execution_start", map[string]any{"messageId": id}, t0)
	var out struct {
		Content string `json:"content"`
	}
	err := gw.callInto(ctx, "chat.send", map[string]any{"agentId": name, "content": msg, "request_id": id, "conversation": conv}, &out)
	gw.mu.Lock()
	s.running = ""
	gw.activity[name] = time.Now()
	gw.mu.Unlock()
	t1, terr := gw.h.ChatTail(ctx, name)
	if terr != nil {
		t1 = 0
	}
	if err != nil {
		ae := agentickFromMesh(err, false)
		gw.emit(name, "result", map[string]any{"messageId": id, "ok": false, "aborted": envelope.CodeOf(err) == envelope.CodeCancelled, "error": ae}, t1)
	} else {
		gw.emit(name, "result", map[string]any{"messageId": id, "ok": true, "content": out.Content}, t1)
	}
	gw.emit(name, "execution_end", map[string]any{"messageId": id, "ok": err == nil}, t1)
}

func (gw *agentickGW) abort(ctx context.Context, p *agParams) (any, *agError) {
	name, e := p.session()
	if e != nil {
		return nil, e
	}
	gw.mu.Lock()
	running := ""
	if s := gw.sessions[name]; s != nil {
		running = s.running
	}
	gw.mu.Unlock()
	if running == "" {
		if _, e := gw.ensureSession(ctx, name, false); e != nil {
			return nil, e
		}
		return nil, agErr(agStateComplete, "no execution running in session %s", name)
	}
	var out struct {
		Cancelled bool `json:"cancelled"`
	}
	if err := gw.callInto(ctx, "chat.cancel", map[string]string{"agentId": name, "request_id": running}, &out); err != nil {
		return nil, agentickFromMesh(err, false)
	}
	if !out.Cancelled {
		return nil, agErr(agStateComplete, "execution %s already complete", running)
	}
	return nil, nil
}

// reset clears a session's conversation (chat.reset). It cancels rather
// than refuses a running turn, as chat.reset does: a reset is meant for
// the whole conversation, the turn's answer would belong to the old one,
// and the seed's codes have none for "busy". The sends waiting here
// behind the running one are refused by the chat agent when their turn
// comes, as they name the conversation they were sent to (their result
// says aborted); sends made after the reset run on the empty history. A
// closed session (its file remains) is STATE_ALREADY_COMPLETE, an
// unknown one NOT_FOUND_RESOURCE.
func (gw *agentickGW) reset(ctx context.Context, p *agParams) (any, *agError) {
	name, e := p.session()
	if e != nil {
		return nil, e
	}
	if _, err := gw.call(ctx, "chat.reset", map[string]string{"agent_id": name}); err != nil {
		if envelope.CodeOf(err) != envelope.CodeAgentNotFound {
			return nil, agentickFromMesh(err, false)
		}
		// Not in the pool: closed before (its history is kept), or never there.
		_, herr := gw.call(ctx, "chat.getAgentMessages", map[string]any{"agentId": name, "limit": 1})
		switch {
		case herr == nil:
			return nil, agErr(agStateComplete, "session %s is closed", name)
		case envelope.CodeOf(herr) == envelope.CodeAgentNotFound:
			return nil, agErr(agNotFoundResource, "session not found: %s", name)
		}
		return nil, agentickFromMesh(herr, false)
	}
	gw.mu.Lock()
	gw.activity[name] = time.Now()
	gw.mu.Unlock()
	return map[string]bool{"ok": true}, nil
}

func (gw *agentickGW) status(ctx context.Context, p *agParams) (any, *agError) {
	key, e := p.str("sessionId", false)
	if e != nil {
		return nil, e
	}
	apps, err := gw.apps(ctx)
	if err != nil {
		return nil, agentickFromMesh(err, false)
	}
	l, err := gw.listSessions(ctx)
	if err != nil {
		return nil, agentickFromMesh(err, false)
	}
	out := map[string]any{"gateway": map[string]any{"id": gw.id, "uptime": time.Since(gw.start).Seconds(),
		"clients": gw.clientCount(), "sessions": len(l), "apps": apps}}
	if key != "" {
		name, e := sessionName(key)
		if e != nil {
			return nil, e
		}
		info, e := gw.ensureSession(ctx, name, false)
		if e != nil {
			return nil, e
		}
		out["session"] = map[string]any{"id": name, "appId": agentickApp, "messageCount": info.MessageCount,
			"createdAt": info.CreatedAt, "lastActivityAt": gw.lastActivity(name, info.CreatedAt), "isActive": info.Busy}
	}
	return out, nil
}

type agMessagesPage struct {
	Messages []struct {
		Role       string          `json:"role"`
		Content    json.RawMessage `json:"content"`
		ToolCallID string          `json:"toolCallId"`
		Timestamp  int64           `json:"timestamp"`
	} `json:"messages"`
	Total int `json:"total"`
}

func (gw *agentickGW) history(ctx context.Context, p *agParams) (any, *agError) {
	name, e := p.session()
	if e != nil {
		return nil, e
	}
	limit := 50
	if p.has("limit") {
		var n float64
		if json.Unmarshal(p.m["limit"], &n) != nil || n != float64(int(n)) || n < 1 || n > 1000 {
			return nil, agErr(agValidationType, "limit must be an integer from 1 to 1000")
		}
		limit = int(n)
	}
	end := -1
	if p.has("before") {
		b, e := p.str("before", false)
		if e != nil {
			return nil, e
		}
		n, err := strconv.Atoi(strings.TrimPrefix(b, "msg-"))
		if !strings.HasPrefix(b, "msg-") || err != nil || n < 0 {
			return nil, agErr(agValidationType, "before must be a message id (msg-N)")
		}
		end = n
	}
	if end < 0 {
		var total agMessagesPage
		if err := gw.callInto(ctx, "chat.getAgentMessages", map[string]any{"agentId": name, "offset": 0, "limit": 1}, &total); err != nil {
			return nil, agentickFromMesh(err, false)
		}
		end = total.Total
	}
	start := max(0, end-limit)
	msgs := []map[string]any{}
	if end > start {
		var page agMessagesPage
		if err := gw.callInto(ctx, "chat.getAgentMessages", map[string]any{"agentId": name, "offset": start, "limit": end - start}, &page); err != nil {
			return nil, agentickFromMesh(err, false)
		}
		for i, m := range page.Messages {
			role := m.Role
			if role == "toolResult" {
				role = "tool"
			}
			out := map[string]any{"id": "msg-" + strconv.Itoa(start+i), "role": role, "content": contentText(m.Content),
				"timestamp": time.UnixMilli(m.Timestamp).UTC().Format(time.RFC3339Nano)}
			var blocks []struct {
				Type      string          `json:"type"`
				Name      string          `json:"name"`
				Arguments json.RawMessage `json:"arguments"`
			}
			_ = json.Unmarshal(m.Content, &blocks)
			var calls []map[string]any
			for _, b := range blocks {
				if b.Type == "toolCall" {
					calls = append(calls, map[string]any{"name": b.Name, "input": b.Arguments})
				}
			}
			if calls != nil {
				out["toolCalls"] = calls
			}
			msgs = append(msgs, out)
		}
	}
	return map[string]any{"messages": msgs, "hasMore": start > 0}, nil
}

func (gw *agentickGW) closeSession(ctx context.Context, p *agParams) (any, *agError) {
	name, e := p.session()
	if e != nil {
		return nil, e
	}
	var out struct {
		Success bool `json:"success"`
	}
	if err := gw.callInto(ctx, "chat.destroy", map[string]string{"agent_id": name}, &out); err != nil {
		return nil, agentickFromMesh(err, false)
	}
	if out.Success {
		gw.mu.Lock()
		delete(gw.activity, name)
		gw.mu.Unlock()
		return map[string]bool{"ok": true}, nil
	}
	// Not in the pool: closed before, or never there.
	_, err := gw.call(ctx, "chat.getAgentMessages", map[string]any{"agentId": name, "limit": 1})
	switch {
	case err == nil:
		return nil, agErr(agStateComplete, "session %s is already closed", name)
	case envelope.CodeOf(err) == envelope.CodeAgentNotFound:
		return nil, agErr(agNotFoundResource, "session not found: %s", name)
	}
	return nil, agentickFromMesh(err, false)
}

func (gw *agentickGW) channel(ctx context.Context, c *agClient, p *agParams, publish bool) (any, *agError) {
	name, e := p.session()
	if e != nil {
		return nil, e
	}
	ch, e := p.str("channel", true)
	if e != nil {
		return nil, e
	}
	if len(ch) > 128 {
		return nil, agErr(agValidationType, "channel must be at most 128 bytes")
	}
	if !publish && c == nil {
		return nil, agErr(agNotFoundResource, "no event stream for this client: open GET /events?clientId=… and pass the same clientId")
	}
	if _, e := gw.ensureSession(ctx, name, false); e != nil {
		return nil, e
	}
	key := name + "\x00" + ch
	if !publish {
		c.mu.Lock()
		c.channels[key] = struct{}{}
		c.mu.Unlock()
		return map[string]bool{"ok": true}, nil
	}
	data := map[string]any{"channel": ch}
	if p.has("payload") {
		data["payload"] = p.m["payload"]
	}
	if c != nil {
		data["from"] = c.id
	}
	frame := agentickEventFrame("channel", name, data)
	gw.mu.Lock()
	var to []*agClient
	for _, o := range gw.clients {
		if o != c {
			to = append(to, o)
		}
	}
	gw.mu.Unlock()
	for _, o := range to {
		o.mu.Lock()
		_, sub := o.channels[key]
		o.mu.Unlock()
		if sub && !o.push(frame) {
			go o.kill()
		}
	}
	return map[string]bool{"ok": true}, nil
}

// agSchemaMethod is one method of the agentick schema.
type agSchemaMethod struct {
	Description string          `json:"description"`
	Builtin     bool            `json:"builtin"`
	Params      json.RawMessage `json:"params,omitempty"`
	Response    json.RawMessage `json:"response,omitempty"`
	Errors      []string        `json:"errors,omitempty"`
	Roles       []string        `json:"roles,omitempty"`
}

// agentickBacking names the mesh method behind each built-in whose
// authorisation it inherits (see the method table at the top).
var agentickBacking = map[string]string{
	"send": "chat.send", "abort": "chat.cancel", "history": "chat.getAgentMessages", "reset": "chat.reset",
	"close": "chat.destroy", "sessions": "chat.list", "status": "chat.list", "subscribe": "chat.events",
	"channel": "chat.get_context", "channel-subscribe": "chat.get_context",
}

// agentickBuiltins describe the seed's built-in methods.
var agentickBuiltins = func() map[string]agSchemaMethod {
	obj := func(props string, required ...string) json.RawMessage {
		r, _ := json.Marshal(required)
		if len(required) == 0 {
			r = []byte("[]")
		}
		return json.RawMessage(`{"type":"object","properties":{` + props + `},"required":` + string(r) + `}`)
	}
	sid := `"sessionId":{"type":"string"}`
	ok := obj(`"ok":{"type":"boolean"}`, "ok")
	nf := []string{agNotFoundResource, agValidationReq, agValidationType, agGuardDenied, agInternalError}
	return map[string]agSchemaMethod{
		"send": {Description: "Send message to session (created on first use); the turn's events follow on the event stream", Builtin: true,
			Params:   obj(sid+`,"message":{"type":"string"},"attachments":{"type":"array","maxItems":0}`, "sessionId", "message"),
			Response: obj(`"messageId":{"type":"string"}`, "messageId"), Errors: nf},
		"abort": {Description: "Abort current execution", Builtin: true, Params: obj(sid, "sessionId"),
			Errors: append(slices.Clone(nf), agStateComplete, agMethodError)},
		"status": {Description: "Get status", Builtin: true, Params: obj(sid),
			Response: obj(`"gateway":{"type":"object"},"session":{"type":"object"}`, "gateway"), Errors: nf},
		"history": {Description: "Get history", Builtin: true,
			Params:   obj(sid+`,"limit":{"type":"integer","minimum":1,"maximum":1000},"before":{"type":"string"}`, "sessionId"),
			Response: obj(`"messages":{"type":"array"},"hasMore":{"type":"boolean"}`, "messages", "hasMore"), Errors: nf},
		"reset": {Description: "Reset session: cancel its running and waiting sends, move its history aside (chat.reset) and start it empty", Builtin: true,
			Params: obj(sid, "sessionId"), Response: ok, Errors: append(slices.Clone(nf), agStateComplete, agMethodError)},
		"close": {Description: "Close session", Builtin: true, Params: obj(sid, "sessionId"), Response: ok,
			Errors: append(slices.Clone(nf), agStateComplete)},
		"apps":        {Description: "List apps", Builtin: true, Response: obj(`"apps":{"type":"array"}`, "apps"), Errors: []string{agGuardDenied, agInternalError}},
		"sessions":    {Description: "List sessions", Builtin: true, Response: obj(`"sessions":{"type":"array"}`, "sessions"), Errors: []string{agGuardDenied, agInternalError}},
		"subscribe":   {Description: "Subscribe to events", Builtin: true, Params: obj(sid, "sessionId"), Response: ok, Errors: nf},
		"unsubscribe": {Description: "Unsubscribe", Builtin: true, Params: obj(sid, "sessionId"), Response: ok, Errors: nf},
		"channel": {Description: "Publish to channel", Builtin: true,
			Params: obj(sid+`,"channel":{"type":"string"},"payload":{}`, "sessionId", "channel"), Response: ok, Errors: nf},
		"channel-subscribe": {Description: "Subscribe to channel", Builtin: true,
			Params: obj(sid+`,"channel":{"type":"string"}`, "sessionId", "channel"), Response: ok, Errors: nf},
		"schema": {Description: "Protocol discovery", Builtin: true,
			Response: obj(`"protocolVersion":{"type":"string"},"methods":{"type":"object"},"events":{"type":"array"},"errors":{"type":"object"}`, "protocolVersion", "methods", "events", "errors"),
			Errors:   []string{agGuardDenied, agInternalError}},
		"tool-catalog": {Description: "List session tools: the mesh methods a session reaches with its mesh_call tool", Builtin: true,
			Params: obj(sid, "sessionId"), Response: obj(`"tools":{"type":"array"}`, "tools"), Errors: nf},
		"tool-confirm": {Description: "Respond to tool confirmation. Always NOT_FOUND_RESOURCE here: the chat runtime runs its tools without asking for confirmation, so no tool call ever awaits one", Builtin: true,
			Params:   obj(sid+`,"callId":{"type":"string"},"confirmed":{"type":"boolean"},"reason":{"type":"string"}`, "sessionId", "callId", "confirmed"),
			Response: ok, Errors: nf},
		"tool-dispatch": {Description: "Dispatch tool directly: call the mesh method named tool with input", Builtin: true,
			Params:   obj(sid+`,"tool":{"type":"string"},"input":{"type":"object"}`, "sessionId", "tool", "input"),
			Response: obj(`"content":{"type":"array"}`, "content"), Errors: append(slices.Clone(nf), agNotFoundTool, agMethodError)},
	}
}()

// agentickCodeOf maps a mesh code name to the seed's code.
func agentickCodeOf(name string) string {
	c, ok := envelope.ParseCode(name)
	if !ok {
		return agInternalError
	}
	return agentickFromMesh(envelope.NewError(c, ""), false).Code
}

func (gw *agentickGW) meshSchema(ctx context.Context) (*SchemaPayload, *agError) {
	var s SchemaPayload
	if err := gw.callInto(ctx, "mesh.schema", nil, &s); err != nil {
		return nil, agentickFromMesh(err, false)
	}
	return &s, nil
}

func (gw *agentickGW) schema(ctx context.Context) (any, *agError) {
	ms, e := gw.meshSchema(ctx)
	if e != nil {
		return nil, e
	}
	methods := map[string]agSchemaMethod{}
	for name, m := range agentickBuiltins {
		// The role table may guard the agentick method itself; else the
		// mesh method behind it decides (the ingress checks it on every
		// call the gateway makes).
		m.Roles = gw.h.rolesOf("agentick."+name, nil)
		if back := agentickBacking[name]; m.Roles == nil && back != "" {
			m.Roles = gw.h.rolesOf(back, nil)
		}
		methods[name] = m
	}
	for name, m := range ms.Methods {
		// The mesh's own built-ins are callable here as custom methods
		// (mesh.agents, mesh.methods, …): listed, builtin true. Agent
		// control (agent.register, …) is not reachable from a gateway.
		if m.Pattern || strings.HasPrefix(name, "agent.") {
			continue
		}
		if _, ok := methods[name]; ok {
			continue
		}
		var errs []string
		for _, c := range m.Errors {
			if a := agentickCodeOf(c); !slices.Contains(errs, a) {
				errs = append(errs, a)
			}
		}
		slices.Sort(errs)
		methods[name] = agSchemaMethod{Description: m.Description, Builtin: m.Builtin, Params: m.Params, Response: m.Response, Errors: errs, Roles: m.Roles}
	}
	return map[string]any{"protocolVersion": agentickVersion, "methods": methods, "events": agentickEvents, "errors": agentickErrors}, nil
}

func (gw *agentickGW) toolCatalog(ctx context.Context, p *agParams) (any, *agError) {
	name, e := p.session()
	if e != nil {
		return nil, e
	}
	if _, e := gw.ensureSession(ctx, name, false); e != nil {
		return nil, e
	}
	ms, e := gw.meshSchema(ctx)
	if e != nil {
		return nil, e
	}
	who := PrincipalOf(ctx)
	tools := []map[string]any{}
	for m, s := range ms.Methods {
		if s.Builtin || s.Pattern || !gw.h.guard.mayCall(who, m) {
			continue
		}
		in := objectSchema(s.Params)
		if in == nil {
			in = json.RawMessage(`{"type":"object"}`)
		}
		tools = append(tools, map[string]any{"name": m, "description": s.Description, "input": in, "type": "mesh"})
	}
	sort.Slice(tools, func(i, j int) bool { return tools[i]["name"].(string) < tools[j]["name"].(string) })
	return map[string]any{"tools": tools}, nil
}

func (gw *agentickGW) toolConfirm(ctx context.Context, p *agParams) (any, *agError) {
	name, e := p.session()
	if e != nil {
		return nil, e
	}
	callID, e := p.str("callId", true)
	if e != nil {
		return nil, e
	}
	if !p.has("confirmed") {
		return nil, agErr(agValidationReq, "confirmed is required")
	}
	var b bool
	if json.Unmarshal(p.m["confirmed"], &b) != nil {
		return nil, agErr(agValidationType, "confirmed must be a boolean")
	}
	if _, e := p.str("reason", false); e != nil {
		return nil, e
	}
	if _, e := gw.ensureSession(ctx, name, false); e != nil {
		return nil, e
	}
	return nil, agErr(agNotFoundResource, "no tool call %s awaits confirmation in session %s: the chat runtime runs its tools without confirmation", callID, name)
}

func (gw *agentickGW) toolDispatch(ctx context.Context, p *agParams) (any, *agError) {
	name, e := p.session()
	if e != nil {
		return nil, e
	}
	tool, e := p.str("tool", true)
	if e != nil {
		return nil, e
	}
	if !p.has("input") {
		return nil, agErr(agValidationReq, "input is required")
	}
	input := bytes.TrimSpace(p.m["input"])
	if len(input) == 0 || input[0] != '{' {
		return nil, agErr(agValidationType, "input must be an object")
	}
	if _, e := gw.ensureSession(ctx, name, false); e != nil {
		return nil, e
	}
	if _, builtin := gw.h.builtins[tool]; builtin || !toolName(tool) {
		return nil, agErr(agNotFoundTool, "tool not found: %s", tool)
	}
	res, err := gw.call(ctx, tool, json.RawMessage(input))
	if err != nil {
		return nil, agentickFromMesh(err, true)
	}
	return map[string]any{"content": []map[string]string{{"type": "text", "text": string(res)}}}, nil
}

// answer runs a decoded req and encodes its res.
func (gw *agentickGW) answer(ctx context.Context, c *agClient, f *agFrame) (out []byte, ae *agError) {
	defer func() {
		if p := recover(); p != nil {
			gw.h.log.Error("agentick: method panicked", "method", f.Method, "panic", fmt.Sprint(p))
			ae = agErr(agInternalError, "unexpected failure in %s", f.Method)
			out = agentickRes(f.ID, nil, ae)
		}
	}()
	v, e := gw.invoke(ctx, c, f.Method, f.Params)
	if e != nil {
		return agentickRes(f.ID, nil, e), e
	}
	var payload json.RawMessage
	switch v := v.(type) {
	case nil:
	case json.RawMessage:
		payload = v
	default:
		b, err := json.Marshal(v)
		if err != nil {
			e := agErr(agInternalError, "cannot encode the answer")
			return agentickRes(f.ID, nil, e), e
		}
		payload = b
	}
	return agentickRes(f.ID, payload, nil), nil
}

// connected is the answer to connect.
func (gw *agentickGW) connected(ctx context.Context) []byte {
	apps, err := gw.apps(ctx)
	if err != nil {
		apps = []string{}
	}
	sessions := []string{}
	if l, err := gw.listSessions(ctx); err == nil {
		for _, a := range l {
			sessions = append(sessions, a.AgentID)
		}
	}
	b, _ := json.Marshal(struct {
		Type            string   `json:"type"`
		GatewayID       string   `json:"gatewayId"`
		ProtocolVersion string   `json:"protocolVersion"`
		Apps            []string `json:"apps"`
		Sessions        []string `json:"sessions"`
	}{"connected", gw.id, agentickVersion, apps, sessions})
	return b
}

// ---- transports ----

// agentickRoutes mounts the agentick surface on mux.
func (h *Hub) agentickRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /agentick/ws", h.serveAgentickWS)
	// The seed's clients connect to ws://host:port: a WebSocket upgrade at
	// the root is agentick's (the root's POST is NEXUS3's; the mesh's own
	// WebSocket is /ws). A plain GET / is not a method the root serves.
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		if !websocket.IsWebSocketUpgrade(r) {
			w.Header().Set("Allow", "POST")
			http.Error(w, "GET / serves only agentick's WebSocket upgrade; POST / is NEXUS3 JSON-RPC", http.StatusMethodNotAllowed)
			return
		}
		h.serveAgentickWS(w, r)
	})
	mux.HandleFunc("GET /events", h.serveAgentickEvents)
	mux.HandleFunc("POST /invoke", h.serveAgentickInvoke)
}

func writeAgentickJSON(w http.ResponseWriter, status int, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// serveAgentickInvoke is POST /invoke.
func (h *Hub) serveAgentickInvoke(w http.ResponseWriter, r *http.Request) {
	who, ok := h.admit(w, r)
	if !ok {
		return
	}
	limit := h.cfg.Conn.Limits.MaxBytes
	if r.ContentLength > int64(limit) {
		writeAgentickJSON(w, http.StatusRequestEntityTooLarge, agentickRes("", nil, agErr(agValidationType, "body exceeds the limit of %d bytes", limit)))
		return
	}
	data, err := readExact(http.MaxBytesReader(w, r.Body, int64(limit)), limit)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeAgentickJSON(w, http.StatusRequestEntityTooLarge, agentickRes("", nil, agErr(agValidationType, "body exceeds the limit of %d bytes", limit)))
			return
		}
		writeAgentickJSON(w, http.StatusBadRequest, agentickRes("", nil, agErr(agValidationType, "cannot read the request body")))
		return
	}
	f, e := decodeAgentickFrame(data, h.cfg.Conn.Limits, true)
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
	gw := h.agentick()
	tc := http.Header{}
	for _, k := range []string{"traceparent", "tracestate", "baggage"} {
		if v := r.Header.Get(k); v != "" {
			tc.Set(k, v)
		}
	}
	ctx := context.WithValue(r.Context(), agTraceKey{}, tc)
	if who != nil {
		ctx = context.WithValue(ctx, principalKey{}, who)
	}
	var c *agClient
	if f.ClientID != "" {
		// The client's event stream, if it has one here and is the same caller.
		if cl := gw.client(f.ClientID); cl != nil && (!h.guard.on() || sameSubject(cl.who, who)) {
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

// serveAgentickEvents is GET /events?clientId=: the client's events as
// server-sent events, one JSON frame per "data:" line, the first the
// connected frame; comment lines keep it alive; it ends with the request.
func (h *Hub) serveAgentickEvents(w http.ResponseWriter, r *http.Request) {
	who, ok := h.admit(w, r)
	if !ok {
		return
	}
	id := r.URL.Query().Get("clientId")
	if id == "" || len(id) > 128 || !utf8.ValidString(id) {
		writeAgentickJSON(w, http.StatusBadRequest, agentickErrorFrame(agErr(agValidationReq, "clientId is required (1 to 128 bytes)")))
		return
	}
	gw := h.agentick()
	c := gw.newClient(connOf(r.Context()), id, who)
	out := make(chan []byte, agentickQueue)
	c.push = func(b []byte) bool {
		select {
		case out <- b:
			return true
		default:
			return false
		}
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
		case <-tick.C:
			if !write([]byte(": keep-alive\n\n")) {
				return
			}
		}
	}
}

// serveAgentickWS is GET /agentick/ws.
func (h *Hub) serveAgentickWS(w http.ResponseWriter, r *http.Request) {
	who, ok := h.admit(w, r)
	if !ok {
		return
	}
	ws, err := h.upgrader.Upgrade(w, r, nil)
	if err != nil {
		return
	}
	h.startAgentickWS(ws, who, connOf(r.Context()))
}

// agWS is one agentick WebSocket. Until connect it has no client.
type agWS struct {
	gw   *agentickGW
	c    *wsConn
	who  *Principal
	conn string        // the connection's remote address, for rate limits
	busy chan struct{} // a token per request in flight

	mu     sync.Mutex
	client *agClient
}

func (h *Hub) startAgentickWS(ws *websocket.Conn, who *Principal, conn string) {
	gw := h.agentick()
	a := &agWS{gw: gw, c: newWSConn(ws, h.cfg.Conn), who: who, conn: conn, busy: make(chan struct{}, agentickInFlight)}
	if !h.track(a) {
		_ = ws.Close()
		return
	}
	// No message-level check on this connection (c.check is nil): the
	// surface decodes and refuses its frames itself.
	a.c.start(func(data []byte, _ *envelope.Error) { a.onMessage(data) }, func(error) {
		go func() {
			a.end()
			h.untrack(a)
		}()
	})
}

func (a *agWS) send(b []byte) bool {
	buf := getBuf()
	*buf = append(*buf, b...)
	return a.c.send(buf)
}

// onMessage runs on the reader goroutine: it must not block.
func (a *agWS) onMessage(data []byte) {
	f, e := decodeAgentickFrame(data, a.c.cfg.Limits, false)
	if e != nil {
		if f.Type == "req" && f.ID != "" {
			a.send(agentickRes(f.ID, nil, e))
		} else {
			a.send(agentickErrorFrame(e))
		}
		return
	}
	a.mu.Lock()
	c := a.client
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
			b, _ := a.gw.answer(c.ctx, c, f)
			a.send(b)
		}()
	}
}

// connect makes the socket the client id; it answers connected.
func (a *agWS) connect(id string) {
	c := a.gw.newClient(a.conn, id, a.who)
	c.push = func(b []byte) bool {
		buf := getBuf()
		*buf = append(*buf, b...)
		return a.c.trySend(buf)
	}
	c.close = func() { a.c.shutdown(errors.New("agentick client closed")) }
	if e := a.gw.attach(c); e != nil {
		c.cancel()
		a.send(agentickErrorFrame(e))
		return
	}
	a.mu.Lock()
	a.client = c
	a.mu.Unlock()
	// The answer needs calls into the mesh: off the reader goroutine.
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		a.send(a.gw.connected(c.ctx))
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
