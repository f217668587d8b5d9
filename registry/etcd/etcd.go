// Package etcd is the registry backend for clusters of hubs. Every hub
// lists and watches the prefix and keeps a local snapshot, so that a
// lookup never waits on etcd; when etcd is unreachable the hub keeps
// routing with what it knows and lists again when etcd returns.
//
// Keys, under the prefix (default "/agentmesh/"):
//
//	hubs/<hubId>         a hub's presence {id, addr, epoch}
//	instances/<agentId>  one registration, written by the hub it is attached to
//
// Each hub holds one session lease (TTL HubTTL), kept alive by one
// keep-alive stream, and writes its presence and all its agents under it,
// as etcd's own concurrency.Session does. Agents' heartbeats stay on the
// hub: the hub expires an agent silent for three intervals and deletes its
// key, so a frozen agent leaves every hub's view at the same moment; a
// dead hub's lease expires and takes its presence and all its agents out
// of etcd at once. Heartbeats cost etcd nothing; keep-alives are one per
// TTL/3 per hub, not per agent.
//
// A hub that lost its lease (cut from etcd for longer than the TTL) keeps
// routing to its own agents, grants a new lease when etcd answers again
// and writes its presence and its live agents afresh; agents that died
// meanwhile are not written back. Each process has an epoch, stamped on
// its presence and its instances, so that a hub restarted under the same
// id is not routed agents of its previous life while their keys last.
package etcd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/registry"
)

// Config says where etcd is.
type Config struct {
	Endpoints   []string
	Prefix      string        // default "/agentmesh/"
	DialTimeout time.Duration // default 5 s
	// OpTimeout bounds each etcd call made for a registration (default 3 s).
	OpTimeout time.Duration
	// Username and Password authenticate to etcd (its RBAC: a role with
	// readwrite on Prefix is all the registry needs); New then asks etcd
	// for a token at once and fails if it is refused or etcd does not
	// answer within DialTimeout, and gets a new one whenever etcd refuses
	// the old (authtoken.go). TLS, for https:// endpoints, holds the CA
	// pool and the client certificate (whose CN etcd's --client-cert-auth
	// takes as the user). Never logged.
	Username, Password string
	TLS                *tls.Config

	// Hub is this hub's id (default: the epoch, a new UUIDv7) and HubAddr
	// the address other hubs reach it at, both written in its presence.
	Hub     string
	HubAddr string
	// HubTTL is the session lease's TTL: how long after this hub's death
	// the others drop its agents (default 3 s; etcd rounds up to whole
	// seconds and enforces its own minimum, about 2 s by default).
	HubTTL time.Duration
	// ExpiryCheck is how often local agents are checked for three missed
	// heartbeats (default 25 ms: an agent leaves every view within one TTL
	// of its last heartbeat, give or take this).
	ExpiryCheck time.Duration

	// Sealer, when set (meshd sets it with --auth-key), seals every
	// record this hub writes with a key only hubs hold, and every record
	// read without a valid seal is refused: a record in etcd is then
	// routable only if a hub of this mesh wrote it. Without it, records
	// are checked for form and ownership only, and etcd's own RBAC is what
	// keeps others out of the prefix (deploy/etcd-rbac.md).
	Sealer RecordSealer
	// MaxRecordBytes bounds one record (default 96 KiB: an instance's
	// schemas may take 64 KiB). Larger ones are refused.
	MaxRecordBytes int
	// MaxInstancesPerHub and MaxInstances bound the other hubs' instances
	// this hub keeps: per hub and in all (defaults 20,000 and 200,000).
	// Records past them are refused, logged and counted.
	MaxInstancesPerHub, MaxInstances int
	// OnInvalid, if set, is told of every record refused, with the
	// reason (a metric label: see Reasons). It must not block.
	OnInvalid func(reason string)

	// Trace, if set, is told every change the registry applies from etcd,
	// in order: kind "list" (rev = the list's revision, key empty), "put"
	// or "delete" (rev = the event's ModRevision). For tests that check
	// the watch's ordering guarantees; it must not block.
	Trace func(kind string, rev int64, key string)
}

