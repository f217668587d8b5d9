package reliability

import (
	"errors"
	"fmt"
)

// Config is the reliability section of the mesh's YAML file (DESIGN.md):
//
//	policies:
//	  "memory.*": { timeout: 2.5s, retries: 2, idempotent: true, backoff: { strategy: exponential, initial: 500ms, max: 2s } }
//	default: { timeout: 10s, retries: 2 }
//	circuitBreaker: { failureThreshold: 5, recoveryTimeout: 30s, successThreshold: 3 }
//	bulkhead: { maxConcurrent: 100, queueSize: 1000, queueTimeout: 30s }
//	retryBudget: { ratio: 0.2, minPerSecond: 10, window: 10s }
//
// A file is decoded over DefaultConfig: a pattern in the file replaces the
// seed's policy of the same pattern whole, the seed's others stay, and a
// section's keys left out keep their defaults.
type Config struct {
	Policies       map[string]Policy `koanf:"policies"`
	Default        *Policy           `koanf:"default"`
	CircuitBreaker BreakerConfig     `koanf:"circuitBreaker"`
	Bulkhead       BulkheadConfig    `koanf:"bulkhead"`
	RetryBudget    BudgetConfig      `koanf:"retryBudget"`
}

// DefaultConfig is the seed's configuration.
func DefaultConfig() Config {
	return Config{
		Policies:       SeedPolicies(),
		CircuitBreaker: DefaultBreakerConfig(),
		Bulkhead:       DefaultBulkheadConfig(),
		RetryBudget:    DefaultBudgetConfig(),
	}
}

// Validate checks the whole configuration, naming each bad key.
func (c *Config) Validate() error {
	_, err := c.PolicySet()
	errs := []error{err}
	if e := c.CircuitBreaker.Validate(); e != nil {
		errs = append(errs, e)
	}
	if c.Bulkhead.MaxConcurrent < 0 || c.Bulkhead.QueueSize < 0 || c.Bulkhead.QueueTimeout < 0 {
		errs = append(errs, errors.New("bulkhead: maxConcurrent, queueSize and queueTimeout must not be negative"))
	}
	if c.RetryBudget.Ratio < 0 || c.RetryBudget.MinPerSecond < 0 || c.RetryBudget.Window < 0 {
		errs = append(errs, errors.New("retryBudget: ratio, minPerSecond and window must not be negative"))
	}
	return errors.Join(errs...)
}

// PolicySet compiles the policies (seed defaults plus the file's).
func (c *Config) PolicySet() (*PolicySet, error) {
	def := DefaultPolicy()
	if c.Default != nil {
		def = *c.Default
	}
	ps, err := NewPolicySet(def, c.Policies)
	if err != nil {
		return nil, fmt.Errorf("invalid policy: %w", err)
	}
	return ps, nil
}
