// Package idempotency remembers the outcome of calls that carry an
// idempotency key (draft-ietf-httpapi-idempotency-key), so that a replay
// is answered from memory instead of run again.
package idempotency

import (
	"container/list"
	"context"
	"crypto/sha256"
	"sync"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
)

// Cache remembers the outcome of calls that carry an idempotency
// key, so that a replay (a client's retry after a lost answer, or an
// attacker's capture) is answered from memory and the agent does not run
// it again (S28 c). A key is scoped to its caller (the token's subject)
// and bound to the call's method and params: the same key with another
// call is INVALID_PARAMS (S28 d). Outcomes are kept for the window; the
// cache holds at most max keys, dropping the oldest.
//
// Only calls that provably did not run (not sent) are forgotten, so their
// key may be used again; an indeterminate outcome (TIMEOUT, UNAVAILABLE
// after send) is kept, since running the call again could run it twice.
// The cache is per hub: a replay through another hub of a cluster is not
// caught.
type Cache struct {
	window time.Duration
	max    int

	// Now is the cache's clock (time.Now); a test may set it before use.
	Now   func() time.Time
	mu    sync.Mutex
	keys  map[string]*idemEntry
	order list.List // of *idemEntry, oldest first
}

type idemEntry struct {
	key  string
	fp   [sha256.Size]byte
	at   time.Time
	done chan struct{}
	res  *envelope.Response
	err  error
	elem *list.Element
}

// New returns a cache keeping outcomes for window, at most max keys.
func New(window time.Duration, max int) *Cache {
	return &Cache{window: window, max: max, Now: time.Now, keys: map[string]*idemEntry{}}
}

func fingerprint(req *envelope.Request) [sha256.Size]byte {
	h := sha256.New()
	h.Write([]byte(req.Method))
	h.Write([]byte{0})
	h.Write([]byte(req.Destination))
	h.Write([]byte{0})
	h.Write(req.Params)
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

// Do runs call once per (caller, key) and answers every replay with its
// outcome.
func (c *Cache) Do(ctx context.Context, caller string, req *envelope.Request, call func() (*envelope.Response, error)) (*envelope.Response, error) {
	key := caller + "\x00" + req.Headers.IdempotencyKey
	fp := fingerprint(req)
	now := c.Now()
	c.mu.Lock()
	c.expireLocked(now)
	if e := c.keys[key]; e != nil {
		c.mu.Unlock()
		if e.fp != fp {
			return nil, envelope.NewError(envelope.CodeInvalidParams, "idempotency key already used for a different call").MarkNotSent()
		}
		select {
		case <-e.done:
		case <-ctx.Done():
			return nil, envelope.AsError(context.Cause(ctx)).MarkNotSent()
		}
		if e.err != nil {
			return nil, e.err
		}
		res := *e.res
		res.ID = req.ID
		return &res, nil
	}
	e := &idemEntry{key: key, fp: fp, at: now, done: make(chan struct{})}
	e.elem = c.order.PushBack(e)
	c.keys[key] = e
	for len(c.keys) > c.max {
		c.dropLocked(c.order.Front().Value.(*idemEntry))
	}
	c.mu.Unlock()

	res, err := call()
	e.res, e.err = res, err
	if err != nil && envelope.AsError(err).NotSent() {
		c.mu.Lock()
		if c.keys[key] == e {
			c.dropLocked(e)
		}
		c.mu.Unlock()
	}
	close(e.done)
	return res, err
}

func (c *Cache) expireLocked(now time.Time) {
	for f := c.order.Front(); f != nil; f = c.order.Front() {
		e := f.Value.(*idemEntry)
		if now.Sub(e.at) < c.window {
			return
		}
		c.dropLocked(e)
	}
}

func (c *Cache) dropLocked(e *idemEntry) {
	c.order.Remove(e.elem)
	delete(c.keys, e.key)
}

// Len is the number of keys remembered.
func (c *Cache) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.keys)
}
