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
// (unreachable, lost with the call in flight, or stalled when the call
// ran out of time), not of the instance.
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
	if err == nil {
		return res, false, nil
	}
	// A call that ran out of time on a peer link that has read nothing,
	// not even a pong, for longer than a ping interval failed with the
	// link (a TCP stream held up by retransmissions, a path cut), not
	// with the agent: counted against its breaker, such a stall of a
	// few seconds opened the breaker of every agent behind the peer for
	// the whole recovery timeout (the lab's S07b under 5 % loss).
	lost := l.Err() != nil || envelope.AsError(err).Code == envelope.CodeTimeout && l.Stalled()
	return res, lost, err
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
