package hub

import "time"

// WithIdempotencyClock sets the clock of the hub's idempotency window, so
// that a test can replay a key minutes later without waiting for them.
func WithIdempotencyClock(now func() time.Time) Option {
	return func(h *Hub) { h.idem.Now = now }
}
