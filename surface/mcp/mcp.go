package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"sort"
	"time"

	mcpauth "github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/surface"
)

// The MCP surface (Streamable HTTP at /mcp, with the official MCP Go
// SDK): tools/list lists the methods agents serve now as tools, with the
// schemas they declared; tools/call runs one through the hub's ingress,
// as a native call (authorisation, policies, tracing, metrics). It is
// stateless: no MCP session lives in the hub, so any hub of a cluster
// answers any request and nothing is left to close on shutdown.

type mcpPrincipalKey struct{}

// mcpHandler returns the handler of /mcp.
// Mount serves the MCP surface on h at /mcp: MCP's streamable HTTP
// transport (stateless), whose tools are the methods agents serve now
// that the caller may call.
func Mount(h surface.Host) {
	h.Handle("/mcp", handler(h))
}

func handler(h surface.Host) http.Handler {
	srv := mcp.NewServer(&mcp.Implementation{Name: "agentmesh", Version: envelope.Version}, &mcp.ServerOptions{
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}},
	})
	srv.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			switch r := req.(type) {
			case *mcp.ListToolsRequest:
				return tools(h, mcpPrincipal(r.Extra)), nil
			case *mcp.CallToolRequest:
				return call(ctx, h, mcpPrincipal(r.Extra), r.Params, r.Extra)
			}
			return next(ctx, method, req)
		}
	})
	var sh http.Handler = mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{
		Stateless:           true,
		MaxRequestBodyBytes: int64(h.ConnConfig().Limits.MaxBytes),
	})
	if h.AuthOn() {
		// The SDK hands a request's token info to the handlers; the
		// principal rides in it (authenticated below, before the SDK).
		sh = mcpauth.RequireBearerToken(func(_ context.Context, _ string, r *http.Request) (*mcpauth.TokenInfo, error) {
			p, _ := r.Context().Value(mcpPrincipalKey{}).(*auth.Principal)
			if p == nil || p.Claims == nil {
				return nil, mcpauth.ErrInvalidToken
			}
			return &mcpauth.TokenInfo{UserID: p.Subject, Expiration: p.ExpiresAt, Extra: map[string]any{"principal": p}}, nil
		}, &mcpauth.RequireBearerTokenOptions{AllowMissingExpiration: true})(sh)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !h.CheckOrigin(r) {
			// The MCP transport's rule against DNS rebinding: a browser
			// from an origin not allowed learns nothing.
			if m := h.Metrics(); m != nil {
				m.Refused("origin")
			}
			http.Error(w, "origin not allowed", http.StatusForbidden)
			return
		}
		if h.Draining() {
			http.Error(w, "hub is draining", http.StatusServiceUnavailable)
			return
		}
		who, aerr := h.Authenticate(r)
		if aerr != nil {
			h.Refuse(w, aerr)
			return
		}
		if who != nil {
			r = r.WithContext(context.WithValue(r.Context(), mcpPrincipalKey{}, who))
		}
		sh.ServeHTTP(w, r)
	})
}

func mcpPrincipal(x *mcp.RequestExtra) *auth.Principal {
	if x == nil || x.TokenInfo == nil {
		return nil
	}
	p, _ := x.TokenInfo.Extra["principal"].(*auth.Principal)
	return p
}

// tools lists the methods agents serve now that p may call.
func tools(h surface.Host, p *auth.Principal) *mcp.ListToolsResult {
	out := &mcp.ListToolsResult{Tools: []*mcp.Tool{}}
	for name, m := range h.Schema().Methods {
		if m.Builtin || m.Pattern || m.Streaming || !surface.ToolName(name) || !h.MayCall(p, name) { // a tool answers once: no streams
			continue
		}
		in := surface.ObjectSchema(m.Params)
		if in == nil {
			// No object schema declared: any arguments, passed as the
			// method's params.
			in = json.RawMessage(`{"type":"object"}`)
		}
		t := &mcp.Tool{Name: name, Description: m.Description, InputSchema: in,
			Annotations: &mcp.ToolAnnotations{IdempotentHint: m.Idempotent}}
		if o := surface.ObjectSchema(m.Response); o != nil {
			t.OutputSchema = o
		}
		out.Tools = append(out.Tools, t)
	}
	sort.Slice(out.Tools, func(i, j int) bool { return out.Tools[i].Name < out.Tools[j].Name })
	return out
}

