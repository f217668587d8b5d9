//go:build scenario

package scenario_test

import (
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agentmesh/agentmesh/internal/scenario"
	"github.com/agentmesh/agentmesh/reliability"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}

// config is the seed configuration with one policy for prefix.*, and
// breakers and the retry budget out of the way unless a scenario wants
// them (each has its own scenario).
func config(prefix string, p reliability.Policy, mod func(*reliability.Config)) *reliability.Config {
	rc := reliability.DefaultConfig()
	rc.Policies[prefix+".*"] = p
	rc.CircuitBreaker.FailureThreshold = 1 << 30
	rc.RetryBudget.Window = 0
	if mod != nil {
		mod(&rc)
	}
	return &rc
}

func report(t *testing.T, s scenario.Summary) {
	t.Helper()
	s.Print(os.Stdout)
	if s.Lost != 0 || s.Duplicates != 0 || s.Phantom != 0 || s.Misdelivered != 0 {
		t.Errorf("%s: lost %d, duplicates %d, phantom %d, misdelivered %d; want all 0", s.Scenario, s.Lost, s.Duplicates, s.Phantom, s.Misdelivered)
	}
}

// dur picks the short (CI, -short) or the long duration of a scenario,
// as every scenario test of the repository does.
func dur(short, long time.Duration) time.Duration {
	if !testing.Short() {
		return long
	}
	return short
}