// Registry is a registry.Registry over etcd. Safe for concurrent use.
type Registry struct {
	cli    *clientv3.Client
	base   string // the configured prefix
	prefix string // base + "instances/"
	hubsP  string // base + "hubs/"
	cfg    Config
	epoch  string // this process's incarnation
	log    *slog.Logger

	*registry.Publisher // snapshots and watchers
	synced              atomic.Bool
	lastSync            atomic.Int64 // unix ns of the last list of the prefix by follow (LastSync)

	mu     sync.Mutex
	insts  map[string]*registry.Instance  // every instance in etcd or local, routable or not
	owners map[string]owner               // instance id → the hub epoch and lease it was written under
	byHub  map[string]map[string]struct{} // the ids of the instances in insts, by hub
	local  map[string]*registry.Instance  // attached to this hub: heartbeats and expiry are ours
	expiry registry.Expiry                // local instances by the deadline their heartbeats set; under mu
	hubs   map[string]hubState            // other hubs' presence as last seen
	// dirty: the instances whose record, owner or routability changed
	// since the last publish (publishLocked applies only them); allDirty:
	// everything may have (a hub's presence changed, a full listing).
	dirty    map[string]struct{}
	allDirty bool
	modRev   map[string]int64  // latest etcd revision applied or written per instance
	rev      int64             // highest revision applied
	pending  map[string]int    // registrations being written now
	orphans  map[string]bool   // keys of ours with no local agent, still to delete
	warned   map[string]string // key → why it was refused, logged once
	repairs  map[string]int64  // keys of ours overwritten or deleted by others → the revision seen (0: deleted)
	repairC  chan struct{}     // wakes repair
	session  clientv3.LeaseID  // 0 while there is none
	upCh     chan struct{}     // closed while a session is up; replaced when it is lost
	closed   bool

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	watchMu     sync.Mutex
	watchCancel context.CancelFunc // ends the current watch, so that follow lists again
	lost        atomic.Bool        // the probe could not reach etcd

	writes *writer // instance writes, group-committed (batch.go)
}

var _ registry.Registry = (*Registry)(nil)

// record is what is stored under instances/<id>.
type record struct {
	registry.Registration
	HeartbeatMs  int64     `json:"heartbeatMs"`
	State        string    `json:"state"`
	Load         float64   `json:"load"`
	RegisteredAt time.Time `json:"registeredAt"`
	HubEpoch     string    `json:"hubEpoch,omitempty"`
}

// hubRecord is what is stored under hubs/<id>.
type hubRecord struct {
	ID      string    `json:"id"`
	Addr    string    `json:"addr,omitempty"`
	Epoch   string    `json:"epoch"`
	Started time.Time `json:"started"`
}

// hubState is a hub's presence as this registry last saw it.
type hubState struct {
	epoch string // empty: the hub's key is gone
	addr  string // where peers reach it
	lease int64  // the lease its presence is under; its instances must be too
}

// owner is who wrote an instance's record: the hub's epoch in it and the
// lease it is under.
type owner struct {
	epoch string
	lease int64
}

