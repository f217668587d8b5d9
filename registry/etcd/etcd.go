// Package etcd is the registry backend for clusters of hubs: each hub
// writes the agents attached to it under leases whose TTL is three
// heartbeat intervals, kept alive by the agents' heartbeats; every hub
// lists and watches the prefix and keeps a local snapshot, so that a
// lookup never waits on etcd. When etcd is unreachable the hub keeps
// routing with what it knows; the watch re-lists when it comes back.
package etcd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/agentmesh/agentmesh/registry"
)

// Config says where etcd is.
type Config struct {
	Endpoints   []string
	Prefix      string        // default "/agentmesh/"
	DialTimeout time.Duration // default 5 s
	// OpTimeout bounds each etcd call made for a registration or heartbeat
	// (default 3 s).
	OpTimeout time.Duration
}

// Registry is a registry.Registry over etcd. Safe for concurrent use.
type Registry struct {
	cli    *clientv3.Client
	prefix string
	opTO   time.Duration
	log    *slog.Logger

	*registry.Publisher // snapshots and watchers
	synced              atomic.Bool

	mu     sync.Mutex
	insts  map[string]*registry.Instance
	leases map[string]clientv3.LeaseID // instances registered through this registry
	modRev map[string]int64            // latest etcd revision applied per instance: older events are stale
	closed bool

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	watchMu     sync.Mutex
	watchCancel context.CancelFunc // ends the current watch, so that follow lists again
	lost        atomic.Bool        // the probe could not reach etcd
}

var _ registry.Registry = (*Registry)(nil)

// record is what is stored under a key.
type record struct {
	registry.Registration
	HeartbeatMs  int64     `json:"heartbeatMs"`
	State        string    `json:"state"`
	Load         float64   `json:"load"`
	RegisteredAt time.Time `json:"registeredAt"`
}

// New connects (in the background) and starts following the prefix. It
// starts one goroutine; Close stops it.
func New(cfg Config, log *slog.Logger) (*Registry, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, errors.New("etcd registry: no endpoints")
	}
	if cfg.Prefix == "" {
		cfg.Prefix = "/agentmesh/"
	}
	if !strings.HasSuffix(cfg.Prefix, "/") {
		cfg.Prefix += "/"
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 5 * time.Second
	}
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = 3 * time.Second
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: cfg.DialTimeout, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcd registry: %w", err)
	}
	r := &Registry{
		cli: cli, prefix: cfg.Prefix + "instances/", opTO: cfg.OpTimeout, log: log,
		Publisher: registry.NewPublisher(),
		insts:     map[string]*registry.Instance{}, leases: map[string]clientv3.LeaseID{}, modRev: map[string]int64{},
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.wg.Go(r.follow)
	r.wg.Go(r.probe)
	return r, nil
}

// Synced reports whether the local view has caught up with etcd (for
// /readyz).
func (r *Registry) Synced() bool { return r.synced.Load() }

func (r *Registry) key(id string) string { return r.prefix + id }

func ttlSeconds(interval time.Duration) int64 {
	return max(int64(math.Ceil((3 * interval).Seconds())), 1)
}

// Register implements registry.Registry: the instance is written under a
// new lease and shows in this hub's snapshot at once.
func (r *Registry) Register(ctx context.Context, reg registry.Registration) (*registry.Instance, error) {
	if err := reg.Validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, r.opTO)
	defer cancel()
	lease, err := r.cli.Grant(ctx, ttlSeconds(reg.HeartbeatInterval))
	if err != nil {
		return nil, fmt.Errorf("etcd registry: grant: %w", err)
	}
	now := time.Now()
	in := registry.NewInstance(reg, now)
	val, _ := json.Marshal(record{Registration: reg, HeartbeatMs: reg.HeartbeatInterval.Milliseconds(), State: registry.StateReady, RegisteredAt: now})
	put, err := r.cli.Put(ctx, r.key(reg.InstanceID), string(val), clientv3.WithLease(lease.ID))
	if err != nil {
		_, _ = r.cli.Revoke(context.WithoutCancel(ctx), lease.ID)
		return nil, fmt.Errorf("etcd registry: put: %w", err)
	}
	r.mu.Lock()
	r.modRev[reg.InstanceID] = max(r.modRev[reg.InstanceID], put.Header.Revision)
	defer r.mu.Unlock()
	if r.closed {
		return nil, registry.ErrClosed
	}
	if old, ok := r.leases[reg.InstanceID]; ok && old != lease.ID {
		go r.revoke(old)
	}
	r.leases[reg.InstanceID] = lease.ID
	r.insts[reg.InstanceID] = in
	r.publishLocked()
	return in, nil
}

