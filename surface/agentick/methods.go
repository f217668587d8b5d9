package agentick

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/agentmesh/agentmesh/contract/chat"
	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/stream"
	"github.com/agentmesh/agentmesh/surface"
)

// ---- calls into the mesh ----

// agTraceKey carries the W3C trace context of an /invoke request (its
// HTTP headers): agentick frames have no field for it.
type agTraceKey struct{}

// call runs method through the hub's ingress with ctx's caller (and the
// trace context of /invoke's headers).
func (gw *gateway) call(ctx context.Context, method string, params any) (json.RawMessage, error) {
	req, err := newRequest(ctx, method, params)
	if err != nil {
		return nil, err
	}
	res, err := gw.h.Invoke(ctx, req)
	if err != nil {
		return nil, err
	}
	return res.Result, nil
}

// newRequest is the request of a call to method with params, carrying
// the trace context of /invoke's headers.
func newRequest(ctx context.Context, method string, params any) (*envelope.Request, error) {
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
	return req, nil
}

// agReqKey carries the id of the agentick request being answered.
type agReqKey struct{}

// streamMethod runs a streaming method for client c: each chunk is a
// method:chunk event {requestId, method, seq, chunk} sent to c (on its
// WebSocket, or its event stream for /invoke), waiting for room; then a
// method:end event {requestId, method, chunks, error?}; the request's
// answer is the stream's end.
func (gw *gateway) streamMethod(ctx context.Context, c *agClient, method string, raw json.RawMessage) (any, *agError) {
	if c == nil || c.stream == nil {
		return nil, agErr(agValidationReq, "%s is a streaming method: call it on the WebSocket, or pass the clientId of your event stream (GET /events)", method)
	}
	req, err := newRequest(ctx, method, raw)
	if err != nil {
		return nil, agentickFromMesh(err, false)
	}
	id, _ := ctx.Value(agReqKey{}).(string)
	var n uint64
	res, err := stream.Relay(ctx, gw.h.Invoke, req, stream.RelayWindow, func(seq uint64, data json.RawMessage) error {
		n = seq
		ev := agentickEventFrame("method:chunk", "", map[string]any{"requestId": id, "method": method, "seq": seq, "chunk": data})
		if !c.stream(ctx, ev) {
			return envelope.NewError(envelope.CodeCancelled, "the agentick client is gone")
		}
		return nil
	})
	end := map[string]any{"requestId": id, "method": method, "chunks": n}
	var ae *agError
	if err != nil {
		ae = agentickFromMesh(err, false)
		end["error"] = ae
	}
	c.stream(ctx, agentickEventFrame("method:end", "", end))
	if ae != nil {
		return nil, ae
	}
	return res.Result, nil
}

