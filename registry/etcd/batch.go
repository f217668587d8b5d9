package etcd

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentmesh/agentmesh/registry"
)

// Group commit of this hub's instance writes: a write waits for the
// writer's next commit, and the writes queued while one commits go
// together in the next, one etcd transaction for them all. Each keeps its
// own ownership check as a nested transaction (If its compare, Then its
// op), so one failed check does not undo the others. At a trickle every
// write goes alone, as before; in a registration storm (a hub restart, a
// fleet reconnecting) etcd sees one transaction per round trip instead of
// one per agent.

// maxBatch bounds the writes of one transaction, under etcd's
// --max-txn-ops (128 by default).
const maxBatch = 100

// write is one instance write: op on key, if cmp holds.
type write struct {
	ctx  context.Context // its caller's: a write whose caller gave up is not sent
	key  string
	cmp  []clientv3.Cmp
	op   clientv3.Op
	done chan writeResult // buffered 1: the writer never waits on it
}

type writeResult struct {
	rev int64 // the transaction's revision
	err error
}

// writer commits the queued writes, batch by batch.
type writer struct {
	cli     *clientv3.Client
	timeout time.Duration

	mu      sync.Mutex
	q       []*write
	wake    chan struct{}
	commits atomic.Int64 // transactions sent (Commits)
	writes  atomic.Int64 // writes they carried
}

func newWriter(cli *clientv3.Client, timeout time.Duration) *writer {
	return &writer{cli: cli, timeout: timeout, wake: make(chan struct{}, 1)}
}

// do queues a write and waits for its commit or ctx's end (the write may
// still land after that, as any write given up on).
func (w *writer) do(ctx context.Context, key string, op clientv3.Op, cmp ...clientv3.Cmp) (int64, error) {
	wr := &write{ctx: ctx, key: key, cmp: cmp, op: op, done: make(chan writeResult, 1)}
	w.mu.Lock()
	w.q = append(w.q, wr)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	select {
	case r := <-wr.done:
		return r.rev, r.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// take removes the next batch from the queue: in order, each key once (a
// second write of a key waits for the next batch, behind the first), at
// most maxBatch.
func (w *writer) take() []*write {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.q) == 0 {
		return nil
	}
	var batch, rest []*write
	keys := map[string]bool{}
	for _, wr := range w.q {
		if err := wr.ctx.Err(); err != nil {
			wr.done <- writeResult{err: err} // its caller gave up while it waited: not sent
			continue
		}
		if len(batch) < maxBatch && !keys[wr.key] {
			keys[wr.key] = true
			batch = append(batch, wr)
		} else {
			keys[wr.key] = true // what follows a skipped write of a key waits too
			rest = append(rest, wr)
		}
	}
	w.q = rest
	return batch
}

// run commits batches until ctx ends; then it fails what is queued.
func (w *writer) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			w.mu.Lock()
			q := w.q
			w.q = nil
			w.mu.Unlock()
			for _, wr := range q {
				wr.done <- writeResult{err: registry.ErrClosed}
			}
			return
		case <-w.wake:
		}
		for batch := w.take(); len(batch) > 0; batch = w.take() {
			w.commit(ctx, batch)
		}
	}
}

func (w *writer) commit(ctx context.Context, batch []*write) {
	ops := make([]clientv3.Op, len(batch))
	for i, wr := range batch {
		ops[i] = clientv3.OpTxn(wr.cmp, []clientv3.Op{wr.op}, nil)
	}
	// The transaction outlives none of its callers: a write made with a
	// short deadline (expiry's 1 s attempts) is not held behind a commit
	// stuck on etcd (a lost leader) for the writer's whole timeout, nor
	// is every write queued after it.
	deadline := time.Now().Add(w.timeout)
	for _, wr := range batch {
		if d, ok := wr.ctx.Deadline(); ok && d.Before(deadline) {
			deadline = d
		}
	}
	cctx, cancel := context.WithDeadline(ctx, deadline)
	res, err := w.cli.Txn(cctx).Then(ops...).Commit()
	cancel()
	w.commits.Add(1)
	w.writes.Add(int64(len(batch)))
	var rev int64
	if err == nil {
		rev = res.Header.Revision
	}
	for _, wr := range batch {
		wr.done <- writeResult{rev: rev, err: err}
	}
}

// Commits reports the write transactions this registry sent to etcd and
// the instance writes they carried (group commit: fewer transactions than
// writes under load).
func (r *Registry) Commits() (txns, writes int64) {
	return r.writes.commits.Load(), r.writes.writes.Load()
}
