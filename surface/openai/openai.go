// Package openai is the OpenAI surface: the chat-completions API of
// OpenAI, so that any OpenAI client (SDKs, curl, the chat runtime's own
// openai provider) can talk to the mesh's chat agents.
//
//	GET  /v1/models                 the models that can be addressed
//	GET  /v1/models/{model}         one of them
//	POST /v1/chat/completions       stream false: one chat.completion
//	                                stream true:  chat.completion.chunk events (SSE), then [DONE]
//
// Models. "agentmesh-chat" is a conversation of its own per request: the
// surface creates a transient chat agent (chat.create, its system prompt
// the request's system and developer messages, followed by a transcript
// of the earlier turns when the request carries some), sends it the last
// user message (chat.send) and destroys it (chat.destroy). "chat/ID"
// addresses the existing chat agent ID (one per row of chat.list): the
// last user message is sent to it, and its own history and system prompt
// stand for the rest of the request's messages. /v1/models lists
// "agentmesh-chat" and a "chat/ID" per agent; it is empty when no chat
// agent runs.
//
// It is a dialect at the edge, like NEXUS3's and MCP's: every step is a
// call of the chat agent's methods through the hub's ingress, so the
// caller is authenticated (Authorization: Bearer, as on /rpc) and
// authorised per method, and each step is traced (the W3C traceparent of
// the HTTP request) and counted as the native call of that method.
//
// Streaming follows the agent's events (surface.FollowChat, chat.events long
// polls) while chat.send runs: each message_update becomes a delta of its
// text (content) and of its thinking (reasoning_content, as vLLM and
// DeepSeek stream it); a turn that calls tools streams each assistant
// message of the turn, separated by a blank line, whereas the non-streamed
// answer is the turn's last message (what chat.send answers). A client
// that goes away cancels the turn (chat.cancel with the send's request
// id) and the surface waits for the send to end before it returns.
// Chat events carry the request_id of the send whose turn emitted them,
// so a stream to a chat/ID agent that other clients use relays only its
// own turn.
// Usage figures are estimates (about 4 bytes a token, the chat runtime's
// estimate) of the text the request carried and the answer: the provider's
// own counts do not travel through chat.send.
package openai

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/stream"
	"github.com/agentmesh/agentmesh/surface"
	"github.com/agentmesh/agentmesh/telemetry"
)

// Model is the model name of a transient conversation per request.
const Model = "agentmesh-chat"

// openAIAgentPrefix prefixes the model name of an existing chat agent.
const openAIAgentPrefix = "chat/"

// openAIStepTimeout bounds the surface's bookkeeping calls (create,
// destroy, cancel) made outside the caller's context.
const openAIStepTimeout = 5 * time.Second

// openAIEpoch is the created time of the agentmesh-chat model: when the
// process started.
var openAIEpoch = time.Now().Unix()

// openAIKeepAlive is how often a stream with nothing to say sends an SSE
// comment, so that clients with an idle timeout keep waiting.
const openAIKeepAlive = 15 * time.Second

// Mount serves the OpenAI surface on h: GET /v1/models,
// GET /v1/models/{model}, POST /v1/chat/completions, and OpenAI's answer
// to any other path under /v1/.
func Mount(h surface.Host) {
	s := &server{h: h}
	h.Handle("GET /v1/models", http.HandlerFunc(s.serveModels))
	h.Handle("GET /v1/models/{model...}", http.HandlerFunc(s.serveModels))
	h.Handle("POST /v1/chat/completions", http.HandlerFunc(s.serveCompletions))
	h.Handle("/v1/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Any other path or method, as OpenAI answers it.
		e := envelope.Errorf(envelope.CodeInvalidRequest, "Invalid URL (%s %s)", r.Method, r.URL.Path)
		_, oe := openAIErrorOf(e)
		oe.Code = "unknown_url"
		writeOpenAIErrorStatus(w, e, http.StatusNotFound, oe)
	}))
}

// server is the surface mounted on one hub.
type server struct {
	h surface.Host
}

// openAIError is OpenAI's error object.
type openAIError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
}

// openAIErrorOf maps a mesh error to its HTTP status and OpenAI's error
// object: the status of the code table (AGENT_NOT_FOUND and
// METHOD_NOT_FOUND, i.e. no such agent or no chat agent at all, are an
// unknown model), the type OpenAI uses for that status, and the mesh code
// in lower case as code.
func openAIErrorOf(e *envelope.Error) (int, openAIError) {
	status := e.Code.HTTPStatus()
	code := strings.ToLower(e.Code.String())
	typ := "server_error"
	switch e.Code {
	case envelope.CodeAgentNotFound, envelope.CodeMethodNotFound:
		status, typ, code = http.StatusNotFound, "invalid_request_error", "model_not_found"
	case envelope.CodeUnauthenticated:
		typ = "authentication_error"
	case envelope.CodePermissionDenied:
		typ = "permission_error"
	case envelope.CodeOverloaded:
		status, typ = http.StatusTooManyRequests, "rate_limit_error"
	default:
		if status >= 400 && status < 500 {
			typ = "invalid_request_error"
		}
	}
	msg := e.Message
	if msg == "" {
		msg = e.Code.String()
	}
	return status, openAIError{Message: msg, Type: typ, Code: code}
}

