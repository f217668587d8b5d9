package meshtest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/reliability"
)

func idempotentConfig() reliability.Config {
	rc := reliability.DefaultConfig()
	rc.Policies["weather.*"] = reliability.Policy{Timeout: time.Second, Retries: 3, Idempotent: true,
		Backoff: reliability.BackoffConfig{Strategy: reliability.Fixed, Initial: time.Millisecond}}
	return rc
}

// Example shows how code that uses mesh.Client tests its retry handling
// without sockets.
func Example() {
	tr := meshtest.NewTransport().
		Respond("weather.today", map[string]string{"sky": "clear"}).
		FailTimes("weather.today", 2, envelope.NewError(envelope.CodeUnavailable, "agent restarting"))
	c, _ := mesh.NewClient(nil, mesh.WithTransport(tr.Invoke), mesh.WithReliability(idempotentConfig()))
	defer c.Close()
	var out map[string]string
	err := c.Call(context.Background(), "weather.today", nil, &out)
	fmt.Println(out["sky"], err, tr.Calls("weather.today"))
	// Output: clear <nil> 3
}

func TestTransport(t *testing.T) {
	tr := meshtest.NewTransport().
		Respond("weather.today", "sun").
		Fail("weather.never", envelope.NewError(envelope.CodeRPCError, "no forecast")).
		Respond("weather.slow", "late").Delay("weather.slow", time.Second)
	c := tr.NewClient(t, mesh.WithReliability(idempotentConfig()))
	ctx := t.Context()
	var s string
	if err := c.Call(ctx, "weather.today", nil, &s); err != nil || s != "sun" {
		t.Errorf("weather.today = %q, %v", s, err)
	}
	if err := c.Call(ctx, "weather.never", nil, nil); envelope.CodeOf(err) != envelope.CodeRPCError || tr.Calls("weather.never") != 1 {
		t.Errorf("weather.never = %v after %d calls; want RPC_ERROR, not retried", err, tr.Calls("weather.never"))
	}
	start := time.Now()
	err := c.Call(ctx, "weather.slow", nil, nil, mesh.CallTimeout(50*time.Millisecond))
	if envelope.CodeOf(err) != envelope.CodeTimeout || time.Since(start) > 500*time.Millisecond {
		t.Errorf("weather.slow with a 50ms timeout = %v after %v; want TIMEOUT at once", err, time.Since(start))
	}
	if err := c.Call(ctx, "nobody.home", nil, nil); envelope.CodeOf(err) != envelope.CodeMethodNotFound {
		t.Errorf("unknown method = %v; want METHOD_NOT_FOUND", err)
	}
	reqs := tr.Requests()
	if len(reqs) == 0 || reqs[0].Method != "weather.today" || reqs[0].ID == "" {
		t.Errorf("recorded requests = %+v", reqs)
	}
}
