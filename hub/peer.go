package hub

import (
	"context"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/registry"
)

// forward sends a call for an instance attached to another hub over the
// peer link to that hub, which serves it locally (Hops stops it from
// forwarding again). peerLost reports a failure of the peer link itself
// (unreachable, or lost with the call in flight), not of the instance.
func (h *Hub) forward(ctx context.Context, req *envelope.Request, in *registry.Instance) (res *envelope.Response, peerLost bool, err error) {
	if req.Headers.Hops > 0 {
		return nil, false, link.UnavailableNotSent("agent " + in.InstanceID + " is not attached to this hub, and the request already crossed a peer link")
	}
	if in.HubAddr == "" {
		return nil, false, link.UnavailableNotSent("agent " + in.InstanceID + " is on hub " + in.Hub + ", whose address is unknown")
	}
	if in.Hub == "" && h.guard.On() {
		// The peer token is bound to the hub's id: no id, no dial.
		return nil, false, link.UnavailableNotSent("agent " + in.InstanceID + " is on a hub at " + in.HubAddr + " whose id is unknown")
	}
	l, err := h.peers.Link(ctx, in.Hub, in.HubAddr)
	if err != nil {
		return nil, true, envelope.AsError(err) // a failed dial is not sent
	}
	r := *req
	r.Destination = in.InstanceID
	r.Headers.Hops++
	res, err = l.Call(ctx, &r)
	return res, err != nil && l.Err() != nil, err
}

// wantedPeer reports whether some instance in the registry is attached to
// the hub hub at addr (peering.Config.Wanted).
func (h *Hub) wantedPeer(hub, addr string) bool {
	for _, in := range h.reg.Snapshot().Instances() {
		if in.Hub == hub && in.HubAddr == addr {
			return true
		}
	}
	return false
}
