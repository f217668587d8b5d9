package reliability_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/reliability"
)

// TestBreakersProbeAt: an open breaker says when it turns half-open, and
// Allow admits a probe from that instant on, not before.
func TestBreakersProbeAt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := reliability.NewBreakers(reliability.BreakerConfig{FailureThreshold: 1, RecoveryTimeout: time.Second, SuccessThreshold: 1}, nil)
		k := reliability.BreakerKey{Method: "m", Instance: "i"}
		if _, ok := b.ProbeAt(k); ok {
			t.Fatal("ProbeAt of a breaker never used: ok; want not open")
		}
		done, _ := b.Allow(k)
		done.Done(envelope.NewError(envelope.CodeUnavailable, "down"))
		opened := time.Now()
		at, ok := b.ProbeAt(k)
		if !ok || at.Sub(opened) != time.Second+time.Nanosecond {
			t.Fatalf("ProbeAt = %v, %v; want %v after it opened", at.Sub(opened), ok, time.Second+time.Nanosecond)
		}
		time.Sleep(time.Until(at) - time.Nanosecond)
		if _, err := b.Allow(k); envelope.CodeOf(err) != envelope.CodeCircuitOpen {
			t.Fatalf("Allow a nanosecond before ProbeAt = %v; want CIRCUIT_OPEN", err)
		}
		time.Sleep(time.Nanosecond)
		done, err := b.Allow(k)
		if err != nil {
			t.Fatalf("Allow at ProbeAt = %v; want a probe admitted", err)
		}
		if _, ok := b.ProbeAt(k); ok {
			t.Error("ProbeAt while half-open: ok; want not open")
		}
		done.Done(envelope.NewError(envelope.CodeUnavailable, "still down"))
		if at2, ok := b.ProbeAt(k); !ok || at2.Sub(time.Now()) != time.Second+time.Nanosecond {
			t.Errorf("ProbeAt after a failed probe = %v from now, %v; want a full recovery timeout", at2.Sub(time.Now()), ok)
		}
	})
}

// TestRetryWaitsForProbe: a router that finds every instance behind an
// open breaker answers reliability.CircuitOpen; the retry loop then tries
// again exactly when the first breaker admits a probe, if the call's
// deadline, attempts and budget allow it, and otherwise gives up at once:
// never a backoff (2 s here, longer than the deadline).
func TestRetryWaitsForProbe(t *testing.T) {
	const recovery = time.Second
	policy := func(timeout time.Duration, retries int) *reliability.PolicySet {
		ps, err := reliability.NewPolicySet(reliability.Policy{Timeout: timeout, Retries: retries,
			Backoff: reliability.BackoffConfig{Strategy: reliability.Fixed, Initial: 2 * time.Second}}, nil) // longer than any wait for a probe here
		if err != nil {
			t.Fatal(err)
		}
		return ps
	}
	// route is the hub's attempt in small: two instances, each with its
	// breaker; an open one is skipped; all open: CircuitOpen.
	route := func(b *reliability.Breakers, tries *int) envelope.Invoker {
		return func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
			*tries++
			var probe time.Time
			for _, id := range []string{"a", "b"} {
				k := reliability.BreakerKey{Method: req.Method, Instance: id}
				at, open := b.ProbeAt(k)
				if !open {
					done, err := b.Allow(k)
					if err != nil {
						return nil, err
					}
					done.Done(nil)
					return &envelope.Response{ID: req.ID, Result: []byte(`"` + id + `"`)}, nil
				}
				if probe.IsZero() || at.Before(probe) {
					probe = at
				}
			}
			return nil, reliability.CircuitOpen("every instance open", probe)
		}
	}
	open := func(b *reliability.Breakers, id string) {
		done, err := b.Allow(reliability.BreakerKey{Method: "m", Instance: id})
		if err != nil {
			t.Fatal(err)
		}
		done.Done(envelope.NewError(envelope.CodeUnavailable, "down"))
	}
	cfg := reliability.BreakerConfig{FailureThreshold: 1, RecoveryTimeout: recovery, SuccessThreshold: 1}
	for _, tc := range []struct {
		name      string
		timeout   time.Duration
		retries   int
		wantCode  envelope.Code
		wantTook  time.Duration
		wantTries int
	}{
		// b opens 200 ms before a and before the call: its probe is the
		// first due, 800 ms (and a nanosecond) after the call starts; the
		// wait is rounded up to the millisecond.
		{"probe due before the deadline", 900 * time.Millisecond, 2, envelope.CodeOK, 801 * time.Millisecond, 2},
		{"deadline before the probe", 700 * time.Millisecond, 2, envelope.CodeCircuitOpen, 0, 1},
		{"no retry left", 5 * time.Second, 0, envelope.CodeCircuitOpen, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := reliability.NewBreakers(cfg, nil)
				open(b, "b")
				time.Sleep(200 * time.Millisecond)
				open(b, "a")
				tries := 0
				call := reliability.Retry(policy(tc.timeout, tc.retries), reliability.RetryOptions{})(route(b, &tries))
				start := time.Now()
				res, err := call(t.Context(), &envelope.Request{ID: "1", Method: "m"})
				took := time.Since(start)
				if envelope.CodeOf(err) != tc.wantCode || took != tc.wantTook || tries != tc.wantTries {
					t.Fatalf("call = %v, %v after %v and %d tries; want %s after %v and %d tries", res, err, took, tries, tc.wantCode, tc.wantTook, tc.wantTries)
				}
				if err == nil {
					if string(res.Result) != `"b"` {
						t.Errorf("answered by %s; want b, the first breaker due", res.Result)
					}
					return
				}
				if e := envelope.AsError(err); !e.NotSent() || e.Attempts() != 1 {
					t.Errorf("refusal: not sent %v, attempts %d; want not sent, 1 attempt", e.NotSent(), e.Attempts())
				}
			})
		})
	}
}

// TestCircuitOpenWithoutProbeIsFinal: with no probe time known, the
// refusal carries the attempts mark and the retry loop does not wait.
func TestCircuitOpenWithoutProbeIsFinal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ps, _ := reliability.NewPolicySet(reliability.Policy{Timeout: time.Minute, Retries: 3,
			Backoff: reliability.BackoffConfig{Strategy: reliability.Fixed, Initial: time.Second}}, nil)
		tries := 0
		call := reliability.Retry(ps, reliability.RetryOptions{})(func(context.Context, *envelope.Request) (*envelope.Response, error) {
			tries++
			return nil, reliability.CircuitOpen("every instance open", time.Time{})
		})
		start := time.Now()
		_, err := call(t.Context(), &envelope.Request{ID: "1", Method: "m"})
		if e := envelope.AsError(err); e.Code != envelope.CodeCircuitOpen || !e.NotSent() || e.Attempts() != 1 || tries != 1 || time.Since(start) != 0 {
			t.Errorf("call = %v (attempts %d) after %v and %d tries; want CIRCUIT_OPEN at once, 1 try", err, e.Attempts(), time.Since(start), tries)
		}
	})
}
