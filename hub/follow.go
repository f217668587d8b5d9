package hub

import (
	"time"

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
//
// Between snapshots it renews the registrations of the agents attached
// here, once per heartbeat interval (renew).
func (h *Hub) follow(watch <-chan *registry.Snapshot) {
	defer close(h.done)
	var seen uint64
	var renewals <-chan time.Time
	if h.linkLiveness() {
		t := time.NewTicker(h.cfg.HeartbeatInterval)
		defer t.Stop()
		renewals = t.C
	}
	for {
		var snap *registry.Snapshot
		select {
		case s, ok := <-watch:
			if !ok {
				return
			}
			snap = s
		case <-renewals:
			h.renew()
			continue
		}
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

// renew beats, in the registry, every agent attached here over a link
// that is open and not stalled: what the agents' agent.heartbeat calls
// did, one call per agent per interval over the network, done here in
// one pass. A link that dies is closed by its idle timeout, which
// deregisters its agent; a stalled one is not renewed, so its agent
// expires no later than it did when it heartbeat itself.
//
// The beat goes straight to the instance the registry returned at
// registration (the one it expires): an atomic store, no lookup. One that
// left the registry since is beaten in vain; follow closes its link.
func (h *Hub) renew() {
	now := time.Now()
	h.bindings.Range(func(_, v any) bool {
		b := v.(*binding)
		if in := b.inst.Load(); in != nil && b.ready.Load() && b.link.Err() == nil && !b.link.Stalled() {
			in.Beat(registry.Beat{Load: -1}, now)
		}
		return true
	})
}