func (r *Registry) revoke(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), r.opTO)
	defer cancel()
	_, _ = r.cli.Revoke(ctx, id)
}

// Heartbeat implements registry.Registry: it keeps the instance's lease
// alive and writes its state when it changed.
func (r *Registry) Heartbeat(ctx context.Context, id string, b registry.Beat) error {
	r.mu.Lock()
	lease, ok := r.leases[id]
	in := r.insts[id]
	r.mu.Unlock()
	if !ok || in == nil {
		return registry.ErrNotFound
	}
	ctx, cancel := context.WithTimeout(ctx, r.opTO)
	defer cancel()
	if _, err := r.cli.KeepAliveOnce(ctx, lease); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			r.mu.Lock()
			delete(r.leases, id)
			r.mu.Unlock()
			return registry.ErrNotFound
		}
		return fmt.Errorf("etcd registry: keepalive: %w", err)
	}
	if in.Beat(b, time.Now()) {
		val, _ := json.Marshal(record{Registration: in.Registration, HeartbeatMs: in.HeartbeatInterval.Milliseconds(),
			State: in.State(), Load: in.Load(), RegisteredAt: in.RegisteredAt})
		if _, err := r.cli.Put(ctx, r.key(id), string(val), clientv3.WithLease(lease)); err != nil {
			return fmt.Errorf("etcd registry: put: %w", err)
		}
		r.mu.Lock()
		r.publishLocked()
		r.mu.Unlock()
	}
	return nil
}

// Deregister implements registry.Registry.
func (r *Registry) Deregister(ctx context.Context, id string) error {
	r.mu.Lock()
	lease, ok := r.leases[id]
	if ok {
		delete(r.leases, id)
		if in := r.insts[id]; in != nil {
			r.removeLocked(in, time.Now())
			r.publishLocked()
		}
	}
	r.mu.Unlock()
	if !ok {
		return registry.ErrNotFound
	}
	ctx, cancel := context.WithTimeout(ctx, r.opTO)
	defer cancel()
	res, err := r.cli.Revoke(ctx, lease)
	if err != nil {
		return fmt.Errorf("etcd registry: revoke: %w", err)
	}
	r.mu.Lock()
	r.modRev[id] = max(r.modRev[id], res.Header.Revision)
	r.mu.Unlock()
	return nil
}

func (r *Registry) removeLocked(in *registry.Instance, now time.Time) {
	delete(r.insts, in.InstanceID)
	r.Left(in, now)
}

func (r *Registry) publishLocked() { r.Publish(r.insts) }

