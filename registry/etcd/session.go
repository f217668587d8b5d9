package etcd

import (
	"context"
	"errors"
	"math"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// keepSession holds this hub's session lease: grant, write the presence
// and every live local agent under it, keep it alive; when the keep-alive
// stream ends (etcd unreachable for longer than the TTL, or the lease
// expired), start again.
func (r *Registry) keepSession() {
	backoff := 100 * time.Millisecond
	for r.ctx.Err() == nil {
		err := r.session1()
		r.mu.Lock()
		if r.session != 0 {
			r.session = 0
			r.upCh = make(chan struct{})
		}
		r.mu.Unlock()
		if r.ctx.Err() != nil {
			return
		}
		r.log.Warn("etcd registry: session with etcd lost; starting a new one", "error", err)
		if !sleep(r.ctx, backoff) {
			return
		}
		backoff = min(2*backoff, time.Second)
	}
}

func (r *Registry) session1() error {
	ctx, cancel := context.WithTimeout(r.ctx, r.cfg.OpTimeout)
	defer cancel()
	lease, err := r.cli.Grant(ctx, max(int64(math.Ceil(r.cfg.HubTTL.Seconds())), 1))
	if err != nil {
		return err
	}
	r.mu.Lock()
	hub := r.cfg.Hub // SetHub may rename it meanwhile: see below
	ops := []clientv3.Op{clientv3.OpPut(r.hubsP+hub, r.presence(lease.ID), clientv3.WithLease(lease.ID))}
	ids := make([]string, 0, len(r.local))
	for id, in := range r.local {
		ops = append(ops, clientv3.OpPut(r.key(id), r.value(in, lease.ID), clientv3.WithLease(lease.ID)))
		ids = append(ids, id)
	}
	r.mu.Unlock()
	// One transaction per 100 keys (etcd's default limit is 128 ops).
	var rev int64
	for len(ops) > 0 {
		n := min(len(ops), 100)
		res, err := r.cli.Txn(ctx).Then(ops[:n]...).Commit()
		if err != nil {
			r.revoke(lease.ID)
			return err
		}
		rev, ops = res.Header.Revision, ops[n:]
	}
	kctx, kcancel := context.WithCancel(r.ctx)
	defer kcancel()
	ch, err := r.cli.KeepAlive(kctx, lease.ID)
	if err != nil {
		r.revoke(lease.ID)
		return err
	}
	r.mu.Lock()
	for _, id := range ids {
		r.modRev[id] = max(r.modRev[id], rev)
	}
	r.session = lease.ID
	close(r.upCh)
	if hub != r.cfg.Hub {
		r.repairLocked(r.hubsP+r.cfg.Hub, 0) // renamed while the session started
	}
	r.mu.Unlock()
	if len(ids) > 0 {
		r.log.Info("etcd registry: new session; agents written again", "agents", len(ids))
	}
	// Drain every response: a full channel is what makes clientv3 drop
	// them ("keepalive response queue is full").
	for range ch {
	}
	if r.ctx.Err() != nil {
		// Closing: our presence and agents leave now, not at the TTL.
		r.revoke(lease.ID)
		return nil
	}
	return errors.New("keep-alive stream ended")
}

func (r *Registry) revoke(id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.OpTimeout)
	defer cancel()
	_, _ = r.cli.Revoke(ctx, id)
}
