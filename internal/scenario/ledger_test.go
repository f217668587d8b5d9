package scenario_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/scenario"
)

// TestHungCallCountsLost: of three calls, one answered, one failed with a
// code and one that never returns, the summary counts the last as lost
// (lost is not 0 by construction), and Drive returns although the call
// still hangs.
func TestHungCallCountsLost(t *testing.T) {
	defer func(d time.Duration) { scenario.HangAfter = d }(scenario.HangAfter)
	scenario.HangAfter = 200 * time.Millisecond
	release := make(chan struct{})
	hungDone := make(chan struct{})
	inv := func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
		var p struct{ I int }
		_ = json.Unmarshal(req.Params, &p)
		switch p.I {
		case 0:
			return &envelope.Response{ID: req.ID, Result: req.Params}, nil
		case 1:
			return nil, envelope.NewError(envelope.CodeUnavailable, "down")
		}
		defer close(hungDone) // one call hangs: i = 2
		<-release
		return nil, envelope.NewError(envelope.CodeCancelled, "released")
	}
	led := scenario.NewLedger()
	start := time.Now()
	sent := scenario.Drive(context.Background(), 100, 30*time.Millisecond, 10, func(ctx context.Context, i int, intended time.Time) {
		led.Call(ctx, inv, "m", true, i, intended)
	})
	took := time.Since(start)
	close(release)
	<-hungDone
	s := led.Summarize("hung", sent)
	if sent != 3 || s.Succeeded != 1 || s.Failed["UNAVAILABLE"] != 1 || s.Lost != 1 {
		t.Errorf("sent %d, summary %+v; want 3 sent, 1 ok, 1 UNAVAILABLE, 1 lost", sent, s)
	}
	if took > 5*time.Second {
		t.Errorf("Drive returned after %v; want soon after HangAfter (200 ms)", took)
	}
}