// New connects (in the background), starts following the prefix and
// keeping this hub's session. Close stops its goroutines.
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
	if cfg.HubTTL <= 0 {
		cfg.HubTTL = 3 * time.Second
	}
	if cfg.ExpiryCheck <= 0 {
		cfg.ExpiryCheck = 25 * time.Millisecond
	}
	if cfg.MaxRecordBytes <= 0 {
		cfg.MaxRecordBytes = DefaultMaxRecordBytes
	}
	if cfg.MaxInstancesPerHub <= 0 {
		cfg.MaxInstancesPerHub = DefaultMaxInstancesPerHub
	}
	if cfg.MaxInstances <= 0 {
		cfg.MaxInstances = DefaultMaxInstances
	}
	if !validID(cfg.Hub) && cfg.Hub != "" {
		return nil, fmt.Errorf("etcd registry: hub id %q: want 1 to 256 printable bytes without space or /", cfg.Hub)
	}
	epoch := envelope.NewID()
	if cfg.Hub == "" {
		cfg.Hub = epoch
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var auth *tokenAuth // the password's token, kept by the registry (authtoken.go)
	var authOpts []grpc.DialOption
	if cfg.Username != "" {
		ctx, cancel := context.WithTimeout(context.Background(), cfg.DialTimeout)
		var err error
		auth, err = newTokenAuth(ctx, cfg, clientLogger(log))
		cancel()
		if err != nil {
			return nil, fmt.Errorf("etcd registry: authenticating to etcd as user %q: %w", cfg.Username, err)
		}
		authOpts = auth.dialOptions()
	}
	// The client's warnings (lease keep-alive trouble, failed retries) go
	// to the hub's log: with zap.NewNop they were lost, and a check for
	// them (S06: no "keepalive response queue is full") saw nothing.
	cli, err := clientv3.New(clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: cfg.DialTimeout, Logger: clientLogger(log), TLS: cfg.TLS,
		// A connection to etcd that went silent (a partition drops its
		// packets, closes nothing) is given up after a keep-alive ping
		// unanswered for a second (etcd refuses pings more often than
		// every 5 s), and connecting again is tried at least every
		// second with short attempts. Without this the old connection
		// came back only at TCP's next retransmission, whose backoff
		// grows to seconds: measured in the netns lab (S05 b), a hub cut
		// from etcd for 10 s took 6.5 s after the heal to write its
		// agents again.
		DialKeepAliveTime: 5 * time.Second, DialKeepAliveTimeout: time.Second,
		DialOptions: append([]grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		})}, authOpts...),
	})
	if err != nil {
		if auth != nil {
			auth.close()
		}
		return nil, fmt.Errorf("etcd registry: %w", err)
	}
	if auth != nil {
		context.AfterFunc(cli.Ctx(), auth.close) // Close closes both
	}
	r := &Registry{
		cli: cli, base: cfg.Prefix, prefix: cfg.Prefix + "instances/", hubsP: cfg.Prefix + "hubs/",
		cfg: cfg, epoch: epoch, log: log,
		Publisher: registry.NewPublisher(),
		insts:     map[string]*registry.Instance{}, owners: map[string]owner{}, byHub: map[string]map[string]struct{}{}, local: map[string]*registry.Instance{},
		hubs: map[string]hubState{}, dirty: map[string]struct{}{}, modRev: map[string]int64{}, pending: map[string]int{}, orphans: map[string]bool{}, upCh: make(chan struct{}),
		warned: map[string]string{}, repairs: map[string]int64{}, repairC: make(chan struct{}, 1),
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.writes = newWriter(cli, cfg.OpTimeout)
	r.wg.Go(func() { r.writes.run(r.ctx) })
	r.wg.Go(r.follow)
	r.wg.Go(r.probe)
	r.wg.Go(r.keepSession)
	r.wg.Go(r.expire)
	r.wg.Go(r.repair)
	return r, nil
}

// Synced reports whether the local view has caught up with etcd and this
// hub's session is up (for /readyz): a hub without a session is not seen
// by the others.
func (r *Registry) Synced() bool {
	r.mu.Lock()
	up := r.session != 0
	r.mu.Unlock()
	return r.synced.Load() && up
}

// LastSync is when follow last listed the prefix (at start, and after
// every lost watch): the hub answers methods it has not seen UNAVAILABLE
// for a while after it (HubConfig.WarmUp). Zero before the first list.
func (r *Registry) LastSync() time.Time {
	if ns := r.lastSync.Load(); ns != 0 {
		return time.Unix(0, ns)
	}
	return time.Time{}
}

// Epoch is this process's incarnation, written with its presence.
func (r *Registry) Epoch() string { return r.epoch }

// Revision is the highest etcd revision applied to the local view.
func (r *Registry) Revision() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rev
}

func (r *Registry) key(id string) string { return r.prefix + id }

