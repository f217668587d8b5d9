package nexus3

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/surface"
)

// The NEXUS3 surface (seed nexus3-rpc-module): the HTTP JSON-RPC of
// `nexus3 --serve`, so that its clients work against a hub unchanged.
//
//	POST /              global methods: create_agent, destroy_agent, list_agents
//	POST /rpc           the same three names (see below)
//	POST /agent/{id}    agent methods: send, cancel, shutdown, get_tokens, get_context
//
// It is a dialect at the edge, not a dispatcher: each NEXUS3 method is
// translated into a call of the chat agent's method (package agents/chat:
// create_agent → chat.create_agent, send → chat.send with agentId = {id},
// …) and run through the hub's ingress like a native call (authentication,
// authorisation, policies, tracing, metrics), then its answer and error
// are translated back into NEXUS3's shapes: {"jsonrpc","id","result"} or
// {"jsonrpc","id","error":{"code","message"}} with the error's own message
// ("Missing required parameter: content", "Method not found: x"). A
// request without an id, or with id null (NEXUS3's None), is a
// notification: it runs, and is answered with HTTP 204 and no body. An
// agent the chat runtime does not know is HTTP 404 {"error": "Agent not
// found: ID"}, as NEXUS3 answers for an id not in its pool.
//
// /rpc stays the mesh's generic JSON-RPC endpoint. A single call there of
// create_agent, destroy_agent or list_agents, when no built-in and no
// agent serves that exact name, is answered by this surface, so that a NEXUS3 client using /rpc, the seed's alias of /, gets
// NEXUS3's answers; every other call on /rpc is untouched.

// nexus3Global maps NEXUS3's global methods to the chat agent's.
var nexus3Global = map[string]string{
	"create_agent":  "chat.create_agent",
	"destroy_agent": "chat.destroy_agent",
	"list_agents":   "chat.list_agents",
}

// nexus3Agent maps NEXUS3's agent methods to the chat agent's.
var nexus3Agent = map[string]string{
	"send":        "chat.send",
	"cancel":      "chat.cancel",
	"shutdown":    "chat.shutdown",
	"get_tokens":  "chat.get_tokens",
	"get_context": "chat.get_context",
}

// Mount serves the NEXUS3 surface on h: POST / and POST /agent/{id},
// and NEXUS3's global methods on /rpc when nothing else serves them.
func Mount(h surface.Host) {
	s := &server{h: h}
	h.Handle("POST /{$}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.serve(w, r, "") }))
	h.Handle("POST /agent/{id}", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.serve(w, r, r.PathValue("id"))
	}))
	h.InterceptRPC(func(m string) bool { _, ok := nexus3Global[m]; return ok }, func(w http.ResponseWriter, ctx context.Context, c *envelope.RPCCall, hdr http.Header) {
		s.serveCall(w, ctx, "", c, hdr)
	})
}

// server is the NEXUS3 surface on one hub.
type server struct{ h surface.Host }

// nexus3Error is a JSON-RPC error in NEXUS3's shape.
type nexus3Error struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    any    `json:"data,omitempty"`
}

// nexus3Err is code's error with NEXUS3's codes (its error table has
// only JSON-RPC's standard codes and -32000 SERVER_ERROR, "application-
// specific"): a standard code stays; a mesh code of its own (CANCELLED,
// UNAVAILABLE, TIMEOUT, ...) is -32000, its message "CODE: message" and
// its data {"code": CODE}, where the mesh's own surfaces answer -32006,
// -32002, ....
func nexus3Err(code envelope.Code, msg string) *nexus3Error {
	switch c := code.JSONRPC(); c {
	case -32700, -32600, -32601, -32602, -32603, -32000:
		return &nexus3Error{Code: c, Message: msg}
	}
	return &nexus3Error{Code: -32000, Message: code.String() + ": " + msg, Data: map[string]string{"code": code.String()}}
}

func nexus3FromMesh(err error) *nexus3Error {
	e := envelope.AsError(err)
	msg := e.Message
	if msg == "" {
		msg = e.Code.String()
	}
	return nexus3Err(e.Code, msg)
}

// writeNexus3HTTPError answers a failure outside JSON-RPC (unknown agent,
// body too large) as NEXUS3 does: its HTTP status and {"error": msg}.
func writeNexus3HTTPError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := json.Marshal(map[string]string{"error": msg})
	_, _ = w.Write(b)
}

// serve serves one NEXUS3 request: a global one when agent is "",
// else one for that agent.
func (s *server) serve(w http.ResponseWriter, r *http.Request, agent string) {
	ctx, ok := s.h.AuthRequest(w, r)
	if !ok {
		return
	}
	limit := s.h.ConnConfig().Limits.MaxBytes
	tooBig := "Request body too large (limit " + strconv.Itoa(limit) + " bytes)"
	if r.ContentLength > int64(limit) {
		writeNexus3HTTPError(w, http.StatusRequestEntityTooLarge, tooBig)
		return
	}
	data, err := link.ReadExact(http.MaxBytesReader(w, r.Body, int64(limit)), limit)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeNexus3HTTPError(w, http.StatusRequestEntityTooLarge, tooBig)
			return
		}
		writeNexus3HTTPError(w, http.StatusBadRequest, "Cannot read the request body")
		return
	}
	calls, batch, derr := envelope.DecodeJSONRPC(data, s.h.ConnConfig().Limits)
	switch {
	case derr != nil:
		s.reply(w, ctx, agent, nil, false, nil, nexus3Err(derr.Code, derr.Message))
	case batch:
		s.reply(w, ctx, agent, nil, false, nil, nexus3Err(envelope.CodeInvalidRequest, "Request must be a JSON object"))
	default:
		s.serveCall(w, ctx, agent, &calls[0], r.Header)
	}
}

