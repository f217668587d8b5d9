package chat

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/telemetry"
)

// ToolSpec describes a tool to the provider: Parameters is a JSON schema
// of its arguments object.
type ToolSpec struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
}

// ToolCall is what a tool's Run receives besides its arguments.
type ToolCall struct {
	AgentID string // the chat agent whose turn called the tool
	ID      string // the toolCall block's id
}

// ToolFunc runs a tool. Its text is the tool's result; an error becomes a
// result with isError true and the error's text.
type ToolFunc func(ctx context.Context, call ToolCall, args json.RawMessage) (string, error)

// Tool is a tool an agent may call.
type Tool struct {
	Spec ToolSpec
	Run  ToolFunc
}

// Tools is a registry of tools, safe for concurrent use.
type Tools struct {
	mu sync.RWMutex
	m  map[string]Tool
}

// NewTools returns a registry holding tools.
func NewTools(tools ...Tool) *Tools {
	r := &Tools{m: map[string]Tool{}}
	for _, t := range tools {
		r.Register(t)
	}
	return r
}

// Register adds or replaces a tool.
func (r *Tools) Register(t Tool) {
	if t.Spec.Name == "" || t.Run == nil {
		panic("chat: a tool needs a name and a Run function")
	}
	if len(t.Spec.Parameters) == 0 {
		t.Spec.Parameters = json.RawMessage(`{"type":"object","properties":{}}`)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m[t.Spec.Name] = t
}

// Get returns the tool called name.
func (r *Tools) Get(name string) (Tool, bool) {
	if r == nil {
		return Tool{}, false
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	t, ok := r.m[name]
	return t, ok
}

// Specs lists the tools' specs, sorted by name.
func (r *Tools) Specs() []ToolSpec {
	if r == nil {
		return nil
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]ToolSpec, 0, len(r.m))
	for _, t := range r.m {
		out = append(out, t.Spec)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Caller calls a method on the mesh; *mesh.Client is one.
type Caller interface {
	Call(ctx context.Context, method string, params, result any, opts ...mesh.CallOption) error
}

// MeshCallToolName is the name of the built-in tool that calls the mesh.
const MeshCallToolName = "mesh_call"

// MeshCallTool returns the tool mesh_call {method, params?, agent?}: it
// calls method through the mesh (on the agent instance agent, if given)
// and returns the result JSON, so that an agent can ask other agents,
// chat agents included (chat.send to another agentId: subagents). It
// refuses to call chat.send on the calling agent itself, whose turn is
// the one running (it would wait for itself). Each call is bounded by
// timeout (default 30 s).
//
// The call continues the trace of ctx (the tool's execute_tool span, in a
// turn): a client instrumented with telemetry starts its own spans under
// it; for one that is not, the request carries ctx's trace context
// itself, so that the routed call is the tool span's child either way.
func MeshCallTool(c Caller, timeout time.Duration) Tool {
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	return Tool{
		Spec: ToolSpec{
			Name:        MeshCallToolName,
			Description: "Call a method on the agent mesh and return its JSON result. Use it to ask other agents (e.g. chat.send with another agentId).",
			Parameters: json.RawMessage(`{"type":"object","properties":{` +
				`"method":{"type":"string","description":"the method, e.g. echo.echo or chat.send"},` +
				`"params":{"type":"object","description":"the method's parameters"},` +
				`"agent":{"type":"string","description":"optional: the agent instance id to call"}},` +
				`"required":["method"]}`),
		},
		Run: func(ctx context.Context, call ToolCall, args json.RawMessage) (string, error) {
			var in struct {
				Method string          `json:"method"`
				Params json.RawMessage `json:"params"`
				Agent  string          `json:"agent"`
			}
			if err := json.Unmarshal(args, &in); err != nil {
				return "", fmt.Errorf("mesh_call: bad arguments: %v", err)
			}
			if in.Method == "" {
				return "", errors.New("mesh_call: method is required")
			}
			if strings.HasPrefix(in.Method, "chat.send") {
				var p idParams
				_ = json.Unmarshal(in.Params, &p)
				if p.agentID() == call.AgentID {
					return "", errors.New("mesh_call: an agent cannot send to itself during its own turn")
				}
			}
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			var opts []mesh.CallOption
			if in.Agent != "" {
				opts = append(opts, mesh.To(in.Agent))
			}
			if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
				// An instrumented client's attempt span overwrites these
				// headers with its own (its child).
				opts = append(opts, mesh.WithHeaders(func(h *envelope.Headers) {
					telemetry.Propagator.Inject(ctx, h)
					h.TraceID = sc.TraceID().String()
				}))
			}
			var params any
			if len(in.Params) > 0 {
				params = in.Params
			}
			var out json.RawMessage
			if err := c.Call(ctx, in.Method, params, &out, opts...); err != nil {
				return "", err
			}
			return string(out), nil
		},
	}
}