func (r *Registry) value(in *registry.Instance, lease clientv3.LeaseID) string {
	reg := in.Registration
	reg.Hub, reg.HubAddr = r.cfg.Hub, r.cfg.HubAddr
	return r.encode(r.key(in.InstanceID), lease, record{Registration: reg, HeartbeatMs: in.HeartbeatInterval.Milliseconds(),
		State: in.State(), Load: in.Load(), RegisteredAt: in.RegisteredAt, HubEpoch: r.epoch})
}

// presence is this hub's record under hubs/.
func (r *Registry) presence(lease clientv3.LeaseID) string {
	return r.encode(r.hubsP+r.cfg.Hub, lease, hubRecord{ID: r.cfg.Hub, Addr: r.cfg.HubAddr, Epoch: r.epoch, Started: time.Now().UTC()})
}

// waitSession returns the session lease, waiting for one while ctx lasts.
func (r *Registry) waitSession(ctx context.Context) (clientv3.LeaseID, error) {
	for {
		r.mu.Lock()
		s, ch, closed := r.session, r.upCh, r.closed
		r.mu.Unlock()
		if closed {
			return 0, registry.ErrClosed
		}
		if s != 0 {
			return s, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return 0, fmt.Errorf("etcd registry: no session with etcd: %w", ctx.Err())
		}
	}
}

// Register implements registry.Registry: the instance is written under
// this hub's session and shows in this hub's snapshot at once.
func (r *Registry) Register(ctx context.Context, reg registry.Registration) (*registry.Instance, error) {
	if err := reg.Validate(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.OpTimeout)
	defer cancel()
	lease, err := r.waitSession(ctx)
	if err != nil {
		return nil, err
	}
	// The record names this hub, whatever the caller said: other hubs
	// route to it only through this hub's presence.
	reg.Hub, reg.HubAddr = r.cfg.Hub, r.cfg.HubAddr
	in := registry.NewInstance(reg, time.Now())
	r.mu.Lock()
	r.pending[reg.InstanceID]++
	r.mu.Unlock()
	k := r.key(reg.InstanceID)
	rev, err := r.writes.do(ctx, k, clientv3.OpPut(k, r.value(in, lease), clientv3.WithLease(lease)))
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pending[reg.InstanceID]--; r.pending[reg.InstanceID] == 0 {
		delete(r.pending, reg.InstanceID)
	}
	if err != nil {
		// The write may still land after we gave up: the watch will see
		// an orphan of ours and delete it.
		return nil, fmt.Errorf("etcd registry: put: %w", err)
	}
	if r.closed {
		return nil, registry.ErrClosed
	}
	r.modRev[reg.InstanceID] = max(r.modRev[reg.InstanceID], rev)
	delete(r.orphans, reg.InstanceID)
	r.local[reg.InstanceID] = in
	r.dirty[reg.InstanceID] = struct{}{}
	r.expiry.Add(in)
	r.setInstLocked(in, owner{epoch: r.epoch})
	r.publishLocked()
	return in, nil
}

// Heartbeat implements registry.Registry. It costs etcd nothing unless
// the agent's state changed, which is written for the other hubs.
func (r *Registry) Heartbeat(ctx context.Context, id string, b registry.Beat) error {
	r.mu.Lock()
	in := r.local[id]
	lease := r.session
	r.mu.Unlock()
	if in == nil {
		return registry.ErrNotFound
	}
	if !in.Beat(b, time.Now()) {
		return nil
	}
	r.mu.Lock()
	r.dirty[id] = struct{}{}
	r.publishLocked()
	r.mu.Unlock()
	if lease == 0 {
		return nil // written with the others when the session is back
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.OpTimeout)
	defer cancel()
	if err := r.putIfOurs(ctx, id, r.value(in, lease), lease); err != nil {
		return fmt.Errorf("etcd registry: put: %w", err)
	}
	return nil
}

// putIfOurs writes an instance's key unless another hub took it over
// meanwhile (the agent re-registered there).
func (r *Registry) putIfOurs(ctx context.Context, id, val string, lease clientv3.LeaseID) error {
	k := r.key(id)
	rev, err := r.writes.do(ctx, k, clientv3.OpPut(k, val, clientv3.WithLease(lease)), clientv3.Compare(clientv3.LeaseValue(k), "=", lease))
	if err == nil {
		r.mu.Lock()
		r.modRev[id] = max(r.modRev[id], rev)
		r.mu.Unlock()
	}
	return err
}

