package registry

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Publisher is the part every backend shares: it derives each new
// immutable snapshot from the last by the changes (Apply) or by the
// difference with the backend's whole set (Publish), remembers recently
// served capabilities, stores the current snapshot for lock-free reads,
// and hands each new one to the watchers without ever blocking on them.
// The zero value is not ready: use NewPublisher. Safe for concurrent use.
type Publisher struct {
	snap     atomic.Pointer[Snapshot]
	mu       sync.Mutex
	rev      uint64
	seq      uint64             // departures numbered so far (Snapshot.Removed)
	ready    map[*Instance]bool // the instances indexed, and whether as ready
	recent   []recentCap        // capabilities whose last instance left, oldest first
	watchers map[chan *Snapshot]struct{}
	closed   bool
	stop     chan struct{}
	wg       sync.WaitGroup // one goroutine per watcher
}

// recentCap is a capability left by its last instance at at.
type recentCap struct {
	c  string
	at time.Time
}

// NewPublisher returns a publisher holding the empty snapshot.
func NewPublisher() *Publisher {
	p := &Publisher{ready: map[*Instance]bool{}, watchers: map[chan *Snapshot]struct{}{}, stop: make(chan struct{})}
	p.snap.Store(Empty())
	return p
}

// Snapshot returns the current snapshot. It takes no lock.
func (p *Publisher) Snapshot() *Snapshot { return p.snap.Load() }

// Apply publishes the snapshot with puts added (or, for an instance
// already there, re-indexed: its state changed; another instance of the
// same id is replaced) and gone removed (when they are still the
// instances of their ids): one batch, one snapshot. Its cost is that of
// the instances changed, not of the registry.
func (p *Publisher) Apply(puts, gone []*Instance) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cur := p.snap.Load()
	b := newBuilder(cur, time.Now())
	for _, in := range gone {
		if cur.Instance(in.InstanceID) == in {
			b.drop(in, true)
			delete(p.ready, in)
		}
	}
	for _, in := range puts {
		if old := cur.Instance(in.InstanceID); old != nil && old != in {
			delete(p.ready, old)
		}
		b.put(in)
		p.ready[in] = in.State() == StateReady
	}
	p.commitLocked(b)
}

// Publish publishes the snapshot of insts, the backend's whole set: it
// applies the difference with the current one (what left, what came,
// what changed state) as one batch.
func (p *Publisher) Publish(insts map[string]*Instance) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cur := p.snap.Load()
	b := newBuilder(cur, time.Now())
	for _, in := range cur.Instances() {
		if insts[in.InstanceID] != in {
			if insts[in.InstanceID] == nil {
				b.drop(in, true)
			}
			delete(p.ready, in)
		}
	}
	for _, in := range insts {
		ready, indexed := p.ready[in]
		if !indexed || ready != (in.State() == StateReady) {
			b.put(in)
			p.ready[in] = in.State() == StateReady
		}
	}
	p.commitLocked(b)
}

// commitLocked commits b (p.mu held), expiring the capabilities left
// longer than RecentTTL ago, stores the snapshot and hands it to every
// watcher, replacing an unread older one, so that no send blocks.
func (p *Publisher) commitLocked(b *builder) {
	for len(p.recent) > 0 && b.now.Sub(p.recent[0].at) > RecentTTL {
		r := p.recent[0]
		p.recent = p.recent[1:]
		if e, ok := b.caps.Get([]byte(r.c)); ok && e.count == 0 && e.left.Equal(r.at) {
			b.entry(r.c) // touched: commit's expire takes it out
		}
	}
	for c, e := range b.touched {
		if e.count == 0 && e.left.Equal(b.now) {
			p.recent = append(p.recent, recentCap{c, b.now})
		}
	}
	p.rev++
	snap, seq := b.commit(p.rev, func(_ string, e *capEntry) bool { return b.now.Sub(e.left) > RecentTTL }, p.seq)
	p.seq = seq
	p.snap.Store(snap)
	for ch := range p.watchers {
		select {
		case <-ch:
		default:
		}
		ch <- snap
	}
}

// Watch implements Registry.Watch.
func (p *Publisher) Watch(ctx context.Context) (<-chan *Snapshot, error) {
	ch := make(chan *Snapshot, 1)
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	ch <- p.snap.Load()
	p.watchers[ch] = struct{}{}
	p.wg.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		select {
		case <-ctx.Done():
		case <-p.stop:
		}
		p.mu.Lock()
		if _, ok := p.watchers[ch]; ok {
			delete(p.watchers, ch)
			close(ch)
		}
		p.mu.Unlock()
	}()
	return ch, nil
}

// Close closes every watch channel and waits for the watchers'
// goroutines. Idempotent.
func (p *Publisher) Close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.stop)
	}
	p.mu.Unlock()
	p.wg.Wait()
}
