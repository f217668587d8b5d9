package reliability

import (
	"errors"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/cow"
)

// BreakerConfig maps the kOS seed's circuitBreaker onto gobreaker:
// FailureThreshold consecutive failures open it (ReadyToTrip), it stays
// open RecoveryTimeout (Timeout), then admits SuccessThreshold probes and
// closes after that many successes (MaxRequests is both in gobreaker).
type BreakerConfig struct {
	FailureThreshold uint32        `koanf:"failureThreshold" json:"failureThreshold"`
	RecoveryTimeout  time.Duration `koanf:"recoveryTimeout" json:"recoveryTimeout"`
	SuccessThreshold uint32        `koanf:"successThreshold" json:"successThreshold"`
}

// DefaultBreakerConfig is the seed's: 5 failures, 30 s, 3 successes.
func DefaultBreakerConfig() BreakerConfig {
	return BreakerConfig{FailureThreshold: 5, RecoveryTimeout: 30 * time.Second, SuccessThreshold: 3}
}

// Validate checks the configuration.
func (c BreakerConfig) Validate() error {
	if c.FailureThreshold == 0 || c.SuccessThreshold == 0 || c.RecoveryTimeout <= 0 {
		return errors.New("circuitBreaker: failureThreshold, successThreshold and recoveryTimeout must be positive")
	}
	return nil
}

// BreakerKey names one breaker: a method, and an instance for the hub's
// per-instance breakers (empty on the client's per-method ones).
type BreakerKey struct {
	Method   string
	Instance string
}

// BreakerInfo is one breaker's state for mesh.breakers: gobreaker's
// counts of the current generation. A call that a closed breaker with no
// failure counted admits without gobreaker (breakerfast.go) is counted
// when it succeeds: calls in flight on a healthy breaker are not in
// Requests yet.
type BreakerInfo struct {
	Method              string `json:"method"`
	Instance            string `json:"instance,omitempty"`
	State               string `json:"state"`
	Requests            uint32 `json:"requests"`
	TotalSuccesses      uint32 `json:"totalSuccesses"`
	TotalFailures       uint32 `json:"totalFailures"`
	ConsecutiveFailures uint32 `json:"consecutiveFailures"`
}

// Breakers holds one two-step breaker per key, made on first use. The map
// is copy-on-write behind an atomic pointer: a lookup takes no lock and
// allocates nothing. Safe for concurrent use.
type Breakers struct {
	cfg      BreakerConfig
	m        cow.Map[BreakerKey, *breaker]
	onChange func(k BreakerKey, from, to string)
}

// breaker is one gobreaker with the time it last opened, which gobreaker
// keeps to itself: the breaker admits a probe once RecoveryTimeout has
// passed since then (ProbeAt).
type breaker struct {
	cb     *gobreaker.TwoStepCircuitBreaker[struct{}]
	opened atomic.Int64 // unix ns of the last transition to open; written under cb's lock
	// open is whether its last transition was to open, so that the
	// question asked of every candidate of every call, "is it open?",
	// costs a load, not State's lock and clock read: a breaker leaves
	// closed and half-open only on a call's outcome, which runs
	// OnStateChange; only the turn from open to half-open happens on
	// the clock, so State is asked only while this is true.
	open atomic.Bool

	// The fast path (breakerfast.go): gen counts generations (one per
	// transition, from 1), clean is gen while the breaker is closed and
	// counts no failure (0 otherwise), fastOK the successes of this
	// generation that gobreaker did not see (List adds them).
	mu    sync.Mutex
	gen   atomic.Uint64
	clean atomic.Uint64
	_     [64]byte // fastOK, written by every fast success, off the line every Allow reads
	// fastOK is this generation's fast successes.
	fastOK atomic.Uint32
}

// NewBreakers returns an empty set. onChange, if not nil, is called on
// every state transition while the breaker's lock is held, with the
// states' names ("closed", "half-open", "open"): it may update a metric,
// never call the breaker. (gobreaker's own state type stays inside this
// package.)
func NewBreakers(cfg BreakerConfig, onChange func(k BreakerKey, from, to string)) *Breakers {
	return &Breakers{cfg: cfg, onChange: onChange}
}

// counted reports whether an error says something about the callee's
// health. Caller mistakes, refusals by the mesh itself and requests that
// never reached a handler are excluded: they neither trip nor heal a
// breaker.
func counted(err error) bool {
	if err == nil {
		return true // and no escape of e below for every success
	}
	var e *envelope.Error
	if errors.As(err, &e) && e.NotSent() {
		return false
	}
	switch envelope.CodeOf(err) {
	case envelope.CodeCancelled, envelope.CodeInvalidParams, envelope.CodeInvalidRequest,
		envelope.CodeParseError, envelope.CodeMethodNotFound, envelope.CodeAgentNotFound,
		envelope.CodeUnauthenticated, envelope.CodePermissionDenied, envelope.CodeCircuitOpen:
		return false
	}
	return true
}