// deleteIfOurs removes an instance's key unless another hub owns it now.
func (r *Registry) deleteIfOurs(ctx context.Context, id string, lease clientv3.LeaseID) error {
	k := r.key(id)
	rev, err := r.writes.do(ctx, k, clientv3.OpDelete(k), clientv3.Compare(clientv3.LeaseValue(k), "=", lease))
	if err == nil {
		r.mu.Lock()
		r.modRev[id] = max(r.modRev[id], rev)
		r.mu.Unlock()
	}
	return err
}

// Deregister implements registry.Registry.
func (r *Registry) Deregister(ctx context.Context, id string) error {
	r.mu.Lock()
	in, ok := r.local[id]
	lease := r.session
	if ok {
		delete(r.local, id)
		r.dirty[id] = struct{}{}
		if r.insts[id] == in {
			r.removeLocked(in, time.Now())
		}
		r.publishLocked()
	}
	r.mu.Unlock()
	if !ok {
		return registry.ErrNotFound
	}
	if lease == 0 {
		return nil // no session: the key went with the lease
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.OpTimeout)
	defer cancel()
	if err := r.deleteIfOurs(ctx, id, lease); err != nil {
		r.mu.Lock()
		r.orphans[id] = true // retried until it goes
		r.mu.Unlock()
		return fmt.Errorf("etcd registry: delete: %w", err)
	}
	return nil
}

// expiryDeleteTimeout bounds one attempt to delete an expired or orphaned
// key (see expire).
const expiryDeleteTimeout = time.Second

// expire removes local agents silent for three heartbeat intervals, here
// and in etcd.
func (r *Registry) expire() {
	t := time.NewTicker(r.cfg.ExpiryCheck)
	defer t.Stop()
	for {
		select {
		case <-r.ctx.Done():
			return
		case now := <-t.C:
			var gone []string
			r.mu.Lock()
			for _, in := range r.expiry.Due(now, func(in *registry.Instance) bool { return r.local[in.InstanceID] == in }) {
				id := in.InstanceID
				delete(r.local, id)
				r.dirty[id] = struct{}{}
				r.dirty[id] = struct{}{}
				if r.insts[id] == in {
					r.removeLocked(in, now)
				}
				gone = append(gone, id)
			}
			lease := r.session
			if len(gone) > 0 {
				r.publishLocked()
			}
			for id := range r.orphans {
				if r.local[id] == nil && r.pending[id] == 0 {
					gone = append(gone, id)
				}
				delete(r.orphans, id)
			}
			r.mu.Unlock()
			if lease == 0 {
				continue // the keys go with the lost session
			}
			for _, id := range gone {
				// Each attempt is short and retried at the next tick: a
				// delete sent while etcd elects a new leader waits for
				// no answer, and a full OpTimeout per attempt would
				// keep a dead agent's key that long after the election
				// (S18 c). The delete only removes our own key, so
				// repeating it is harmless.
				ctx, cancel := context.WithTimeout(r.ctx, min(r.cfg.OpTimeout, expiryDeleteTimeout))
				err := r.deleteIfOurs(ctx, id, lease)
				cancel()
				if err != nil {
					if r.ctx.Err() != nil {
						return
					}
					r.mu.Lock()
					r.orphans[id] = true // next tick
					r.mu.Unlock()
				}
			}
		}
	}
}

func (r *Registry) removeLocked(in *registry.Instance, now time.Time) {
	r.delInstLocked(in.InstanceID) // its capabilities stay known a while: Publish records the departure
}

// setInstLocked puts in into the view, written by o.
func (r *Registry) setInstLocked(in *registry.Instance, o owner) {
	id := in.InstanceID
	if old := r.insts[id]; old != nil {
		r.unindexLocked(old)
	}
	r.insts[id] = in
	ids := r.byHub[in.Hub]
	if ids == nil {
		ids = map[string]struct{}{}
		r.byHub[in.Hub] = ids
	}
	ids[id] = struct{}{}
	r.owners[id] = o
	r.dirty[id] = struct{}{}
}

