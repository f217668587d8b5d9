package reliability

import (
	"context"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/cow"
)

// Bulkheads keeps one Bulkhead per method, all with the same config.
// Lookups take no lock. Safe for concurrent use.
type Bulkheads struct {
	cfg   BulkheadConfig
	pools cow.Map[string, *Bulkhead]
	// OnReject, if set before use, is told of every call a pool refused.
	OnReject func(method string)
}

// NewBulkheads returns an empty set of pools.
func NewBulkheads(cfg BulkheadConfig) *Bulkheads {
	return &Bulkheads{cfg: cfg}
}

// Pool returns the pool of method, made on first use.
func (b *Bulkheads) Pool(method string) *Bulkhead {
	return b.pools.LoadOrCreate(method, func() *Bulkhead { return NewBulkhead(b.cfg) })
}

// Each calls f for every pool.
func (b *Bulkheads) Each(f func(method string, p *Bulkhead)) {
	b.pools.Range(f)
}

// Middleware admits each call through its method's pool, by the
// request's priority header; a full pool answers OVERLOADED at once.
func (b *Bulkheads) Middleware(next envelope.Invoker) envelope.Invoker {
	return func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
		release, err := b.Pool(req.Method).Acquire(ctx, ParsePriority(req.Headers.Priority))
		if err != nil {
			if b.OnReject != nil && envelope.CodeOf(err) == envelope.CodeOverloaded {
				b.OnReject(req.Method)
			}
			return nil, err
		}
		defer release()
		return next(ctx, req)
	}
}

// Middleware puts the per-method breaker (BreakerKey{Method}) around each
// call: an open breaker answers CIRCUIT_OPEN at once, and the call's
// outcome is recorded. On the client it sits outside the retry loop, so
// a rejection is never retried; it carries the attempts mark, so that no
// loop outside retries it either.
func (b *Breakers) Middleware(next envelope.Invoker) envelope.Invoker {
	return func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
		t, err := b.Allow(BreakerKey{Method: req.Method})
		if err != nil {
			return nil, envelope.AsError(err).WithAttempts(1)
		}
		res, err := next(ctx, req)
		t.Done(err)
		return res, err
	}
}
