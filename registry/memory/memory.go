// Package memory is the embedded, in-process registry backend: the default
// for a single hub, with nothing to install.
package memory

import (
	"context"
	"sync"
	"time"

	"github.com/agentmesh/agentmesh/registry"
)

// Registry keeps instances in memory. It starts one goroutine that expires
// instances; Close stops it. Safe for concurrent use.
type Registry struct {
	*registry.Publisher // snapshots and watchers

	mu     sync.Mutex
	insts  map[string]*registry.Instance
	expiry registry.Expiry // under mu
	closed bool

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
		Publisher: registry.NewPublisher(),
		insts:     map[string]*registry.Instance{},
		check:     250 * time.Millisecond,
		stop:      make(chan struct{}),
		done:      make(chan struct{}),
	}
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
	r.expiry.Add(in)
	r.Apply([]*registry.Instance{in}, nil)
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
			r.Apply([]*registry.Instance{in}, nil) // re-indexed: ready or not
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
	delete(r.insts, id)
	r.Apply(nil, []*registry.Instance{in})
	return nil
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
			gone := r.expiry.Due(now, func(in *registry.Instance) bool { return r.insts[in.InstanceID] == in })
			for _, in := range gone {
				delete(r.insts, in.InstanceID)
			}
			if len(gone) > 0 {
				r.Apply(nil, gone) // one batch, one snapshot
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
	r.mu.Unlock()
	<-r.done
	r.Publisher.Close()
	return nil
}
