// Package memory is the embedded, in-process registry backend: the default
// for a single hub, with nothing to install.
package memory

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentmesh/agentmesh/registry"
)

// Registry keeps instances in memory. It starts one goroutine that expires
// instances; Close stops it. Safe for concurrent use.
type Registry struct {
	mu       sync.Mutex
	rev      uint64
	insts    map[string]*registry.Instance
	recent   map[string]time.Time // capability -> when its last instance left
	snap     atomic.Pointer[registry.Snapshot]
	wg       sync.WaitGroup // watch goroutines
	watchers map[chan *registry.Snapshot]struct{}
	closed   bool

	check time.Duration
	stop  chan struct{}
	done  chan struct{}
}

var _ registry.Registry = (*Registry)(nil)

// Option configures a Registry.
type Option func(*Registry)

// WithExpiryCheck sets how often expiry is checked (default 250 ms).
func WithExpiryCheck(d time.Duration) Option { return func(r *Registry) { r.check = d } }

// New returns a running memory registry.
func New(opts ...Option) *Registry {
	r := &Registry{
		insts:    map[string]*registry.Instance{},
		recent:   map[string]time.Time{},
		watchers: map[chan *registry.Snapshot]struct{}{},
		check:    250 * time.Millisecond,
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	r.snap.Store(registry.Empty())
	for _, o := range opts {
		o(r)
	}
	go r.reap()
	return r
}

// Register implements registry.Registry.
func (r *Registry) Register(ctx context.Context, reg registry.Registration) (*registry.Instance, error) {
	if err := reg.Validate(); err != nil {
		return nil, err
	}
	in := registry.NewInstance(reg, time.Now())
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, registry.ErrClosed
	}
	r.insts[reg.InstanceID] = in
	r.publishLocked()
	return in, nil
}

// Heartbeat implements registry.Registry.
func (r *Registry) Heartbeat(ctx context.Context, id string, b registry.Beat) error {
	in := r.Snapshot().Instance(id)
	if in == nil {
		return registry.ErrNotFound
	}
	if in.Beat(b, time.Now()) {
		r.mu.Lock()
		if r.insts[id] == in {
			r.publishLocked()
		}
		r.mu.Unlock()
	}
	return nil
}

// Deregister implements registry.Registry.
func (r *Registry) Deregister(ctx context.Context, id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	in, ok := r.insts[id]
	if !ok {
		return registry.ErrNotFound
	}
	r.removeLocked(in, time.Now())
	r.publishLocked()
	return nil
}

func (r *Registry) removeLocked(in *registry.Instance, now time.Time) {
	delete(r.insts, in.InstanceID)
	for _, c := range in.Capabilities {
		r.recent[c] = now
	}
}

// Snapshot implements registry.Registry. It takes no lock.
func (r *Registry) Snapshot() *registry.Snapshot { return r.snap.Load() }

// Watch implements registry.Registry.
func (r *Registry) Watch(ctx context.Context) (<-chan *registry.Snapshot, error) {
	ch := make(chan *registry.Snapshot, 1)
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, registry.ErrClosed
	}
	ch <- r.snap.Load()
	r.watchers[ch] = struct{}{}
	r.wg.Add(1)
	r.mu.Unlock()
	go func() {
		defer r.wg.Done()
		select {
		case <-ctx.Done():
		case <-r.stop:
		}
		r.mu.Lock()
		if _, ok := r.watchers[ch]; ok {
			delete(r.watchers, ch)
			close(ch)
		}
		r.mu.Unlock()
	}()
	return ch, nil
}

// publishLocked rebuilds the snapshot and hands it to every watcher,
// replacing an unread older one so that no send blocks.
func (r *Registry) publishLocked() {
	now := time.Now()
	r.rev++
	insts := make([]*registry.Instance, 0, len(r.insts))
	for _, in := range r.insts {
		insts = append(insts, in)
	}
	var recent []string
	for c, t := range r.recent {
		if now.Sub(t) > registry.RecentTTL {
			delete(r.recent, c)
			continue
		}
		recent = append(recent, c)
	}
	snap := registry.NewSnapshot(r.rev, insts, recent)
	r.snap.Store(snap)
	for ch := range r.watchers {
		select {
		case <-ch:
		default:
		}
		ch <- snap
	}
}

func (r *Registry) reap() {
	defer close(r.done)
	t := time.NewTicker(r.check)
	defer t.Stop()
	for {
		select {
		case <-r.stop:
			return
		case now := <-t.C:
			r.mu.Lock()
			changed := false
			for _, in := range r.insts {
				if in.Expired(now) {
					r.removeLocked(in, now)
					changed = true
				}
			}
			if changed {
				r.publishLocked()
			}
			r.mu.Unlock()
		}
	}
}

// Close implements registry.Registry: it stops the expiry goroutine and
// closes every watch channel. It is idempotent.
func (r *Registry) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		<-r.done
		return nil
	}
	r.closed = true
	close(r.stop)
	for ch := range r.watchers {
		delete(r.watchers, ch)
		close(ch)
	}
	r.mu.Unlock()
	<-r.done
	r.wg.Wait()
	return nil
}
