package auth

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
)

// The peer handshake. A hub that dials a peer mints, per dial, a token of
// role "hub" (RolePeer) whose subject is "hub.<its id>", whose
// audience is the id of the hub it means to reach (registry.Instance.Hub),
// whose addr is the address it dials, valid peerTokenTTL. The hub dialled
// accepts it on a native /ws upgrade only, and only if the audience is
// its own id, the address its advertised one, the lifetime at most
// peerTokenMaxTTL, and its id unseen (a replay cache, for the token's
// lifetime). It answers the upgrade with a proof (peerProofHeader): a
// token with issuer ProofIssuer (never a credential), subject
// "hub.<its id>", audience the dialler's id, nonce the id of the dialler's
// token. The dialler checks the proof before it sends any call over the
// link: a listener that does not hold the mesh key cannot make one, and a
// proof made for another dial does not match the nonce. So a forged
// registry record (any hubAddr) gets a token no hub accepts, and no call.
//
// A hub that advertises no address accepts no peer link (no peer is told
// to dial it). The link outlives its token: it lives on its heartbeat,
// and a key rotation closes it when the key that signed the token is
// dropped (Hub.SetAuthKeys).
//
// A principal of role "hub" may then send forwarded calls (Hops > 0) for
// agents' methods over that link, nothing else (authorizePeer); a hub
// token is refused on every other surface.
const (
	// PeerTokenTTL is the lifetime of a peer token (default of Peers.TTL).
	PeerTokenTTL    = 30 * time.Second
	peerTokenMaxTTL = time.Minute
	// PeerProofHeader carries the dialled hub's proof in its answer to
	// the upgrade.
	PeerProofHeader = "Agentmesh-Peer-Proof"
	peerSubject     = "hub." // + the hub's id

	// peerReplayMax bounds the replay cache. A hub re-dials a down peer
	// at most every peerMinBackoff, so a legitimate peer uses at most a
	// few hundred token ids per peerTokenMaxTTL; only tokens signed with
	// the key reach the cache.
	peerReplayMax = 1 << 16
)

// Peers is one hub's side of the peer handshake: it mints the tokens the
// hub dials its peers with, checks the tokens peers dial it with (and
// remembers their ids), and makes and checks the proofs. Safe for
// concurrent use.
type Peers struct {
	self      string    // the hub's id: the audience of the peer tokens it accepts
	advertise string    // the hub's advertised address: the addr of those tokens
	started   time.Time // peer tokens issued before it are refused: the replay cache does not outlive a restart
	verifier  *Verifier
	key       func() *Key // signs the hub's peer tokens (the first of its keys)
	replay    *replayCache
	// TTL is the lifetime of the tokens it mints (PeerTokenTTL; at most
	// a minute). Set it before use.
	TTL time.Duration
}

// NewPeers is the handshake of hub self, advertised at advertise ("":
// it accepts no peer link), started now, verifying with v and signing
// with key().
func NewPeers(self, advertise string, v *Verifier, key func() *Key) *Peers {
	return &Peers{self: self, advertise: advertise, started: time.Now(), verifier: v, key: key, replay: newReplayCache(), TTL: PeerTokenTTL}
}

// Token mints the token this hub dials the hub target at addr with, and
// returns its id (the nonce the proof must carry).
func (g *Peers) Token(target, addr string) (tok, jti string, err error) {
	k := g.key()
	kid := k.ID
	if kid == "" {
		kid = KeyID(k.Secret)
	}
	jti = envelope.NewID()
	tok, err = IssueKID(k.Secret, kid, Claims{
		Subject: peerSubject + g.self, Roles: []string{RolePeer},
		Audience: target, Addr: addr, ID: jti,
	}, g.TTL)
	return tok, jti, err
}

