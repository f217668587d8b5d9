package hub

import (
	"context"
	"encoding/json"
	"maps"

	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/hub/listing"
	"github.com/agentmesh/agentmesh/internal/openrpc"
	"github.com/agentmesh/agentmesh/link"
)

// Schema returns the mesh's contract as it stands now: the built-ins and
// every method an agent serves (listing.Schema).
func (h *Hub) Schema() control.SchemaPayload {
	return listing.Schema(maps.Keys(h.builtins), h.reg.Snapshot().Instances(), h.guard.RolesOf,
		func(m string) bool { return h.policies.For(m).Idempotent })
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