// call runs a tool as a call through the hub's ingress. As the MCP
// specification (2025-06-18) separates them: a tool no agent serves (or
// a built-in, which is not a tool) is a protocol error, JSON-RPC -32602
// "Unknown tool: NAME"; a call that fails is a tool result with isError
// set, its text "CODE: message", and the coded error {code, jsonrpcCode,
// message, data} in _meta "agentmesh/error", and as structuredContent
// too when the tool declares no outputSchema (a client validates the
// structured content of a tool that declares one against it, error
// results included, and this error is not of that shape).
//
// The W3C trace context comes from the request's _meta (traceparent,
// tracestate: the MCP convention) or else from its HTTP headers.
func call(ctx context.Context, h surface.Host, p *auth.Principal, params *mcp.CallToolParamsRaw, x *mcp.RequestExtra) (*mcp.CallToolResult, error) {
	if params == nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "tools/call needs params"}
	}
	if h.IsBuiltin(params.Name) {
		return nil, unknownTool(params.Name)
	}
	args := bytes.TrimSpace(params.Arguments)
	if string(args) == "null" {
		args = nil
	}
	req := &envelope.Request{ID: envelope.NewID(), Method: params.Name, Params: json.RawMessage(args),
		Timestamp: time.Now().UnixMilli(), Version: envelope.Version}
	for _, k := range []string{"traceparent", "tracestate"} {
		v, _ := params.Meta[k].(string)
		if v == "" && x != nil && x.Header != nil {
			v = x.Header.Get(k)
		}
		if v != "" && len(v) <= 512 {
			req.Headers.Set(k, v)
		}
	}
	if p != nil {
		ctx = h.WithCaller(ctx, p, "")
	}
	res, err := h.Invoke(ctx, req)
	if err != nil {
		e := envelope.AsError(err)
		if e.Code == envelope.CodeMethodNotFound && !h.KnownMethod(params.Name) {
			return nil, unknownTool(params.Name) // not an agent's own METHOD_NOT_FOUND
		}
		return toolError(e, declaresOutput(h, params.Name)), nil
	}
	out := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(res.Result)}}}
	if r := bytes.TrimSpace(res.Result); len(r) > 0 && r[0] == '{' {
		out.StructuredContent = json.RawMessage(r)
	}
	return out, nil
}

// declaresOutput reports whether the tool name has an outputSchema: an
// object result schema declared by the first agent serving it that
// declares schemas (as tools/list finds it), without building the whole
// schema of the mesh on a failed call.
func declaresOutput(h surface.Host, name string) bool {
	for _, in := range h.Registry().Snapshot().Lookup(name) {
		if len(in.Schemas) == 0 {
			continue
		}
		var decl map[string]struct {
			Result json.RawMessage `json:"result"`
		}
		return json.Unmarshal(in.Schemas, &decl) == nil && surface.ObjectSchema(decl[name].Result) != nil
	}
	return false
}

// unknownTool is the protocol error of the MCP specification's example.
func unknownTool(name string) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "Unknown tool: " + name}
}

// toolError is a failed call's tool result; outputSchema: the tool
// declares one, which its structured content must match.
func toolError(e *envelope.Error, outputSchema bool) *mcp.CallToolResult {
	coded := map[string]any{"code": e.Code.String(), "jsonrpcCode": e.Code.JSONRPC(), "message": e.Message}
	if e.Data != nil {
		coded["data"] = e.Data
	}
	r := &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: e.Code.String() + ": " + e.Message}},
		Meta: mcp.Meta{"agentmesh/error": coded}}
	if !outputSchema {
		r.StructuredContent = coded
	}
	return r
}
