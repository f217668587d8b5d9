// Package cow is a copy-on-write map for hot-path lookups: reads load an
// immutable map through an atomic pointer (no lock, no allocation);
// writes, which are rare, copy it under a mutex.
package cow

import (
	"sync"
	"sync/atomic"
)

// Map is safe for concurrent use; the zero value is empty and ready.
type Map[K comparable, V any] struct {
	m  atomic.Pointer[map[K]V]
	mu sync.Mutex
}

// Load returns the value of k.
func (c *Map[K, V]) Load(k K) (V, bool) {
	if p := c.m.Load(); p != nil {
		v, ok := (*p)[k]
		return v, ok
	}
	var zero V
	return zero, false
}

// LoadOrCreate returns the value of k, storing create() first if there is
// none.
func (c *Map[K, V]) LoadOrCreate(k K, create func() V) V {
	if v, ok := c.Load(k); ok {
		return v
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.snapshot()
	if v, ok := old[k]; ok {
		return v
	}
	v := create()
	m := make(map[K]V, len(old)+1)
	for kk, vv := range old {
		m[kk] = vv
	}
	m[k] = v
	c.m.Store(&m)
	return v
}

// DeleteFunc removes the entries for which del returns true.
func (c *Map[K, V]) DeleteFunc(del func(K, V) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.snapshot()
	m := make(map[K]V, len(old))
	for k, v := range old {
		if !del(k, v) {
			m[k] = v
		}
	}
	c.m.Store(&m)
}

// Range calls f for every entry of the current map.
func (c *Map[K, V]) Range(f func(K, V)) {
	for k, v := range c.snapshot() {
		f(k, v)
	}
}

// Len returns the number of entries.
func (c *Map[K, V]) Len() int { return len(c.snapshot()) }

func (c *Map[K, V]) snapshot() map[K]V {
	if p := c.m.Load(); p != nil {
		return *p
	}
	return nil
}
