// Package peering keeps a hub's links to the other hubs of its cluster:
// one per peer, dialled on first use, re-dialled while the registry still
// lists instances behind it, and authenticated both ways when the hub
// authenticates (auth.Peers).
package peering

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/link"
)

// Config is what a Pool needs of its hub.
type Config struct {
	Link link.Config // peer links: short heartbeat (the hub's PeerHeartbeat)
	Log  *slog.Logger
	// Auth, when the hub authenticates, mints each dial's peer token and
	// checks the peer's proof.
	Auth *auth.Peers
	// Track and Untrack register a peer link with the hub (its drain and
	// shutdown close it); Track false: the hub is shutting down.
	Track   func(*link.Link) bool
	Untrack func(*link.Link)
	// Wanted reports whether the registry still lists an instance on the
	// hub hub at addr.
	Wanted func(hub, addr string) bool
}

// Pool keeps one link to each other hub. A link is dialled on first use,
// in the background (a caller waits for it at most until its own
// deadline); when it closes, calls in flight on it fail with UNAVAILABLE.
//
// A peer whose link was lost, or whose last dial failed, is "down": the
// router avoids its instances while others serve the method, and calls
// that still go to it fail at once with UNAVAILABLE (not sent). While it
// is down and the registry still lists instances at its address, a
// background loop re-dials it, spaced by a capped backoff; the first
// successful dial brings it back. So a partitioned peer costs its callers
// nothing but a fast failure (S05), and a healed one is used again within
// peerMaxBackoff plus a dial.
//
// A peer is a hub id at an address, as the registry names them: with
// authentication on, the dial is bound to both, and the link is used only
// once the hub there proved it is that hub (peerauth.go). Another id at
// the same address (a stale or forged record) is another peer, down on
// its own.
type Pool struct {
	mu     sync.Mutex
	hubs   map[peerKey]*peerState
	closed bool // set by shutdown: start no more goroutines
	cfg    Config
	ctx    context.Context // ends at hub shutdown; bounds background dials
	wg     sync.WaitGroup  // dials and re-dial loops
}

// peerKey names a peer: a hub id and the address it is dialled at.
type peerKey struct{ hub, addr string }

type peerState struct {
	hub       string
	addr      string
	link      *link.Link
	dialing   chan struct{} // non-nil while a dial runs; closed when it ends
	down      bool          // the link was lost or the last dial failed
	err       error         // why it is down
	next      time.Time     // no dial before this (backoff while down)
	backoff   time.Duration
	redialing bool // a re-dial loop runs
}

const (
	peerMinBackoff = 100 * time.Millisecond
	peerMaxBackoff = time.Second
)

// New returns an empty pool; ctx bounds its background dials (the hub's
// life).
func New(ctx context.Context, cfg Config) *Pool {
	return &Pool{hubs: map[peerKey]*peerState{}, cfg: cfg, ctx: ctx}
}

// Shutdown waits for the background dials once the hub's context ended;
// none starts afterwards.
func (p *Pool) Shutdown() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.wg.Wait()
}