// Check decides whether c, a verified token of role "hub", may open a
// peer link to this hub; it records the token's id (a second use is
// refused). Every refusal is UNAUTHENTICATED but a full replay cache
// (OVERLOADED).
func (g *Peers) Check(c *Claims) *envelope.Error {
	refuse := func(format string, args ...any) *envelope.Error {
		return envelope.Errorf(envelope.CodeUnauthenticated, "peer token refused: "+format, args...)
	}
	switch {
	case !strings.HasPrefix(c.Subject, peerSubject) || len(c.Subject) == len(peerSubject):
		return refuse("its subject must be %s<hub id>", peerSubject)
	case c.Audience == "":
		return refuse("it names no hub (aud): peer tokens are minted by a hub for one dial to one hub")
	case c.Audience != g.self:
		return refuse("it is for hub %q, not this one", c.Audience)
	case g.advertise == "":
		return refuse("this hub advertises no address, so no peer dials it")
	case c.Addr == "":
		return refuse("it names no address (addr): peer tokens are bound to the address dialled")
	case c.Addr != g.advertise:
		return refuse("it was sent to %q, not to this hub's address", c.Addr)
	case c.ID == "":
		return refuse("it has no id (jti)")
	case c.ExpiresAt.Sub(c.IssuedAt) > peerTokenMaxTTL:
		return refuse("its lifetime %v exceeds %v: peer tokens are minted per dial", c.ExpiresAt.Sub(c.IssuedAt), peerTokenMaxTTL)
	case c.IssuedAt.Before(g.started.Add(-g.verifier.Leeway() - time.Second)):
		// Minted before this hub started (iat has one-second precision):
		// the replay cache of its previous life is gone, so a token
		// captured then could otherwise be used once more.
		return refuse("it was issued before this hub started")
	}
	return g.replay.use(c.ID, c.ExpiresAt.Add(g.verifier.Leeway()))
}

// Proof is this hub's answer to the peer token c.
func (g *Peers) Proof(c *Claims) (string, error) {
	k := g.key()
	kid := k.ID
	if kid == "" {
		kid = KeyID(k.Secret)
	}
	return IssueProof(k.Secret, kid, Claims{
		Subject: peerSubject + g.self, Audience: strings.TrimPrefix(c.Subject, peerSubject), Nonce: c.ID,
	}, PeerTokenTTL)
}

// CheckProof checks the proof a peer answered this hub's dial with: signed
// with a key of the mesh, by the hub target, for this hub, for the token
// whose id is nonce. The error is UNAVAILABLE, not sent.
func (g *Peers) CheckProof(resp *http.Response, addr, target, nonce string) error {
	why := ""
	proof := ""
	if resp != nil {
		proof = resp.Header.Get(PeerProofHeader)
	}
	if proof == "" {
		why = "no proof in its answer"
	} else if c, err := g.verifier.VerifyProof(proof); err != nil {
		why = "its proof: " + envelope.AsError(err).Message
	} else {
		switch {
		case c.Subject != peerSubject+target:
			why = "its proof names " + c.Subject
		case c.Audience != g.self:
			why = "its proof is for hub " + c.Audience
		case c.Nonce != nonce:
			why = "its proof answers another dial"
		}
	}
	if why == "" {
		return nil
	}
	return envelope.WrapError(envelope.CodeUnavailable, fmt.Sprintf("the peer at %s did not prove it is hub %s (%s)", addr, target, why), ErrNoProof).MarkNotSent()
}

// ErrNoProof is the cause of CheckProof's errors.
var ErrNoProof = errors.New("auth: the peer did not prove it is the hub named")

// replayCache remembers the ids of the peer tokens accepted, each until
// its token expires.
type replayCache struct {
	mu   sync.Mutex
	seen map[string]time.Time // jti -> expiry
}

func newReplayCache() *replayCache {
	return &replayCache{seen: map[string]time.Time{}}
}

// use records jti until exp, or refuses it if it was seen.
func (r *replayCache) use(jti string, exp time.Time) *envelope.Error {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if t, ok := r.seen[jti]; ok && now.Before(t) {
		return envelope.NewError(envelope.CodeUnauthenticated, "peer token refused: it was used already (peer tokens are for one dial)")
	}
	if len(r.seen) >= peerReplayMax {
		for id, t := range r.seen {
			if !now.Before(t) {
				delete(r.seen, id)
			}
		}
		if len(r.seen) >= peerReplayMax {
			// Forgetting one would let it be replayed: refuse instead,
			// until the oldest expire (at most peerTokenMaxTTL).
			return envelope.Errorf(envelope.CodeOverloaded, "too many peer dials; retry in %d ms", peerTokenMaxTTL.Milliseconds()).
				WithData(map[string]int64{"retryAfterMs": peerTokenMaxTTL.Milliseconds()})
		}
	}
	r.seen[jti] = exp
	return nil
}
