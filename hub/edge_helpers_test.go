// Helpers shared by the edge scenarios (S26, S27: scenario build tag)
// and S29 (always).

package hub_test

import (
	"os"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/telemetry"
)

func ms(d time.Duration) float64 { return testkit.Ms(d) }

// openFDs counts this process's open file descriptors (the hub runs in
// process, so this is the hub's count plus the test's own).
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("read /proc/self/fd: %v", err)
	}
	return len(ents)
}

// refusedTotal reads agentmesh_security_refused_total{reason}.
func refusedTotal(t *testing.T, m *telemetry.Metrics, reason string) float64 {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "agentmesh_security_refused_total" {
			continue
		}
		for _, s := range f.Metric {
			for _, lp := range s.Label {
				if lp.GetName() == "reason" && lp.GetValue() == reason {
					return s.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// ---- S26: hostile JSON and frames ----