func (r *Registry) unindexLocked(in *registry.Instance) {
	if ids := r.byHub[in.Hub]; ids != nil {
		if delete(ids, in.InstanceID); len(ids) == 0 {
			delete(r.byHub, in.Hub)
		}
	}
}

func (r *Registry) delInstLocked(id string) {
	old := r.insts[id]
	if old == nil {
		return
	}
	r.unindexLocked(old)
	delete(r.insts, id)
	delete(r.owners, id)
	r.dirty[id] = struct{}{}
}

// routable reports whether an instance may be routed to: a local one
// always; a remote one while its hub is present with the epoch it was
// registered under, and its record is under that hub's presence lease
// (so that only the hub's own session can have written it, and it leaves
// with the hub).
func (r *Registry) routable(in *registry.Instance) bool {
	if r.local[in.InstanceID] == in {
		return true
	}
	if in.Hub == r.cfg.Hub {
		return false // left by a previous life of this hub: no link here
	}
	h := r.hubs[in.Hub]
	o := r.owners[in.InstanceID]
	return h.epoch != "" && o.epoch == h.epoch && o.lease == h.lease
}

// publishLocked publishes what changed since the last publish: the dirty
// instances alone (a watch event costs the instances it names, not the
// registry's size; a hub's presence changing, its instances), or the
// whole view after a listing.
func (r *Registry) publishLocked() {
	if !r.allDirty {
		if len(r.dirty) == 0 {
			return
		}
		snap := r.Snapshot()
		var puts, gone []*registry.Instance
		for id := range r.dirty {
			if in := r.insts[id]; in != nil && r.routable(in) {
				puts = append(puts, in) // new, replaced, or its state changed: indexed again
			} else if cur := snap.Instance(id); cur != nil {
				gone = append(gone, cur)
			}
		}
		clear(r.dirty)
		r.Apply(puts, gone)
		return
	}
	r.allDirty = false
	clear(r.dirty)
	hidden := 0
	for _, in := range r.insts {
		if !r.routable(in) {
			hidden++
		}
	}
	if hidden == 0 {
		r.Publish(r.insts)
		return
	}
	vis := make(map[string]*registry.Instance, len(r.insts)-hidden)
	for id, in := range r.insts {
		if r.routable(in) {
			vis[id] = in
		}
	}
	r.Publish(vis)
}

// setHubLocked records another hub's presence (epoch "" = gone). Its
// instances that stop being routable count as having left, so their
// methods answer UNAVAILABLE (not METHOD_NOT_FOUND) for a while.
func (r *Registry) setHubLocked(id string, h hubState, now time.Time) {
	if id == "" || id == r.cfg.Hub {
		return
	}
	if r.hubs[id] != h {
		for inst := range r.byHub[id] { // its instances may come or go: the next publish looks at them
			r.dirty[inst] = struct{}{}
		}
	}
	r.hubs[id] = h // its instances that stop being routable leave at the next Publish
}

// pruneLocked forgets revisions of instances and hubs long gone, so the
// maps do not grow with every id ever seen.
func (r *Registry) pruneLocked() {
	if len(r.modRev) > 2*len(r.insts)+1024 {
		for id := range r.modRev {
			if _, ok := r.insts[id]; !ok {
				delete(r.modRev, id)
			}
		}
	}
	if len(r.hubs) > 64 {
		used := map[string]bool{}
		for _, in := range r.insts {
			used[in.Hub] = true
		}
		for id, h := range r.hubs {
			if h.epoch == "" && !used[id] {
				delete(r.hubs, id)
			}
		}
	}
}

// Close implements registry.Registry: it stops following etcd, closes the
// watch channels, revokes this hub's session (so that its presence and
// agents leave the cluster's view now, not at the TTL) and closes the
// client. It is idempotent.
func (r *Registry) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	r.mu.Unlock()
	r.cancel()
	r.wg.Wait()
	r.Publisher.Close()
	return r.cli.Close()
}
