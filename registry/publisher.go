package registry

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Publisher is the part every backend shares: it turns the backend's set
// of instances into immutable snapshots (remembering recently served
// capabilities), stores the current one for lock-free reads, and hands
// each new one to the watchers without ever blocking on them. The zero
// value is not ready: use NewPublisher. Safe for concurrent use.
type Publisher struct {
	snap     atomic.Pointer[Snapshot]
	mu       sync.Mutex
	rev      uint64
	recent   map[string]time.Time // capability -> when its last instance left
	watchers map[chan *Snapshot]struct{}
	closed   bool
	stop     chan struct{}
	wg       sync.WaitGroup // one goroutine per watcher
}

// NewPublisher returns a publisher holding the empty snapshot.
func NewPublisher() *Publisher {
	p := &Publisher{recent: map[string]time.Time{}, watchers: map[chan *Snapshot]struct{}{}, stop: make(chan struct{})}
	p.snap.Store(Empty())
	return p
}

// Snapshot returns the current snapshot. It takes no lock.
func (p *Publisher) Snapshot() *Snapshot { return p.snap.Load() }

// Left records that in left the registry (its capabilities stay known for
// RecentTTL).
func (p *Publisher) Left(in *Instance, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range in.Capabilities {
		p.recent[c] = now
	}
}

// Publish builds a snapshot of insts and hands it to every watcher,
// replacing an unread older one, so that no send blocks.
func (p *Publisher) Publish(insts map[string]*Instance) {
	now := time.Now()
	list := make([]*Instance, 0, len(insts))
	for _, in := range insts {
		list = append(list, in)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var recent []string
	for c, t := range p.recent {
		if now.Sub(t) > RecentTTL {
			delete(p.recent, c)
			continue
		}
		recent = append(recent, c)
	}
	p.rev++
	snap := NewSnapshot(p.rev, list, recent)
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
