package hub

import (
	"context"
	"encoding/json"
	"slices"
	"strings"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub/guard"
	"github.com/agentmesh/agentmesh/hub/listing"
	"github.com/agentmesh/agentmesh/internal/openrpc"
	"github.com/agentmesh/agentmesh/link"
)

// Schema returns the mesh's contract as it stands now: the built-ins and
// every method an agent serves (the first instance, by id, that declared
// a schema for it wins).
func (h *Hub) Schema() control.SchemaPayload {
	out := control.SchemaPayload{ProtocolVersion: envelope.Version, Methods: map[string]control.SchemaMethod{}, Events: slices.Clone(listing.ChatStreamEvents), Errors: envelope.CodeTable()}
	for m := range h.builtins {
		s := listing.BuiltinSchemas[m]
		out.Methods[m] = control.SchemaMethod{Description: s.Description, Builtin: true, Params: s.Params, Response: s.Result,
			Errors: s.Errors, Roles: h.rolesOf(m, nil), Idempotent: s.Idempotent}
	}
	for _, in := range h.reg.Snapshot().Instances() {
		var decl map[string]control.MethodSchema
		if len(in.Schemas) > 0 {
			_ = json.Unmarshal(in.Schemas, &decl)
		}
		add := func(m string, s control.MethodSchema, declared bool) {
			cur, seen := out.Methods[m]
			if seen && (cur.Builtin || cur.Params != nil || cur.Response != nil || !declared) {
				if !slices.Contains(cur.Agents, in.Name) {
					cur.Agents = append(cur.Agents, in.Name)
					out.Methods[m] = cur
				}
				return
			}
			errs := slices.Clone(s.Errors)
			for _, e := range listing.AgentErrors {
				if !slices.Contains(errs, e) {
					errs = append(errs, e)
				}
			}
			ms := control.SchemaMethod{Description: s.Description, Params: s.Params, Response: s.Result, Errors: errs,
				Roles: h.rolesOf(m, s.Roles), Idempotent: s.Idempotent || h.policies.For(m).Idempotent, Streaming: s.Streaming,
				Pattern: strings.HasSuffix(m, "*"), Agents: []string{in.Name}}
			if seen {
				ms.Agents = append(cur.Agents, in.Name)
				slices.Sort(ms.Agents)
				ms.Agents = slices.Compact(ms.Agents)
			}
			out.Methods[m] = ms
		}
		for m, s := range decl {
			add(m, s, true)
		}
		for _, c := range in.Capabilities {
			if _, ok := decl[c]; !ok {
				add(c, control.MethodSchema{}, false)
			}
		}
	}
	return out
}

// rolesOf returns the roles a call to m needs: the hub's when it
// authenticates, else those declared.
func (h *Hub) rolesOf(m string, declared []string) []string {
	if !h.guard.On() {
		return declared
	}
	if guard.AdminMethods[m] {
		return []string{auth.RoleAdmin}
	}
	if r, ok := h.guard.Roles.Lookup(m); ok {
		return r
	}
	return nil
}

func (h *Hub) meshSchema(ctx context.Context, _ *link.Link, raw json.RawMessage) (any, error) {
	if err := control.DecodeParams("schema", raw, &struct{}{}); err != nil {
		return nil, err
	}
	return h.Schema(), nil
}

func (h *Hub) rpcDiscover(ctx context.Context, _ *link.Link, raw json.RawMessage) (any, error) {
	if err := control.DecodeParams("rpc.discover", raw, &struct{}{}); err != nil {
		return nil, err
	}
	return openrpc.FromSchema(h.Schema()), nil
}

// Streaming reports whether an agent declared method a streaming one (its
// schema's "streaming"): surfaces without a stream call of their own
// (JSON-RPC, agentick, Multica) call it as a stream. The snapshot counts
// the declarations as instances come and go (Snapshot.Streaming).
func (h *Hub) Streaming(method string) bool { return h.reg.Snapshot().Streaming(method) }
