package config_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/internal/config"
)

func write(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "mesh.yaml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadOverDefaults(t *testing.T) {
	f, err := config.Load(write(t, `
policies:
  "memory.*": { timeout: 1s, retries: 1, idempotent: true, backoff: { strategy: exponential, initial: 100ms, max: 1s } }
  "chaos.echo": { timeout: 2s, retries: 2, idempotent: true, hedgeAfter: 50ms }
circuitBreaker: { failureThreshold: 3 }
bulkhead: { maxConcurrent: 10 }
`))
	if err != nil {
		t.Fatal(err)
	}
	ps, err := f.PolicySet()
	if err != nil {
		t.Fatal(err)
	}
	if p := ps.For("memory.get"); p.Timeout != time.Second || !p.Idempotent {
		t.Errorf("memory.* = %+v; want the file's", p)
	}
	if p := ps.For("agent.x"); p.Timeout != 5*time.Second || p.Retries != 3 {
		t.Errorf("agent.* = %+v; want the seed's default kept", p)
	}
	if p := ps.For("chaos.echo"); p.HedgeAfter != 50*time.Millisecond {
		t.Errorf("chaos.echo = %+v", p)
	}
	if f.CircuitBreaker.FailureThreshold != 3 || f.CircuitBreaker.RecoveryTimeout != 30*time.Second || f.CircuitBreaker.SuccessThreshold != 3 {
		t.Errorf("circuitBreaker = %+v; want threshold 3 and the other defaults", f.CircuitBreaker)
	}
	if f.Bulkhead.MaxConcurrent != 10 || f.Bulkhead.QueueSize != 1000 {
		t.Errorf("bulkhead = %+v", f.Bulkhead)
	}
}

func TestLoadRefusesBadKeys(t *testing.T) {
	cases := []struct{ name, body, want string }{
		{"unknown policy key", `policies: { "memory.*": { timout: 1s } }`, "timout"},
		{"unknown section", `bulkhed: { maxConcurrent: 1 }`, "bulkhed"},
		{"duration without unit", `policies: { "memory.*": { timeout: 1000 } }`, "policies[memory.*].timeout"},
		{"bad duration", `circuitBreaker: { recoveryTimeout: soon }`, "recoveryTimeout"},
		{"bad strategy", `policies: { "m.*": { backoff: { strategy: random } } }`, "policies.m.*.backoff.strategy"},
		{"bad retries", `policies: { "m.*": { retries: 99 } }`, "policies.m.*.retries"},
		{"bad code", `policies: { "m.*": { retryOn: [SOMETIMES] } }`, "retryOn"},
		{"bad pattern", `policies: { "m*": { retries: 1 } }`, `"m*"`},
		{"not YAML", "policies: [", "config"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Load(write(t, tc.body))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Load error = %v; want one naming %s", err, tc.want)
			}
		})
	}
	if _, err := config.Load(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Error("a missing file loaded")
	}
}

func TestLoadEmptyPathIsDefaults(t *testing.T) {
	f, err := config.Load("")
	if err != nil || f.Bulkhead.MaxConcurrent != 100 || len(f.Policies) != 4 {
		t.Errorf("Load(\"\") = %+v, %v; want the seed defaults", f, err)
	}
}

func TestShippedExampleLoads(t *testing.T) {
	f, err := config.Load("../../deploy/mesh.yaml")
	if err != nil {
		t.Fatalf("deploy/mesh.yaml: %v", err)
	}
	ps, _ := f.PolicySet()
	if p := ps.For("echo.echo"); !p.Idempotent || p.HedgeAfter != 50*time.Millisecond {
		t.Errorf("echo.* = %+v", p)
	}
	if f.RetryBudget.Window != 2*time.Second {
		t.Errorf("retryBudget = %+v", f.RetryBudget)
	}
}