func (gw *gateway) callInto(ctx context.Context, method string, params, out any) error {
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

// ensureSession checks that the session exists, creating it when create
// is set (sessions are made on first use, as agentick's session keys).
func (gw *gateway) ensureSession(ctx context.Context, name string, create bool) (*chat.ContextInfo, *agError) {
	var info chat.ContextInfo
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
	return &chat.ContextInfo{AgentID: name}, nil
}

// apps lists the apps: "chat" when an agent serves chat.send.
func (gw *gateway) apps(ctx context.Context) ([]string, error) {
	var ms []control.MethodInfo
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

func (gw *gateway) listSessions(ctx context.Context) ([]chat.AgentInfo, error) {
	var l struct {
		Agents []chat.AgentInfo `json:"agents"`
	}
	if err := gw.callInto(ctx, "chat.list", nil, &l); err != nil {
		return nil, err
	}
	return l.Agents, nil
}

func (gw *gateway) lastActivity(name, createdAt string) string {
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
func (gw *gateway) invoke(ctx context.Context, c *agClient, method string, raw json.RawMessage) (any, *agError) {
	if !slices.Contains(agentickMethods, method) {
		if gw.h.Streaming(method) && !strings.HasPrefix(method, "agent.") {
			return gw.streamMethod(ctx, c, method, raw)
		}
		return gw.custom(ctx, method, raw)
	}
	if who, _ := gw.h.Caller(ctx); !gw.h.MayCall(who, "agentick."+method) {
		gw.h.Metrics().Refused("permission_denied")
		need, _ := gw.h.RequiredRoles("agentick." + method)
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
func (gw *gateway) custom(ctx context.Context, method string, raw json.RawMessage) (any, *agError) {
	if strings.HasPrefix(method, "agent.") {
		return nil, agErr(agNotFoundResource, "method not found: %s", method)
	}
	res, err := gw.call(ctx, method, raw)
	if err != nil {
		return nil, agentickFromMesh(err, false)
	}
	return res, nil
}

func (gw *gateway) send(ctx context.Context, c *agClient, p *agParams) (any, *agError) {
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
	// Its place in the session's line is taken here, as the send is
	// accepted: turns run in the order of their sends (a goroutine each
	// racing for the session made a later send run first).
	ready := make(chan struct{})
	if s.busy {
		s.queue = append(s.queue, ready)
	} else {
		s.busy = true
		close(ready)
	}
	gw.activity[name] = time.Now()
	gw.wg.Add(1)
	gw.mu.Unlock()
	// The turn outlives the request: it runs with the gateway's context
	// and the caller's principal.
	tctx := context.WithoutCancel(ctx)
	go gw.turn(tctx, s, ready, name, id, msg, info.Conversation)
	return map[string]string{"messageId": id}, nil
}

// nextTurn lets the session's next waiting turn run, under mu.
func (gw *gateway) nextTurn(s *agSession) {
	if len(s.queue) == 0 {
		s.busy = false
		return
	}
	close(s.queue[0])
	s.queue = s.queue[1:]
}

// turn runs one send: execution_start, the chat turn (its events come
// through the subscriptions), result and execution_end. conv is the
// session's conversation when it was sent: after a reset since, the chat
// agent refuses the send (CANCELLED) instead of running it in the new,
// empty conversation.
func (gw *gateway) turn(ctx context.Context, s *agSession, ready chan struct{}, name, id, msg string, conv int) {
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
	case <-ready:
	case <-ctx.Done():
		gw.mu.Lock()
		if i := slices.Index(s.queue, ready); i >= 0 {
			s.queue = slices.Delete(s.queue, i, i+1)
		} else {
			gw.nextTurn(s) // its turn came meanwhile: the next one's
		}
		gw.mu.Unlock()
		return
	}
	defer func() {
		gw.mu.Lock()
		gw.nextTurn(s)
		gw.mu.Unlock()
	}()
	gw.mu.Lock()
	s.running = id
	gw.mu.Unlock()
	t0, _ := surface.ChatTail(ctx, gw.h, name)
	gw.emit(name, "execution_start", map[string]any{"messageId": id}, t0)
	var out chat.SendResult
	err := gw.callInto(ctx, "chat.send", map[string]any{"agentId": name, "content": msg, "request_id": id, "conversation": conv}, &out)
	gw.mu.Lock()
	s.running = ""
	gw.activity[name] = time.Now()
	gw.mu.Unlock()
	t1, terr := surface.ChatTail(ctx, gw.h, name)
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

func (gw *gateway) abort(ctx context.Context, p *agParams) (any, *agError) {
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
func (gw *gateway) reset(ctx context.Context, p *agParams) (any, *agError) {
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

func (gw *gateway) status(ctx context.Context, p *agParams) (any, *agError) {
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

func (gw *gateway) history(ctx context.Context, p *agParams) (any, *agError) {
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
		var total chat.MessagesPage
		if err := gw.callInto(ctx, "chat.getAgentMessages", map[string]any{"agentId": name, "offset": 0, "limit": 1}, &total); err != nil {
			return nil, agentickFromMesh(err, false)
		}
		end = total.Total
	}
	start := max(0, end-limit)
	msgs := []map[string]any{}
	if end > start {
		var page chat.MessagesPage
		if err := gw.callInto(ctx, "chat.getAgentMessages", map[string]any{"agentId": name, "offset": start, "limit": end - start}, &page); err != nil {
			return nil, agentickFromMesh(err, false)
		}
		for i, m := range page.Messages {
			role := m.Role
			if role == chat.RoleToolResult {
				role = "tool"
			}
			out := map[string]any{"id": "msg-" + strconv.Itoa(start+i), "role": role, "content": chat.TextOf(m.Content),
				"timestamp": time.UnixMilli(m.Timestamp).UTC().Format(time.RFC3339Nano)}
			var calls []map[string]any
			for _, b := range chat.ToolCalls(m.Content) {
				calls = append(calls, map[string]any{"name": b.Name, "input": b.Arguments})
			}
			if calls != nil {
				out["toolCalls"] = calls
			}
			msgs = append(msgs, out)
		}
	}
	return map[string]any{"messages": msgs, "hasMore": start > 0}, nil
}

func (gw *gateway) closeSession(ctx context.Context, p *agParams) (any, *agError) {
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

func (gw *gateway) channel(ctx context.Context, c *agClient, p *agParams, publish bool) (any, *agError) {
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