// writeOpenAIError answers e as OpenAI does: its status, {"error": {...}},
// Retry-After on 429 and 503 when the mesh said when to come back (at
// least 1 s on a 429), WWW-Authenticate on 401.
func writeOpenAIError(w http.ResponseWriter, e *envelope.Error) {
	status, oe := openAIErrorOf(e)
	writeOpenAIErrorStatus(w, e, status, oe)
}

func writeOpenAIErrorStatus(w http.ResponseWriter, e *envelope.Error, status int, oe openAIError) {
	ra := e.RetryAfter()
	if status == http.StatusTooManyRequests || (status == http.StatusServiceUnavailable && ra > 0) {
		secs := int64((ra + time.Second - 1) / time.Second)
		w.Header().Set("Retry-After", strconv.FormatInt(max(secs, 1), 10))
	}
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="agentmesh"`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := json.Marshal(struct {
		Error openAIError `json:"error"`
	}{oe})
	_, _ = w.Write(b)
}

// auth authenticates a request as the hub's /rpc does (Host.Authenticate,
// the refusal counted), answering a refusal in OpenAI's shape.
func (s *server) auth(w http.ResponseWriter, r *http.Request) (context.Context, bool) {
	who, aerr := s.h.Authenticate(r)
	if aerr != nil {
		if m := s.h.Metrics(); m != nil {
			m.Refused(telemetry.RefusalReason(aerr))
		}
		writeOpenAIError(w, aerr)
		return nil, false
	}
	return s.h.WithCaller(r.Context(), who, ""), true
}

// openAICall is one step of the surface: a call of a chat method through
// the ingress, carrying the HTTP request's W3C trace context.
type openAICall struct {
	h     surface.Host
	trace envelope.Headers
}

func (s *server) newCall(r *http.Request) *openAICall {
	c := &openAICall{h: s.h}
	for _, k := range []string{"traceparent", "tracestate", "baggage"} {
		if v := r.Header.Get(k); v != "" && len(v) <= 512 {
			c.trace.Set(k, v)
		}
	}
	return c
}

func (c *openAICall) call(ctx context.Context, method string, params any, out any) error {
	return c.callStream(ctx, method, params, out, nil)
}

// callStream is call, as a stream when emit is set: emit gets each chunk
// (stream.Relay).
func (c *openAICall) callStream(ctx context.Context, method string, params any, out any, emit func(uint64, json.RawMessage) error) error {
	p, err := json.Marshal(params)
	if err != nil {
		return envelope.WrapError(envelope.CodeInternal, "cannot encode the params", err)
	}
	req := &envelope.Request{ID: envelope.NewID(), Method: method, Params: p, Headers: c.trace,
		Timestamp: time.Now().UnixMilli(), Version: envelope.Version}
	var res *envelope.Response
	if emit != nil {
		res, err = stream.Relay(ctx, c.h.Invoke, req, stream.RelayWindow, emit)
	} else {
		res, err = c.h.Invoke(ctx, req)
	}
	if err != nil {
		return err
	}
	if out != nil {
		if err := json.Unmarshal(res.Result, out); err != nil {
			return envelope.Errorf(envelope.CodeInternal, "%s: unexpected answer: %v", method, err)
		}
	}
	return nil
}

type openAIModel struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
}

// listModels lists the models (chat.list through the ingress): none
// when no chat agent runs.
func listModels(ctx context.Context, c *openAICall) ([]openAIModel, error) {
	var list struct {
		Agents []struct {
			AgentID   string `json:"agent_id"`
			CreatedAt string `json:"created_at"`
		} `json:"agents"`
	}
	if err := c.call(ctx, "chat.list", struct{}{}, &list); err != nil {
		if envelope.CodeOf(err) == envelope.CodeMethodNotFound {
			return []openAIModel{}, nil
		}
		return nil, err
	}
	out := []openAIModel{{ID: Model, Object: "model", Created: openAIEpoch, OwnedBy: "agentmesh"}}
	for _, a := range list.Agents {
		created := openAIEpoch
		if t, err := time.Parse(time.RFC3339Nano, a.CreatedAt); err == nil {
			created = t.Unix()
		}
		out = append(out, openAIModel{ID: openAIAgentPrefix + a.AgentID, Object: "model", Created: created, OwnedBy: "agentmesh"})
	}
	return out, nil
}

// serveModels is GET /v1/models and GET /v1/models/{model}.
func (s *server) serveModels(w http.ResponseWriter, r *http.Request) {
	ctx, ok := s.auth(w, r)
	if !ok {
		return
	}
	models, err := listModels(ctx, s.newCall(r))
	if err != nil {
		writeOpenAIError(w, envelope.AsError(err))
		return
	}
	var out any = struct {
		Object string        `json:"object"`
		Data   []openAIModel `json:"data"`
	}{"list", models}
	if want := r.PathValue("model"); want != "" {
		out = nil
		for _, m := range models {
			if m.ID == want {
				out = m
			}
		}
		if out == nil {
			writeOpenAIError(w, envelope.Errorf(envelope.CodeAgentNotFound, "The model '%s' does not exist", want))
			return
		}
	}
	b, _ := json.Marshal(out)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}
