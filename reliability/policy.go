package reliability

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
)

// Strategy names a backoff strategy.
type Strategy string

// The backoff strategies of the kOS seed.
const (
	Fixed       Strategy = "fixed"
	Linear      Strategy = "linear"
	Exponential Strategy = "exponential"
)

// BackoffConfig is how long to wait between attempts.
type BackoffConfig struct {
	Strategy   Strategy      `koanf:"strategy" json:"strategy"`
	Initial    time.Duration `koanf:"initial" json:"initial"`
	Max        time.Duration `koanf:"max" json:"max"`
	Multiplier float64       `koanf:"multiplier" json:"multiplier,omitempty"` // exponential only; default 2
	Jitter     bool          `koanf:"jitter" json:"jitter,omitempty"`         // randomise each delay by ±50 %
}

// Policy is what the mesh does for one method.
type Policy struct {
	// Timeout bounds the whole call, retries included (0: the caller's).
	Timeout time.Duration `koanf:"timeout" json:"timeout"`
	// PerTryTimeout bounds one attempt (0: only Timeout applies).
	PerTryTimeout time.Duration `koanf:"perTryTimeout" json:"perTryTimeout,omitempty"`
	// Retries is the number of attempts after the first.
	Retries int           `koanf:"retries" json:"retries"`
	Backoff BackoffConfig `koanf:"backoff" json:"backoff"`
	// RetryOn lists the codes worth a retry (default UNAVAILABLE,
	// CIRCUIT_OPEN, OVERLOADED and, for idempotent methods, TIMEOUT).
	RetryOn []string `koanf:"retryOn" json:"retryOn,omitempty"`
	// Idempotent methods may run twice; others are retried only when the
	// request provably never reached a handler.
	Idempotent bool `koanf:"idempotent" json:"idempotent"`
	// HedgeAfter, for idempotent methods, sends a second attempt to
	// another instance when the first has not answered after that long.
	HedgeAfter time.Duration `koanf:"hedgeAfter" json:"hedgeAfter,omitempty"`

	retryOn [32]bool // by envelope.Code, compiled by Validate
}

// DefaultPolicy applies to methods no pattern matches: a 10 s call with
// two quick retries, the client's default timeout.
func DefaultPolicy() Policy {
	return Policy{
		Timeout: 10 * time.Second,
		Retries: 2,
		Backoff: BackoffConfig{Strategy: Exponential, Initial: 50 * time.Millisecond, Max: time.Second, Multiplier: 2, Jitter: true},
	}
}

// SeedPolicies are the kOS seed's defaults.
func SeedPolicies() map[string]Policy {
	return map[string]Policy{
		"agent.*": {Timeout: 5 * time.Second, Retries: 3,
			Backoff: BackoffConfig{Strategy: Linear, Initial: time.Second, Max: 5 * time.Second, Jitter: true}},
		"memory.*": {Timeout: 2500 * time.Millisecond, Retries: 2,
			Backoff: BackoffConfig{Strategy: Exponential, Initial: 500 * time.Millisecond, Max: 2 * time.Second, Multiplier: 2, Jitter: true}},
		"llm_chat.*": {Timeout: 30 * time.Second, Retries: 1, // LLM calls can be slow
			Backoff: BackoffConfig{Strategy: Fixed, Initial: 5 * time.Second, Max: 5 * time.Second}},
		"media_gen.*": {Timeout: 60 * time.Second, Retries: 0, // media generation is slow
			Backoff: BackoffConfig{Strategy: Fixed}},
	}
}

