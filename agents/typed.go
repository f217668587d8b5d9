package agents

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"strings"

	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
)

// SetSchema declares the schema of a method this agent serves; it is sent
// with agent.register and shows in the hub's schema, rpc.discover and MCP
// tools/list. Set it before Run.
func (a *Agent) SetSchema(method string, s control.MethodSchema) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.schemas == nil {
		a.schemas = map[string]control.MethodSchema{}
	}
	a.schemas[method] = s
}

// Schemas returns the declared schemas (nil if none).
func (a *Agent) Schemas() map[string]control.MethodSchema {
	a.mu.RLock()
	defer a.mu.RUnlock()
	if len(a.schemas) == 0 && len(a.streaming) == 0 {
		return nil
	}
	out := maps.Clone(a.schemas)
	if out == nil {
		out = map[string]control.MethodSchema{}
	}
	for m := range a.streaming {
		s := out[m]
		s.Streaming = true
		out[m] = s
	}
	return out
}

// TypedOption refines the schema HandleTyped declares.
type TypedOption func(*control.MethodSchema)

// Errors lists the error codes the method may answer with (code names of
// the mesh's table, e.g. "INVALID_PARAMS").
func Errors(codes ...envelope.Code) TypedOption {
	return func(s *control.MethodSchema) {
		for _, c := range codes {
			s.Errors = append(s.Errors, c.String())
		}
	}
}

// Roles lists the roles the agent expects its callers to hold.
func Roles(roles ...string) TypedOption {
	return func(s *control.MethodSchema) { s.Roles = append(s.Roles, roles...) }
}

// Idempotent marks the method as safe to run twice.
func Idempotent() TypedOption { return func(s *control.MethodSchema) { s.Idempotent = true } }

// HandleTyped registers fn for an exact method: params are decoded into P
// with encoding/json (unknown fields ignored)
// (INVALID_PARAMS, naming the fault, when they do not fit; absent params
// give P's zero value) and the result R is encoded with encoding/json.
// The JSON Schemas of P and R are derived from the Go types (with
// github.com/google/jsonschema-go, the MCP SDK's own: fields without
// omitempty are required, a "jsonschema" tag is a property's
// description) and declared with desc at registration. It panics on an
// invalid method name or a type with no JSON Schema (a channel, a func).
func HandleTyped[P, R any](a *Agent, method, desc string, fn func(context.Context, P) (R, error), opts ...TypedOption) {
	if strings.Contains(method, "*") {
		panic("agents: HandleTyped needs an exact method name, not " + method)
	}
	ps, err := control.SchemaFor[P]()
	if err != nil {
		panic(fmt.Sprintf("agents: %s: params: %v", method, err))
	}
	rs, err := control.SchemaFor[R]()
	if err != nil {
		panic(fmt.Sprintf("agents: %s: result: %v", method, err))
	}
	s := control.MethodSchema{Description: desc, Params: ps, Result: rs}
	for _, o := range opts {
		o(&s)
	}
	a.Handle(method, func(ctx context.Context, raw json.RawMessage) (any, error) {
		var p P
		if len(bytes.TrimSpace(raw)) > 0 {
			if err := json.Unmarshal(raw, &p); err != nil {
				return nil, control.ParamsError(method, err)
			}
		}
		return fn(ctx, p)
	})
	a.SetSchema(method, s)
}
