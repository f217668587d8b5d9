package mesh

import (
	"context"
	"sync"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/registry"
)

// peers keeps one link to each other hub, dialled on first use and
// dropped when it closes (the next call dials again).
type peers struct {
	mu    sync.Mutex
	links map[string]*Link // by hub address
	cfg   ConnConfig
	h     *Hub
}

// link returns a live link to the hub at addr, dialling if needed within ctx.
func (p *peers) link(ctx context.Context, addr string) (*Link, error) {
	p.mu.Lock()
	l := p.links[addr]
	p.mu.Unlock()
	if l != nil && l.Err() == nil && !goneAway(l) {
		return l, nil
	}
	nl, err := DialLink(ctx, "ws://"+addr+"/ws", p.cfg, WithLinkLogger(p.h.log), WithLinkOnClose(func(l *Link, _ error) {
		p.h.untrack(l)
		p.mu.Lock()
		if p.links[addr] == l {
			delete(p.links, addr)
		}
		p.mu.Unlock()
	}))
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if cur := p.links[addr]; cur != nil && cur.Err() == nil && !goneAway(cur) {
		go nl.Close() // another call dialled first
		return cur, nil
	}
	p.links[addr] = nl
	if !p.h.track(nl) {
		go nl.Close()
		return nil, unavailableNotSent("hub is shutting down")
	}
	go p.follow(addr, nl)
	return nl, nil
}

// follow retires a peer link whose hub sent goaway: new forwards dial
// afresh (and a draining hub refuses the dial, so the router tries
// another instance), and the link closes once its calls are answered.
func (p *peers) follow(addr string, l *Link) {
	select {
	case <-l.Done():
		return
	case <-l.GoAway():
	}
	p.mu.Lock()
	if p.links[addr] == l {
		delete(p.links, addr)
	}
	p.mu.Unlock()
	drainLink(context.Background(), l, l.Pending)
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

func goneAway(l *Link) bool {
	select {
	case <-l.GoAway():
		return true
	default:
		return false
	}
}