// Validate checks p and compiles its retryable codes. name prefixes errors.
func (p *Policy) Validate(name string) error {
	var errs []error
	bad := func(key, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s.%s: %s", name, key, fmt.Sprintf(format, args...)))
	}
	if p.Timeout < 0 {
		bad("timeout", "must not be negative")
	}
	if p.PerTryTimeout < 0 {
		bad("perTryTimeout", "must not be negative")
	}
	if p.Retries < 0 || p.Retries > 10 {
		bad("retries", "must be within 0..10, not %d", p.Retries)
	}
	if p.HedgeAfter < 0 {
		bad("hedgeAfter", "must not be negative")
	}
	if p.HedgeAfter > 0 && !p.Idempotent {
		bad("hedgeAfter", "needs idempotent: true (a hedged call may run twice)")
	}
	b := &p.Backoff
	switch b.Strategy {
	case "":
		b.Strategy = Exponential
	case Fixed, Linear, Exponential:
	default:
		bad("backoff.strategy", "%q is not fixed, linear or exponential", b.Strategy)
	}
	if b.Initial < 0 || b.Max < 0 {
		bad("backoff", "delays must not be negative")
	}
	if b.Max == 0 {
		b.Max = b.Initial
	}
	if b.Max < b.Initial {
		bad("backoff.max", "%v is less than initial %v", b.Max, b.Initial)
	}
	if b.Multiplier == 0 {
		b.Multiplier = 2
	}
	if b.Multiplier < 1 {
		bad("backoff.multiplier", "must be at least 1")
	}
	p.retryOn = [32]bool{}
	if len(p.RetryOn) == 0 {
		for _, c := range []envelope.Code{envelope.CodeUnavailable, envelope.CodeCircuitOpen, envelope.CodeOverloaded, envelope.CodeTimeout} {
			p.retryOn[c] = true
		}
	}
	for _, s := range p.RetryOn {
		c, ok := envelope.ParseCode(s)
		if !ok || c == envelope.CodeOK {
			bad("retryOn", "%q is not an error code", s)
			continue
		}
		p.retryOn[c] = true
	}
	return errors.Join(errs...)
}

// Retryable reports whether an error with code c is worth another attempt
// under p, for a request that may have reached a handler.
func (p *Policy) Retryable(c envelope.Code) bool {
	return p.Idempotent && p.retryableCode(c)
}

// retryableCode reports whether the policy retries code c for an
// idempotent method.
func (p *Policy) retryableCode(c envelope.Code) bool {
	return int(c) < len(p.retryOn) && p.retryOn[c] && c.Retryable(true)
}

// PolicySet maps method names and patterns to policies: an exact name
// first, then the longest matching "prefix.*", then the default. It is
// immutable once built; Reload swaps a whole new set in atomically.
type PolicySet struct {
	cur atomic.Pointer[compiled]
}

type compiled struct {
	exact    map[string]*Policy
	prefixes []prefixPolicy // longest first
	def      *Policy
}

type prefixPolicy struct {
	prefix string
	p      *Policy
}

// NewPolicySet validates and compiles policies by pattern ("memory.*",
// "memory.get", "*") with def for the rest.
func NewPolicySet(def Policy, byPattern map[string]Policy) (*PolicySet, error) {
	c, err := compile(def, byPattern)
	if err != nil {
		return nil, err
	}
	ps := &PolicySet{}
	ps.cur.Store(c)
	return ps, nil
}

// DefaultPolicySet is the seed's policies over DefaultPolicy.
func DefaultPolicySet() *PolicySet {
	ps, err := NewPolicySet(DefaultPolicy(), SeedPolicies())
	if err != nil {
		panic(err) // the defaults are valid; a test pins it
	}
	return ps
}

func compile(def Policy, byPattern map[string]Policy) (*compiled, error) {
	var errs []error
	c := &compiled{exact: map[string]*Policy{}}
	if err := def.Validate("default"); err != nil {
		errs = append(errs, err)
	}
	c.def = &def
	names := make([]string, 0, len(byPattern))
	for k := range byPattern {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		p := byPattern[k]
		if k == "" || strings.Contains(k[:max(len(k)-1, 0)], "*") || (strings.HasSuffix(k, "*") && k != "*" && !strings.HasSuffix(k, ".*")) {
			errs = append(errs, fmt.Errorf("policies.%q: a pattern is a method name, \"prefix.*\" or \"*\"", k))
			continue
		}
		if err := p.Validate("policies." + k); err != nil {
			errs = append(errs, err)
			continue
		}
		if strings.HasSuffix(k, "*") {
			c.prefixes = append(c.prefixes, prefixPolicy{strings.TrimSuffix(k, "*"), &p})
		} else {
			c.exact[k] = &p
		}
	}
	sort.SliceStable(c.prefixes, func(i, j int) bool { return len(c.prefixes[i].prefix) > len(c.prefixes[j].prefix) })
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return c, nil
}

// For returns the policy of method. It allocates nothing; the result must
// not be modified.
func (ps *PolicySet) For(method string) *Policy {
	c := ps.cur.Load()
	if p, ok := c.exact[method]; ok {
		return p
	}
	for _, pp := range c.prefixes {
		if strings.HasPrefix(method, pp.prefix) {
			return pp.p
		}
	}
	return c.def
}

// Reload replaces every policy at once; calls in flight keep the one they
// started with.
func (ps *PolicySet) Reload(def Policy, byPattern map[string]Policy) error {
	c, err := compile(def, byPattern)
	if err != nil {
		return err
	}
	ps.cur.Store(c)
	return nil
}