// Link returns a live link to the hub hub at addr. If none is open it
// starts a dial (unless one runs or the backoff forbids it); a down peer
// fails at once, otherwise the caller waits for the dial within ctx.
func (p *Pool) Link(ctx context.Context, hub, addr string) (*link.Link, error) {
	k := peerKey{hub, addr}
	for {
		p.mu.Lock()
		st := p.hubs[k]
		if st == nil {
			st = &peerState{hub: hub, addr: addr}
			p.hubs[k] = st
		}
		if st.link != nil {
			err := st.link.Err()
			if err == nil && !goneAway(st.link) {
				p.mu.Unlock()
				return st.link, nil
			}
			// Closed, and its close hook has not run yet: the peer is
			// down from now, not after a dial that may hang.
			st.link = nil
			p.markDownLocked(st, err)
		}
		if p.closed {
			p.mu.Unlock()
			return nil, link.UnavailableNotSent("hub is shutting down")
		}
		if st.dialing == nil && !time.Now().Before(st.next) {
			p.startDialLocked(st)
		}
		if st.down {
			err := st.err
			p.mu.Unlock()
			msg := "peer hub " + hub + " at " + addr + " is unreachable"
			if errors.Is(err, auth.ErrNoProof) {
				msg += ": " + envelope.AsError(err).Message // the dialler's doing: no internal detail
			}
			return nil, envelope.WrapError(envelope.CodeUnavailable, msg, err).MarkNotSent()
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

func (p *Pool) startDialLocked(st *peerState) {
	st.dialing = make(chan struct{})
	p.wg.Add(1)
	go p.dial(st, st.dialing)
}

// dial runs one dial in the background, bounded by 1.5 peer heartbeats (a
// handshake that hangs is a dead peer too; a heartbeat is meant to be many
// round trips) and by the hub's life.
func (p *Pool) dial(st *peerState, done chan struct{}) {
	defer p.wg.Done()
	defer close(done)
	started := time.Now()
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.Link.PingInterval*3/2)
	defer cancel()
	// Peers authenticate both ways (peerauth.go): this hub sends a token
	// it mints for this dial, bound to the hub and address it dials, and
	// uses the link only once the answer proves the hub there holds the
	// key too. They speak TLS when the hub has a peer TLS config.
	var tok string
	var check func(*http.Response) error
	if a := p.cfg.Auth; a != nil {
		var jti string
		var err error
		if tok, jti, err = a.Token(st.hub, st.addr); err != nil {
			p.cfg.Log.Error("cannot sign the peer token", "error", err)
			p.mu.Lock()
			st.dialing = nil
			p.markDownLocked(st, envelope.WrapError(envelope.CodeInternal, "cannot sign the peer token", err).MarkNotSent())
			p.mu.Unlock()
			return
		}
		check = func(resp *http.Response) error { return a.CheckProof(resp, st.addr, st.hub, jti) }
	}
	scheme := "ws://"
	if p.cfg.Link.TLS != nil {
		scheme = "wss://"
	}
	l, err := link.DialCheck(ctx, scheme+st.addr+"/ws", tok, check, p.cfg.Link, link.WithLogger(p.cfg.Log), link.WithHubPeer(), link.WithOnClose(func(l *link.Link, err error) {
		p.cfg.Untrack(l)
		p.mu.Lock()
		if st.link == l {
			st.link = nil
			p.markDownLocked(st, err)
		}
		p.mu.Unlock()
		if p.ctx.Err() == nil {
			p.cfg.Log.Warn("peer link lost", "peer", st.hub, "addr", st.addr, "error", err)
		}
	}))
	p.mu.Lock()
	defer p.mu.Unlock()
	st.dialing = nil
	if err != nil {
		if e := envelope.AsError(err); st.err == nil || st.err.Error() != e.Error() {
			p.cfg.Log.Warn("peer dial failed", "peer", st.hub, "addr", st.addr, "error", e.Message)
		}
		p.markDownLocked(st, err)
		// The backoff counts from the dial's start: a dial that hung until
		// its timeout has waited long enough.
		st.next = started.Add(st.backoff)
		return
	}
	if !p.cfg.Track(l) {
		go l.Close() // the hub is shutting down
		p.markDownLocked(st, link.UnavailableNotSent("hub is shutting down"))
		return
	}
	if st.down {
		p.cfg.Log.Info("peer link back", "peer", st.hub, "addr", st.addr)
	}
	st.link, st.down, st.err, st.backoff, st.next = l, false, nil, 0, time.Time{}
	p.wg.Add(1)
	go p.follow(st, l)
}

// markDownLocked records a lost link or failed dial, and starts the
// re-dial loop if none runs.
func (p *Pool) markDownLocked(st *peerState, err error) {
	st.down, st.err = true, err
	st.backoff = min(max(2*st.backoff, peerMinBackoff), peerMaxBackoff)
	st.next = time.Now().Add(st.backoff)
	if !st.redialing && !p.closed && p.ctx.Err() == nil {
		st.redialing = true
		p.wg.Add(1)
		go p.redial(st)
	}
}

// redial dials a down peer after each backoff until it is back, the
// registry lists no instance at its address any more, or the hub stops.
func (p *Pool) redial(st *peerState) {
	defer p.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		p.mu.Lock()
		wait := time.Until(st.next)
		p.mu.Unlock()
		t.Reset(max(wait, time.Millisecond))
		select {
		case <-t.C:
		case <-p.ctx.Done():
			p.mu.Lock()
			st.redialing = false
			p.mu.Unlock()
			return
		}
		wanted := p.wanted(st.hub, st.addr)
		p.mu.Lock()
		if !st.down || !wanted || p.closed {
			st.redialing = false
			if k := (peerKey{st.hub, st.addr}); !wanted && st.down && st.link == nil && st.dialing == nil && p.hubs[k] == st {
				// No instance left behind it (a hub restarted under a new
				// id, or gone): forgotten, so that the map does not keep
				// every peer that ever was.
				delete(p.hubs, k)
			}
			p.mu.Unlock()
			return
		}
		if st.dialing == nil && !time.Now().Before(st.next) {
			p.startDialLocked(st)
		}
		done := st.dialing
		p.mu.Unlock()
		if done != nil {
			select {
			case <-done:
			case <-p.ctx.Done():
			}
		}
	}
}

// wanted reports whether some instance in the registry is attached to the
// hub hub at addr.
func (p *Pool) wanted(hub, addr string) bool { return p.cfg.Wanted(hub, addr) }

// IsDown reports whether the peer hub at addr is known to be unreachable
// (its link was lost, its last dial failed or it did not prove it is
// hub, and no dial has succeeded since).
func (p *Pool) IsDown(hub, addr string) bool {
	if addr == "" {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.hubs[peerKey{hub, addr}]
	return st != nil && st.down
}

// Links returns the open peer links this hub dialled (for /metrics:
// agentmesh_links{kind="peer"}; a peer's links to this hub count as
// "client" on this side).
func (p *Pool) Links() map[*link.Link]bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[*link.Link]bool{}
	for _, st := range p.hubs {
		if st.link != nil && st.link.Err() == nil {
			out[st.link] = true
		}
	}
	return out
}

// Status lists the peers this hub dialled: each hub, its address, and
// whether its link is up (or why not).
func (p *Pool) Status() []PeerStatus {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]PeerStatus, 0, len(p.hubs))
	for _, st := range p.hubs {
		ps := PeerStatus{Hub: st.hub, Addr: st.addr, Up: !st.down && st.link != nil && st.link.Err() == nil}
		if !ps.Up {
			ps.Err = st.err
		}
		out = append(out, ps)
	}
	return out
}

// PeerStatus is a peer as Status reports it.
type PeerStatus struct {
	Hub, Addr string
	Up        bool
	Err       error // why it is down, if known
}

// follow retires a peer link whose hub sent goaway: new forwards dial
// afresh (a draining hub refuses the dial, so the peer is down and the
// router tries another instance), and the link closes once its calls are
// answered.
func (p *Pool) follow(st *peerState, l *link.Link) {
	defer p.wg.Done()
	select {
	case <-l.Done():
		return
	case <-p.ctx.Done():
		return
	case <-l.GoAway():
	}
	p.mu.Lock()
	if st.link == l {
		st.link = nil
	}
	p.mu.Unlock()
	link.Drain(p.ctx, l, l.Pending)
}

func goneAway(l *link.Link) bool {
	select {
	case <-l.GoAway():
		return true
	default:
		return false
	}
}