// follow lists the prefix, then watches it from the next revision; on a
// watch error or compaction it lists again. It never blocks a watcher.
func (r *Registry) follow() {
	backoff := 100 * time.Millisecond
	for r.ctx.Err() == nil {
		rev, err := r.list()
		if err != nil {
			r.synced.Store(false)
			r.log.Warn("etcd registry: list failed; routing with what is known", "error", err)
			if !sleep(r.ctx, backoff) {
				return
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		r.synced.Store(true)
		wctx, wcancel := context.WithCancel(r.ctx)
		r.watchMu.Lock()
		r.watchCancel = wcancel
		r.watchMu.Unlock()
		wch := r.cli.Watch(clientv3.WithRequireLeader(wctx), r.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		for wr := range wch {
			if err := wr.Err(); err != nil {
				r.log.Warn("etcd registry: watch ended; listing again", "error", err)
				break
			}
			r.apply(wr.Events)
		}
		wcancel()
		r.synced.Store(false)
	}
}

// probe asks etcd for a key every second. A watch on a connection to an
// etcd that hangs (not refuses) can stay open and silent: the probe is
// what notices the outage (not synced, /readyz 503), and when etcd answers
// again it ends the watch so that follow lists afresh.
func (r *Registry) probe() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(r.ctx, time.Second)
		_, err := r.cli.Get(ctx, r.prefix+"\x00probe", clientv3.WithCountOnly())
		cancel()
		if err != nil {
			if r.ctx.Err() != nil {
				return
			}
			if !r.lost.Swap(true) {
				r.log.Warn("etcd registry: etcd unreachable; routing with what is known", "error", err)
			}
			r.synced.Store(false)
			continue
		}
		if r.lost.Swap(false) {
			r.log.Info("etcd registry: etcd is back; listing again")
			r.watchMu.Lock()
			if r.watchCancel != nil {
				r.watchCancel()
			}
			r.watchMu.Unlock()
		}
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// list replaces the local view with etcd's and returns its revision.
func (r *Registry) list() (int64, error) {
	ctx, cancel := context.WithTimeout(r.ctx, r.opTO)
	defer cancel()
	res, err := r.cli.Get(ctx, r.prefix, clientv3.WithPrefix())
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := map[string]bool{}
	for _, kv := range res.Kvs {
		if in := r.upsertLocked(kv.Value); in != nil {
			seen[in.InstanceID] = true
		}
	}
	now := time.Now()
	for id, in := range r.insts {
		if !seen[id] {
			r.removeLocked(in, now)
		}
	}
	r.publishLocked()
	return res.Header.Revision, nil
}

func (r *Registry) apply(evs []*clientv3.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	for _, ev := range evs {
		id := strings.TrimPrefix(string(ev.Kv.Key), r.prefix)
		// An event older than what this hub did itself since (a PUT that
		// arrives after the local Deregister) is stale.
		if ev.Kv.ModRevision <= r.modRev[id] {
			continue
		}
		r.modRev[id] = ev.Kv.ModRevision
		switch ev.Type {
		case clientv3.EventTypePut:
			r.upsertLocked(ev.Kv.Value)
		case clientv3.EventTypeDelete:
			if in := r.insts[id]; in != nil {
				r.removeLocked(in, now)
			}
			delete(r.leases, id)
		}
	}
	if len(r.modRev) > 2*len(r.insts)+1024 {
		// Forget the revisions of instances long gone, so the map does
		// not grow with every id ever seen.
		for id := range r.modRev {
			if _, ok := r.insts[id]; !ok {
				delete(r.modRev, id)
			}
		}
	}
	r.publishLocked()
}

// upsertLocked adds or updates an instance from a stored record, keeping
// the same *Instance (and its in-flight count) when the registration did
// not change.
func (r *Registry) upsertLocked(v []byte) *registry.Instance {
	var rec record
	if err := json.Unmarshal(v, &rec); err != nil || rec.InstanceID == "" {
		r.log.Warn("etcd registry: skipping a record it cannot read", "error", err)
		return nil
	}
	rec.HeartbeatInterval = time.Duration(rec.HeartbeatMs) * time.Millisecond
	in := r.insts[rec.InstanceID]
	if in == nil || !sameRegistration(in.Registration, rec.Registration) {
		in = registry.NewInstance(rec.Registration, rec.RegisteredAt)
		r.insts[rec.InstanceID] = in
	}
	in.Beat(registry.Beat{State: rec.State, Load: rec.Load}, time.Now())
	return in
}

func sameRegistration(a, b registry.Registration) bool {
	if a.InstanceID != b.InstanceID || a.Hub != b.Hub || a.Name != b.Name || len(a.Capabilities) != len(b.Capabilities) {
		return false
	}
	for i := range a.Capabilities {
		if a.Capabilities[i] != b.Capabilities[i] {
			return false
		}
	}
	return true
}

// Close implements registry.Registry: it stops following etcd, closes the
// watch channels, revokes the leases of the instances registered here (so
// that they leave the cluster's view now, not at their TTL) and closes the
// client. It is idempotent.
func (r *Registry) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	leases := make([]clientv3.LeaseID, 0, len(r.leases))
	for _, l := range r.leases {
		leases = append(leases, l)
	}
	r.mu.Unlock()
	r.cancel()
	r.wg.Wait()
	r.Publisher.Close()
	for _, l := range leases {
		r.revoke(l)
	}
	return r.cli.Close()
}
