package auth

// Principal is who is calling, as their token says. The hub makes one
// when it authenticates a connection or a request; surfaces pass it back
// to the hub with the calls they make for that caller.
type Principal struct {
	*Claims
	token string // checked again when the hub's keys change
	peer  bool   // a peer link's: its hub token passed the peer checks on a native /ws upgrade
}

// NewPrincipal is the principal of claims c, authenticated with token
// (kept to check it again when the keys change); peerLink marks another
// hub of the mesh on the peer link it opened (see Peer).
func NewPrincipal(c *Claims, token string, peerLink bool) *Principal {
	return &Principal{Claims: c, token: token, peer: peerLink}
}

// Peer reports whether the principal is another hub of the mesh on the
// peer link it opened to this hub: a token of role "hub" bound to this
// hub, accepted on a native /ws upgrade. A hub token anywhere else
// authenticates nobody.
func (p *Principal) Peer() bool {
	return p != nil && p.Claims != nil && p.peer
}

// Token returns the token the principal authenticated with ("" if none
// was kept).
func (p *Principal) Token() string {
	if p == nil {
		return ""
	}
	return p.token
}

// HasRole reports whether the principal's claims grant role r.
func (p *Principal) HasRole(r string) bool {
	if p == nil || p.Claims == nil {
		return false
	}
	for _, x := range p.Roles {
		if x == r {
			return true
		}
	}
	return false
}
