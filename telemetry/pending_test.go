package telemetry_test

import (
	"testing"

	"github.com/agentmesh/agentmesh/telemetry"
)

// TestRegisterPending: each side's figure is its own series of
// agentmesh_pending_requests, next to the hub's, read at scrape time.
func TestRegisterPending(t *testing.T) {
	m := telemetry.NewMetrics(nil)
	n := 3
	m.RegisterHubState(func() telemetry.HubState { return telemetry.HubState{Pending: 7} })
	m.RegisterPending("client", func() int { return n })
	m.RegisterPending("agent", func() int { return 2 * n })
	n = 4
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != "agentmesh_pending_requests" {
			continue
		}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "side" {
					got[l.GetValue()] = s.GetGauge().GetValue()
				}
			}
		}
	}
	want := map[string]float64{"hub": 7, "client": 4, "agent": 8}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("pending{side=%q} = %v; want %v (all: %v)", k, got[k], v, got)
		}
	}
	var nilM *telemetry.Metrics
	nilM.RegisterPending("client", func() int { return 1 }) // a nil Metrics ignores it
}
