package mesh

import (
	"context"
	"sync"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/registry"
)

// peers keeps one link to each other hub. A link is dialled on first use,
// in the background (a caller waits for it at most until its own
// deadline); when it closes, calls in flight on it fail with UNAVAILABLE
// and the next call dials again.
//
// A peer whose link was lost, or whose last dial failed, is "down": calls
// for it fail at once with UNAVAILABLE (not sent) while a background dial,
// at most one at a time and spaced by a capped backoff, tries to reach it
// again; the first successful dial brings it back. So a partitioned peer
// costs its callers nothing but a fast failure (S05), and a healed one is
// used again within a dial (plus at most peerMaxBackoff).
type peers struct {
	mu   sync.Mutex
	hubs map[string]*peerState // by hub address
	cfg  ConnConfig            // peer links: short heartbeat (HubConfig.PeerHeartbeat)
	h    *Hub
	ctx  context.Context // ends at hub shutdown; bounds background dials
	wg   sync.WaitGroup  // background dials
}

type peerState struct {
	link    *Link
	dialing chan struct{} // non-nil while a dial runs; closed when it ends
	down    bool          // the link was lost or the last dial failed
	err     error         // why it is down
	next    time.Time     // no dial before this (backoff while down)
	backoff time.Duration
}

const (
	peerMinBackoff = 100 * time.Millisecond
	peerMaxBackoff = time.Second
)

func newPeers(h *Hub, ctx context.Context, cfg ConnConfig) peers {
	return peers{hubs: map[string]*peerState{}, cfg: cfg, h: h, ctx: ctx}
}

// link returns a live link to the hub at addr. If none is open it starts a
// dial (unless one runs or the backoff forbids it); a down peer fails at
// once, otherwise the caller waits for the dial within ctx.
func (p *peers) link(ctx context.Context, addr string) (*Link, error) {
	for {
		p.mu.Lock()
		st := p.hubs[addr]
		if st == nil {
			st = &peerState{}
			p.hubs[addr] = st
		}
		if st.link != nil && st.link.Err() == nil {
			p.mu.Unlock()
			return st.link, nil
		}
		if st.dialing == nil && !time.Now().Before(st.next) {
			st.dialing = make(chan struct{})
			p.wg.Add(1)
			go p.dial(addr, st, st.dialing)
		}
		if st.down {
			err := st.err
			p.mu.Unlock()
			return nil, envelope.WrapError(envelope.CodeUnavailable, "peer hub "+addr+" is unreachable", err).MarkNotSent()
		}
		wait := st.dialing
		p.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return nil, envelope.AsError(ctx.Err()).MarkNotSent()
		}
	}
}

// dial runs one dial to addr in the background, bounded by the peer idle
// timeout (a handshake that hangs is a dead peer too) and by the hub's life.
func (p *peers) dial(addr string, st *peerState, done chan struct{}) {
	defer p.wg.Done()
	defer close(done)
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.IdleTimeout)
	defer cancel()
	l, err := DialLink(ctx, "ws://"+addr+"/ws", p.cfg, WithLinkLogger(p.h.log), WithLinkOnClose(func(l *Link, err error) {
		p.h.untrack(l)
		p.mu.Lock()
		if st.link == l {
			st.link = nil
			p.markDownLocked(st, err)
		}
		p.mu.Unlock()
		if p.ctx.Err() == nil {
			p.h.log.Warn("peer link lost", "peer", addr, "error", err)
		}
	}))
	p.mu.Lock()
	defer p.mu.Unlock()
	st.dialing = nil
	if err != nil {
		p.markDownLocked(st, err)
		return
	}
	if !p.h.track(l) {
		go l.Close() // the hub is shutting down
		p.markDownLocked(st, unavailableNotSent("hub is shutting down"))
		return
	}
	if st.down {
		p.h.log.Info("peer link back", "peer", addr)
	}
	st.link, st.down, st.err, st.backoff, st.next = l, false, nil, 0, time.Time{}
}

func (p *peers) markDownLocked(st *peerState, err error) {
	st.down, st.err = true, err
	st.backoff = min(max(2*st.backoff, peerMinBackoff), peerMaxBackoff)
	st.next = time.Now().Add(st.backoff)
}

// links returns the open peer links this hub dialled (for /metrics:
// agentmesh_links{kind="peer"}; a peer's links to this hub count as
// "client" on this side).
func (p *peers) links() map[*Link]bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[*Link]bool{}
	for _, st := range p.hubs {
		if st.link != nil && st.link.Err() == nil {
			out[st.link] = true
		}
	}
	return out
}

// forward sends a call for an instance attached to another hub over the
// peer link to that hub, which serves it locally (Hops stops it from
// forwarding again).
func (h *Hub) forward(ctx context.Context, req *envelope.Request, in *registry.Instance) (*envelope.Response, error) {
	if req.Headers.Hops > 0 {
		return nil, unavailableNotSent("agent " + in.InstanceID + " is not attached to this hub, and the request already crossed a peer link")
	}
	if in.HubAddr == "" {
		return nil, unavailableNotSent("agent " + in.InstanceID + " is on hub " + in.Hub + ", whose address is unknown")
	}
	l, err := h.peers.link(ctx, in.HubAddr)
	if err != nil {
		return nil, envelope.AsError(err) // a failed dial is not sent
	}
	r := *req
	r.Destination = in.InstanceID
	r.Headers.Hops++
	return l.Call(ctx, &r)
}