func (b *Breakers) get(k BreakerKey) *breaker {
	return b.m.LoadOrCreate(k, func() *breaker {
		br := &breaker{}
		br.gen.Store(1)
		br.clean.Store(1) // closed, no failure counted
		threshold := b.cfg.FailureThreshold
		st := gobreaker.Settings{
			Name:        k.Method + "@" + k.Instance,
			MaxRequests: b.cfg.SuccessThreshold,
			Timeout:     b.cfg.RecoveryTimeout,
			ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= threshold },
			IsExcluded:  func(err error) bool { return !counted(err) },
			OnStateChange: func(_ string, from, to gobreaker.State) {
				if to == gobreaker.StateOpen {
					// gobreaker took its clock just before: this time is
					// at or after the one its expiry counts from.
					br.opened.Store(time.Now().UnixNano())
				}
				br.open.Store(to == gobreaker.StateOpen)
				br.transition(to)
				if b.onChange != nil {
					b.onChange(k, from.String(), to.String())
				}
			},
		}
		br.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](st)
		return br
	})
}

// Allow asks the breaker of k for permission. On success the caller must
// call the ticket's Done with the outcome; otherwise the error is
// CIRCUIT_OPEN (marked not sent).
func (b *Breakers) Allow(k BreakerKey) (Ticket, error) {
	br := b.get(k)
	if g := br.clean.Load(); g != 0 {
		return Ticket{br: br, gen: g}, nil
	}
	done, err := br.cb.Allow()
	if err != nil {
		msg := "circuit open for " + k.Method
		if k.Instance != "" {
			msg += " on " + k.Instance
		}
		if errors.Is(err, gobreaker.ErrTooManyRequests) {
			msg += " (half-open: probes in flight)"
		}
		return Ticket{}, envelope.WrapError(envelope.CodeCircuitOpen, msg, err).MarkNotSent()
	}
	return Ticket{br: br, done: done}, nil
}

// IsOpen reports whether k's breaker refuses calls now (open, or
// half-open with its probes all in flight is not counted: it may admit).
func (b *Breakers) IsOpen(k BreakerKey) bool {
	br, ok := b.m.Load(k)
	return ok && br.open.Load() && br.cb.State() == gobreaker.StateOpen
}

// ProbeAt reports when k's breaker, open now, turns half-open: the first
// instant at which it admits a probe (gobreaker opens it at expiry,
// RecoveryTimeout after it opened, for calls strictly after that). ok is
// false when the breaker is not open.
func (b *Breakers) ProbeAt(k BreakerKey) (at time.Time, ok bool) {
	br, found := b.m.Load(k)
	if !found || !br.open.Load() || br.cb.State() != gobreaker.StateOpen {
		return time.Time{}, false
	}
	// State took the breaker's lock after the transition to open, whose
	// callback stored the time under that lock.
	return time.Unix(0, br.opened.Load()).Add(b.cfg.RecoveryTimeout + time.Nanosecond), true
}

// CircuitOpen is the refusal of a call whose every candidate is behind an
// open breaker: CIRCUIT_OPEN, marked not sent. probe is the earliest
// ProbeAt of those breakers (zero: none known). With no probe the error
// carries the attempts mark, so that no retry loop tries again. With one
// it carries {"retryAfterMs": the time until then} instead, and the retry
// loop tries again at that moment if the call's deadline, its attempts and
// the budget allow, else gives up at once: either way nothing waits a
// backoff that cannot help.
func CircuitOpen(msg string, probe time.Time) *envelope.Error {
	e := envelope.NewError(envelope.CodeCircuitOpen, msg)
	if probe.IsZero() {
		return e.MarkNotSent().WithAttempts(1)
	}
	d := max(time.Until(probe), 0)
	ms := (d + time.Millisecond - 1) / time.Millisecond // rounded up: not before the probe is due
	return e.WithData(map[string]int64{"retryAfterMs": max(int64(ms), 1)}).MarkNotSent()
}

// Forget drops the breakers of an instance that left.
func (b *Breakers) Forget(instance string) {
	if instance == "" {
		return
	}
	b.m.DeleteFunc(func(k BreakerKey, _ *breaker) bool { return k.Instance == instance })
}

// List returns every breaker's state, sorted by method then instance.
func (b *Breakers) List() []BreakerInfo {
	out := make([]BreakerInfo, 0, b.m.Len())
	b.m.Range(func(k BreakerKey, br *breaker) {
		cb := br.cb
		c := cb.Counts()
		fast := br.fastOK.Load() // calls of the fast path, counted as they end
		out = append(out, BreakerInfo{
			Method: k.Method, Instance: k.Instance, State: cb.State().String(),
			Requests: c.Requests + fast, TotalSuccesses: c.TotalSuccesses + fast, TotalFailures: c.TotalFailures,
			ConsecutiveFailures: c.ConsecutiveFailures,
		})
	})
	sort.Slice(out, func(i, j int) bool {
		if out[i].Method != out[j].Method {
			return out[i].Method < out[j].Method
		}
		return out[i].Instance < out[j].Instance
	})
	return out
}
