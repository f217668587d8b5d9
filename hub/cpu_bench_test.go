package hub_test

import (
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/internal/cpustat"
)

// processCPU returns the user + system CPU time this process has used.
func processCPU() time.Duration { return cpustat.Process() }

// processTimes returns the user and the system CPU time this process has
// used.
func processTimes() (user, sys time.Duration) { return cpustat.Times() }

// reportCPU reports the process's CPU time per operation (cpustat.Report).
func reportCPU(b *testing.B) { cpustat.Report(b) }
