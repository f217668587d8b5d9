package etcd

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentmesh/agentmesh/registry"
)

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
		r.lastSync.Store(time.Now().UnixNano())
		r.synced.Store(true)
		wctx, wcancel := context.WithCancel(r.ctx)
		r.watchMu.Lock()
		r.watchCancel = wcancel
		r.watchMu.Unlock()
		wch := r.cli.Watch(clientv3.WithRequireLeader(wctx), r.base, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
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

// list replaces the remote part of the local view with etcd's and returns
// its revision. Local agents stay as they are: this hub is their truth.
func (r *Registry) list() (int64, error) {
	kvs, oversized, rev, err := r.getAll()
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	for key, n := range oversized {
		r.refuseLocked(key, ReasonTooLarge, strconv.Itoa(n)+" bytes")
	}
	// Presence first (keys sort hubs/ before instances/, but the view
	// must not depend on it): an instance is accepted only under a hub
	// present in the same listing.
	live := map[string]hubState{}
	for _, kv := range kvs {
		if id, ok := strings.CutPrefix(string(kv.Key), r.hubsP); ok {
			if h, ok := r.parseHub(id, kv); ok {
				live[id] = h
			}
		}
	}
	for id := range r.hubs {
		if _, ok := live[id]; !ok {
			r.setHubLocked(id, hubState{}, now)
		}
	}
	for id, h := range live {
		r.setHubLocked(id, h, now)
	}
	ours := false
	for _, kv := range kvs {
		if string(kv.Key) == r.hubsP+r.cfg.Hub {
			if ours = true; !r.isOurPresence(kv) {
				r.ourPresenceChangedLocked(kv.ModRevision, false)
			}
		}
	}
	if !ours {
		r.ourPresenceChangedLocked(0, true)
	}
	seen := map[string]bool{}
	for _, kv := range kvs {
		key := string(kv.Key)
		if id, ok := strings.CutPrefix(key, r.prefix); ok {
			if in, _ := r.upsertLocked(id, kv); in != nil {
				seen[id] = true
				r.modRev[id] = max(r.modRev[id], kv.ModRevision)
			}
		} else if !strings.HasPrefix(key, r.hubsP) {
			r.refuseLocked(key, ReasonUnknownKey, "not under hubs/ or instances/")
		}
	}
	for id, in := range r.insts {
		if !seen[id] && r.local[id] != in {
			r.removeLocked(in, now)
		}
	}
	if rev < r.rev {
		r.log.Warn("etcd registry: a list went back in revision", "rev", rev, "applied", r.rev)
	}
	r.rev = max(r.rev, rev)
	if r.cfg.Trace != nil {
		r.cfg.Trace("list", rev, "")
	}
	r.pruneLocked()
	r.allDirty = true // a listing: the whole view is looked at again
	r.publishLocked()
	return rev, nil
}

// listPage is how many keys one Get of a listing returns.
const listPage = 256

// getAll reads the prefix at one revision, a page at a time, keeping no
// value larger than a record may be (those are returned by key and size
// only): what a listing holds at once is bounded by the page, not by
// what anyone wrote under the prefix.
func (r *Registry) getAll() (kvs []*mvccpb.KeyValue, oversized map[string]int, rev int64, err error) {
	end := clientv3.GetPrefixRangeEnd(r.base)
	from := r.base
	for {
		ctx, cancel := context.WithTimeout(r.ctx, r.cfg.OpTimeout)
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(listPage)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		res, err := r.cli.Get(ctx, from, opts...)
		cancel()
		if err != nil {
			return nil, nil, 0, err
		}
		if rev == 0 {
			rev = res.Header.Revision
		}
		for _, kv := range res.Kvs {
			limit := r.cfg.MaxRecordBytes
			if strings.HasPrefix(string(kv.Key), r.hubsP) {
				limit = maxHubRecordBytes
			}
			if len(kv.Value) > limit {
				if oversized == nil {
					oversized = map[string]int{}
				}
				oversized[string(kv.Key)] = len(kv.Value)
				continue
			}
			kvs = append(kvs, kv)
		}
		if !res.More || len(res.Kvs) == 0 {
			return kvs, oversized, rev, nil
		}
		from = string(res.Kvs[len(res.Kvs)-1].Key) + "\x00"
	}
}

func (r *Registry) apply(evs []*clientv3.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	for _, ev := range evs {
		key := string(ev.Kv.Key)
		if r.cfg.Trace != nil {
			kind := "put"
			if ev.Type == clientv3.EventTypeDelete {
				kind = "delete"
			}
			r.cfg.Trace(kind, ev.Kv.ModRevision, key)
		}
		r.rev = max(r.rev, ev.Kv.ModRevision)
		if hub, ok := strings.CutPrefix(key, r.hubsP); ok {
			// The hub's id is the key's, for puts and deletes alike.
			if hub == r.cfg.Hub {
				r.ourPresenceEventLocked(ev)
				continue
			}
			h := hubState{}
			if ev.Type == clientv3.EventTypePut {
				var ok bool
				if h, ok = r.parseHub(hub, ev.Kv); !ok {
					// Not a presence a hub wrote: the last valid one
					// stands (a hub whose presence is overwritten writes
					// it again; one that died takes its instances along
					// with its lease).
					continue
				}
			}
			r.setHubLocked(hub, h, now)
			continue
		}
		id, ok := strings.CutPrefix(key, r.prefix)
		if !ok {
			r.refuseLocked(key, ReasonUnknownKey, "not under hubs/ or instances/")
			continue
		}
		if !validID(id) {
			// Before anything is remembered under it: a key may be
			// megabytes long.
			r.refuseLocked(key, ReasonBadKey, "instance id")
			continue
		}
		// An event older than what this hub wrote or saw since (a PUT
		// that arrives after the local Deregister) is stale.
		if ev.Kv.ModRevision <= r.modRev[id] {
			continue
		}
		r.modRev[id] = ev.Kv.ModRevision
		switch ev.Type {
		case clientv3.EventTypePut:
			in, why := r.upsertLocked(id, ev.Kv)
			switch {
			case in != nil:
			case r.local[id] != nil:
				if ownerless(why) {
					// A local agent's key overwritten with a record no
					// hub wrote: ours again.
					r.repairLocked(key, ev.Kv.ModRevision)
				}
			case r.insts[id] != nil:
				// What etcd holds now is refused: the instance leaves,
				// as a listing would drop it (the view must not depend
				// on whether it came from a watch or a list).
				r.removeLocked(r.insts[id], now)
			}
		case clientv3.EventTypeDelete:
			in := r.insts[id]
			if in != nil && r.local[id] != in {
				r.removeLocked(in, now)
			}
			if r.local[id] != nil && r.session != 0 {
				// A local agent's key deleted by someone else while this
				// hub's session holds: written again. (One deleted by
				// etcd because our lease expired while cut off is
				// written with the next session.)
				r.repairLocked(key, 0)
			}
		}
	}
	r.pruneLocked()
	r.publishLocked()
}

// upsertLocked adds or updates an instance from the record under
// instances/<id>, keeping the same *Instance (and its in-flight count)
// when the registration did not change. It returns nil, and changes
// nothing, for a record it refuses (see parseInstance). A valid record of
// a local agent written by another hub means the agent moved there: it is
// no longer ours.
func (r *Registry) upsertLocked(id string, kv *mvccpb.KeyValue) (*registry.Instance, string) {
	rec, o, why := r.parseInstance(id, kv)
	if why != "" {
		return nil, why
	}
	if loc := r.local[id]; loc != nil {
		if rec.Hub == r.cfg.Hub {
			if o.epoch == r.epoch {
				return loc, "" // our own write coming back
			}
			// A record of a previous life of this hub (or one replayed):
			// the agent is attached here, now.
			r.repairLocked(string(kv.Key), kv.ModRevision)
			return loc, ""
		}
		delete(r.local, id) // the agent moved to another hub
		r.dirty[id] = struct{}{}
	} else if o.epoch == r.epoch && r.pending[id] == 0 {
		// Written by us, but not (or no longer) attached here: a
		// registration that landed after its caller gave up, or a
		// heartbeat write racing a deregistration. Nobody would expire it.
		r.orphans[id] = true
	}
	in := r.insts[id]
	if in == nil || !sameRegistration(in.Registration, rec.Registration) {
		in = registry.NewInstance(rec.Registration, rec.RegisteredAt)
	}
	r.setInstLocked(in, o)
	in.Beat(registry.Beat{State: rec.State, Load: rec.Load}, time.Now())
	return in, ""
}

func sameRegistration(a, b registry.Registration) bool {
	if a.InstanceID != b.InstanceID || a.Hub != b.Hub || a.Name != b.Name || len(a.Capabilities) != len(b.Capabilities) ||
		!bytes.Equal(a.Schemas, b.Schemas) {
		return false
	}
	for i := range a.Capabilities {
		if a.Capabilities[i] != b.Capabilities[i] {
			return false
		}
	}
	return true
}
