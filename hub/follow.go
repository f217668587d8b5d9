package hub

import (
	"github.com/agentmesh/agentmesh/registry"
)

// follow watches the registry: an instance attached here that left the
// registry (expired, or deregistered by another path) loses its link, so
// that the calls pending on it fail at once with UNAVAILABLE. It reads
// the departures each snapshot logs (Snapshot.Removed), not the whole
// registry, and closes a link only for the very instance registered over
// it: an agent that registered again since (a new instance) keeps its
// new link, and one whose registration completes meanwhile is never taken
// for gone (the race of comparing the bindings with a snapshot taken
// before they were made).
func (h *Hub) follow(watch <-chan *registry.Snapshot) {
	defer close(h.done)
	var seen uint64
	for snap := range watch {
		gone, upTo, complete := snap.Removed(seen)
		seen = upTo
		if !complete { // too far behind the log: compare with the whole snapshot
			h.bindings.Range(func(_, v any) bool {
				if in := v.(*binding).inst.Load(); in != nil && snap.Instance(in.InstanceID) != in {
					gone = append(gone, in)
				}
				return true
			})
		}
		for _, in := range gone {
			v, ok := h.bindings.Load(in.InstanceID)
			if !ok || v.(*binding).inst.Load() != in {
				continue
			}
			b := v.(*binding)
			h.log.Info("instance left the registry; closing its link", "agent", b.id)
			h.metrics().Expired()
			h.bindings.CompareAndDelete(b.id, b)
			h.breakers.Forget(b.id)
			go b.link.Close()
		}
	}
}

// linkLiveness reports whether an agent's link is its heartbeat here
// (control.LivenessLink): the links the hub serves ping at least once a
// heartbeat interval and are closed after at most three intervals of
// silence, so a link that stops answering is closed (and its agent
// deregistered) within the time three missed heartbeats took.
func (h *Hub) linkLiveness() bool {
	c := h.cfg.Conn.WithDefaults()
	return c.PingInterval <= h.cfg.HeartbeatInterval && c.IdleTimeout <= 3*h.cfg.HeartbeatInterval
}