// serveCall runs one decoded NEXUS3 request and answers it.
func (s *server) serveCall(w http.ResponseWriter, ctx context.Context, agent string, c *envelope.RPCCall, hdr http.Header) {
	// NEXUS3 reads a missing id and id null alike: None, a notification.
	notify := c.Notification || string(c.ID) == "null"
	if c.Err != nil {
		// Not a valid request: answered, id or not (NEXUS3's ParseError).
		s.reply(w, ctx, agent, c.ID, false, nil, nexus3Err(c.Err.Code, c.Err.Message))
		return
	}
	in := &c.Request
	params := in.Params
	if len(params) > 0 && params[0] == '[' {
		s.reply(w, ctx, agent, c.ID, notify, nil, nexus3Err(envelope.CodeInvalidParams, "Positional params not supported, use named params"))
		return
	}
	table := nexus3Global
	if agent != "" {
		table = nexus3Agent
	}
	method, ok := table[in.Method]
	if !ok {
		s.reply(w, ctx, agent, c.ID, notify, nil, nexus3Err(envelope.CodeMethodNotFound, "Method not found: "+in.Method))
		return
	}
	if agent != "" {
		// The agent is the path's: it goes in the params as agentId.
		id, _ := json.Marshal(agent)
		var perr *envelope.Error
		if params, perr = envelope.SetCheckedMember(params, "agentId", id); perr != nil {
			s.reply(w, ctx, agent, c.ID, notify, nil, nexus3Err(envelope.CodeInvalidParams, "Invalid params: "+perr.Message))
			return
		}
	}
	// Headers come as on /rpc, from the body's optional "meta"; the W3C
	// trace context may also come in HTTP headers, as NEXUS3 clients
	// know nothing of meta.
	req := &envelope.Request{ID: envelope.NewID(), Method: method, Params: params, Headers: in.Headers,
		Timestamp: time.Now().UnixMilli(), Version: envelope.Version}
	if req.Headers.Traceparent == "" {
		for _, k := range []string{"traceparent", "tracestate", "baggage"} {
			if v := hdr.Get(k); v != "" && len(v) <= 512 {
				req.Headers.Set(k, v)
			}
		}
	}
	if k := hdr.Get("Idempotency-Key"); k != "" && len(k) <= 255 && req.Headers.IdempotencyKey == "" {
		req.Headers.IdempotencyKey = k // as on /rpc
	}
	res, err := s.h.Invoke(ctx, req)
	if err != nil {
		if agent != "" && envelope.CodeOf(err) == envelope.CodeAgentNotFound {
			writeNexus3HTTPError(w, http.StatusNotFound, "Agent not found: "+agent)
			return
		}
		s.reply(w, ctx, "", c.ID, notify, nil, nexus3FromMesh(err))
		return
	}
	result := res.Result
	if in.Method == "create_agent" {
		// NEXUS3 answers where to find the new agent.
		var cr struct {
			AgentID string `json:"agent_id"`
		}
		if err := json.Unmarshal(result, &cr); err != nil || cr.AgentID == "" {
			s.reply(w, ctx, "", c.ID, notify, nil, nexus3Err(envelope.CodeInternal, "create_agent: unexpected answer from chat.create_agent"))
			return
		}
		result, _ = json.Marshal(map[string]string{"agent_id": cr.AgentID, "url": "/agent/" + url.PathEscape(cr.AgentID)})
	}
	s.reply(w, ctx, "", c.ID, notify, result, nil)
}

// reply writes a NEXUS3 JSON-RPC response (HTTP 200), or HTTP 204
// for a notification. An error for an agent's request not run (parse
// error, unknown method) is a 404 when the agent does not exist: NEXUS3
// looks the agent up before it reads the request.
func (s *server) reply(w http.ResponseWriter, ctx context.Context, agent string, id json.RawMessage, notify bool, result json.RawMessage, e *nexus3Error) {
	if e != nil && agent != "" && !s.agentExists(ctx, agent) {
		writeNexus3HTTPError(w, http.StatusNotFound, "Agent not found: "+agent)
		return
	}
	if notify {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	out := struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Result  json.RawMessage `json:"result,omitempty"`
		Error   *nexus3Error    `json:"error,omitempty"`
	}{"2.0", id, result, e}
	if e == nil && len(result) == 0 {
		out.Result = json.RawMessage("null")
	}
	b, err := json.Marshal(out)
	if err != nil {
		writeNexus3HTTPError(w, http.StatusInternalServerError, "cannot encode the response")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// agentExists asks the chat agent whether it knows agent (a
// get_context call through the ingress). Only requests that fail before
// reaching the chat agent pay for it; an unreachable chat agent counts as
// existing, so that the request's own error is answered.
func (s *server) agentExists(ctx context.Context, agent string) bool {
	p, _ := json.Marshal(map[string]string{"agentId": agent})
	_, err := s.h.Invoke(ctx, &envelope.Request{ID: envelope.NewID(), Method: "chat.get_context", Params: p,
		Timestamp: time.Now().UnixMilli(), Version: envelope.Version})
	return envelope.CodeOf(err) != envelope.CodeAgentNotFound
}
