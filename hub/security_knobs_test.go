package hub

import "time"

// Knobs for the mesh_test package: the hub's bounds against slow and
// greedy clients, shortened so a test can cross them quickly.

// WithReadTimeouts sets the hub's http.Server ReadHeaderTimeout and
// ReadTimeout (defaults 5 s and 30 s).
func WithReadTimeouts(header, whole time.Duration) Option {
	return func(h *Hub) { h.readHeaderTimeout, h.readTimeout = header, whole }
}

// WithMaxPending sets how many calls one connection may have in flight
// (default 10,000): a native link's WithMaxServing, a plain JSON-RPC
// WebSocket's bound.
func WithMaxPending(n int) Option { return func(h *Hub) { h.maxPending = n } }

// WithPeerTokenTTL sets the lifetime of the peer tokens the hub mints per
// dial (default 30 s; at least 1 s), so that a test can outlive one.
func WithPeerTokenTTL(d time.Duration) Option {
	return func(h *Hub) {
		if h.guard.On() {
			h.guard.Peers.TTL = d
		}
	}
}
