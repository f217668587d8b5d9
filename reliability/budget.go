package reliability

import (
	"sync"
	"time"

	"github.com/agentmesh/agentmesh/internal/cow"
)

// BudgetConfig bounds retries per method so that a failing cluster does
// not get a retry storm: over a sliding Window, retries may be at most
// Ratio × requests plus MinPerSecond × the window's seconds (Linkerd's
// retry budget, Envoy's retry_budget).
type BudgetConfig struct {
	Ratio        float64       `koanf:"ratio" json:"ratio"`
	MinPerSecond float64       `koanf:"minPerSecond" json:"minPerSecond"`
	Window       time.Duration `koanf:"window" json:"window"`
}

// DefaultBudgetConfig: 20 % of requests plus 10 retries per second
// (Linkerd's values) over a 2 s window. A window much longer than that
// (Linkerd's 10 s) lets a sudden failure spend the allowance saved during
// the healthy seconds before it all at once: more than 1.25 attempts per
// request during the first seconds of an outage.
func DefaultBudgetConfig() BudgetConfig {
	return BudgetConfig{Ratio: 0.2, MinPerSecond: 10, Window: 2 * time.Second}
}

// budgetSlots is how many buckets a window is cut into.
const budgetSlots = 10

// Budget tracks requests and retries per method. Safe for concurrent use.
type Budget struct {
	cfg     BudgetConfig
	slots   int
	width   int64 // nanoseconds per bucket
	methods cow.Map[string, *methodBudget]
	now     func() time.Time
}

type methodBudget struct {
	mu      sync.Mutex
	buckets []budgetBucket // one per second of the window
}

type budgetBucket struct {
	slot              int64 // which bucket of time it counts (unix nanos / width)
	requests, retries int64
}

// NewBudget returns a budget; a zero Window disables it (every retry allowed).
func NewBudget(cfg BudgetConfig) *Budget {
	b := &Budget{cfg: cfg, now: time.Now}
	if cfg.Window > 0 {
		b.slots = budgetSlots
		b.width = max(int64(cfg.Window)/budgetSlots, 1)
	}
	return b
}

func (b *Budget) method(name string) *methodBudget {
	return b.methods.LoadOrCreate(name, func() *methodBudget { return &methodBudget{buckets: make([]budgetBucket, b.slots)} })
}

func (mb *methodBudget) bucket(slot int64) *budgetBucket {
	bk := &mb.buckets[slot%int64(len(mb.buckets))]
	if bk.slot != slot {
		*bk = budgetBucket{slot: slot}
	}
	return bk
}

func (mb *methodBudget) sums(slot int64) (req, ret int64) {
	for i := range mb.buckets {
		bk := &mb.buckets[i]
		if slot-bk.slot < int64(len(mb.buckets)) {
			req += bk.requests
			ret += bk.retries
		}
	}
	return
}

// Request counts a new call of method (its first attempt).
func (b *Budget) Request(method string) { b.RequestAt(method, b.now()) }

// RequestAt is Request with the caller's reading of the clock.
func (b *Budget) RequestAt(method string, now time.Time) {
	if b == nil || b.slots == 0 {
		return
	}
	mb := b.method(method)
	slot := now.UnixNano() / b.width
	mb.mu.Lock()
	mb.bucket(slot).requests++
	mb.mu.Unlock()
}

// TryRetry reports whether method may make one more retry now, and counts
// it when it may.
func (b *Budget) TryRetry(method string) bool {
	if b == nil || b.slots == 0 {
		return true
	}
	mb := b.method(method)
	slot := b.now().UnixNano() / b.width
	mb.mu.Lock()
	defer mb.mu.Unlock()
	req, ret := mb.sums(slot)
	allowed := b.cfg.Ratio*float64(req) + b.cfg.MinPerSecond*b.cfg.Window.Seconds()
	if float64(ret+1) > allowed {
		return false
	}
	mb.bucket(slot).retries++
	return true
}
