package reliability_test

import (
	"context"
	"errors"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/deadline"
	"github.com/agentmesh/agentmesh/reliability"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestPolicySetMostSpecificWins(t *testing.T) {
	ps, err := reliability.NewPolicySet(reliability.Policy{Timeout: time.Second}, map[string]reliability.Policy{
		"memory.*":     {Timeout: 2 * time.Second},
		"memory.get":   {Timeout: 3 * time.Second},
		"memory.big.*": {Timeout: 4 * time.Second},
		"*":            {Timeout: 5 * time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	for method, want := range map[string]time.Duration{
		"memory.get": 3 * time.Second, "memory.put": 2 * time.Second, "memory.big.x": 4 * time.Second,
		"other.thing": 5 * time.Second, "memoryx": 5 * time.Second,
	} {
		if got := ps.For(method).Timeout; got != want {
			t.Errorf("For(%q).Timeout = %v; want %v", method, got, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { ps.For("memory.big.x") }); n != 0 {
		t.Errorf("For allocates %v times; want 0", n)
	}
}

func TestSeedDefaults(t *testing.T) {
	ps := reliability.DefaultPolicySet()
	cases := []struct {
		method  string
		timeout time.Duration
		retries int
		strat   reliability.Strategy
	}{
		{"agent.x", 5 * time.Second, 3, reliability.Linear},
		{"memory.get", 2500 * time.Millisecond, 2, reliability.Exponential},
		{"llm_chat.complete", 30 * time.Second, 1, reliability.Fixed},
		{"media_gen.image", 60 * time.Second, 0, reliability.Fixed},
		{"echo.echo", 10 * time.Second, 2, reliability.Exponential},
	}
	for _, tc := range cases {
		p := ps.For(tc.method)
		if p.Timeout != tc.timeout || p.Retries != tc.retries || p.Backoff.Strategy != tc.strat {
			t.Errorf("For(%s) = %v/%d/%s; want %v/%d/%s", tc.method, p.Timeout, p.Retries, p.Backoff.Strategy, tc.timeout, tc.retries, tc.strat)
		}
	}
}

func TestPolicyValidationNamesTheKey(t *testing.T) {
	cases := []struct {
		name string
		p    reliability.Policy
		key  string
	}{
		{"retries", reliability.Policy{Retries: -1}, "policies.x.*.retries"},
		{"strategy", reliability.Policy{Backoff: reliability.BackoffConfig{Strategy: "wild"}}, "policies.x.*.backoff.strategy"},
		{"max below initial", reliability.Policy{Backoff: reliability.BackoffConfig{Initial: time.Second, Max: time.Millisecond}}, "policies.x.*.backoff.max"},
		{"retryOn", reliability.Policy{RetryOn: []string{"SOMETIMES"}}, "policies.x.*.retryOn"},
		{"hedge without idempotent", reliability.Policy{HedgeAfter: time.Millisecond}, "policies.x.*.hedgeAfter"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := reliability.NewPolicySet(reliability.DefaultPolicy(), map[string]reliability.Policy{"x.*": tc.p})
			if err == nil || !strings.Contains(err.Error(), tc.key) {
				t.Errorf("error = %v; want one naming %s", err, tc.key)
			}
		})
	}
	if _, err := reliability.NewPolicySet(reliability.DefaultPolicy(), map[string]reliability.Policy{"x*": {}}); err == nil {
		t.Error(`pattern "x*" accepted; want an error`)
	}
}

func TestBackoffSequences(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		name string
		cfg  reliability.BackoffConfig
		want []time.Duration
	}{
		{"fixed", reliability.BackoffConfig{Strategy: reliability.Fixed, Initial: 5 * ms, Max: 5 * ms}, []time.Duration{5 * ms, 5 * ms, 5 * ms}},
		{"linear", reliability.BackoffConfig{Strategy: reliability.Linear, Initial: 100 * ms, Max: 250 * ms}, []time.Duration{100 * ms, 200 * ms, 250 * ms, 250 * ms}},
		{"exponential", reliability.BackoffConfig{Strategy: reliability.Exponential, Initial: 10 * ms, Max: 100 * ms, Multiplier: 3}, []time.Duration{10 * ms, 30 * ms, 90 * ms, 100 * ms}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.cfg.NewBackOff()
			for i, want := range tc.want {
				if got := b.NextBackOff(); got != want {
					t.Errorf("delay %d = %v; want %v", i+1, got, want)
				}
			}
		})
	}
	t.Run("jitter stays within ±50% and the cap", func(t *testing.T) {
		cfg := reliability.BackoffConfig{Strategy: reliability.Linear, Initial: 100 * ms, Max: 150 * ms, Jitter: true}
		for range 200 {
			b := cfg.NewBackOff()
			if d := b.NextBackOff(); d < 50*ms || d > 150*ms {
				t.Fatalf("jittered first delay %v outside [50ms, 150ms]", d)
			}
		}
	})
}

func TestBudget(t *testing.T) {
	b := reliability.NewBudget(reliability.BudgetConfig{Ratio: 0.2, MinPerSecond: 1, Window: 10 * time.Second})
	for range 100 {
		b.Request("m")
	}
	allowed := 0
	for range 100 {
		if b.TryRetry("m") {
			allowed++
		}
	}
	if want := 20 + 10; allowed != want {
		t.Errorf("retries allowed after 100 requests = %d; want %d (20%% + 1/s floor × 10s)", allowed, want)
	}
	if !b.TryRetry("other") {
		t.Error("another method's floor was used up by m")
	}
}

func TestBreakerStateMachine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := reliability.NewBreakers(reliability.BreakerConfig{FailureThreshold: 5, RecoveryTimeout: 30 * time.Second, SuccessThreshold: 3}, nil)
		k := reliability.BreakerKey{Method: "m"}
		fail := envelope.NewError(envelope.CodeUnavailable, "down")
		for range 5 {
			done, err := b.Allow(k)
			if err != nil {
				t.Fatalf("Allow while closed: %v", err)
			}
			done.Done(fail)
		}
		if _, err := b.Allow(k); envelope.CodeOf(err) != envelope.CodeCircuitOpen {
			t.Fatalf("6th call: %v; want CIRCUIT_OPEN", err)
		}
		if !b.IsOpen(k) {
			t.Error("IsOpen = false after the threshold")
		}
		time.Sleep(30*time.Second + time.Millisecond)
		// Half-open: three probes, a fourth is refused.
		var dones []reliability.Ticket
		for range 3 {
			done, err := b.Allow(k)
			if err != nil {
				t.Fatalf("probe refused: %v", err)
			}
			dones = append(dones, done)
		}
		if _, err := b.Allow(k); envelope.CodeOf(err) != envelope.CodeCircuitOpen {
			t.Errorf("4th concurrent probe: %v; want CIRCUIT_OPEN", err)
		}
		for _, d := range dones {
			d.Done(nil)
		}
		if got := b.List()[0].State; got != "closed" {
			t.Errorf("after 3 successful probes the state is %s; want closed", got)
		}
		// Caller errors count neither way.
		for range 10 {
			done, _ := b.Allow(k)
			done.Done(envelope.NewError(envelope.CodeInvalidParams, "bad"))
		}
		if b.IsOpen(k) {
			t.Error("INVALID_PARAMS opened the breaker")
		}
	})
}

func TestBulkheadLimitsAndPriorities(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := reliability.NewBulkhead(reliability.BulkheadConfig{MaxConcurrent: 2, QueueSize: 2, QueueTimeout: time.Second})
		ctx := context.Background()
		var releases []func()
		for range 2 {
			r, err := b.Acquire(ctx, reliability.PriorityNormal)
			if err != nil {
				t.Fatal(err)
			}
			releases = append(releases, r)
		}
		type outcome struct {
			p   reliability.Priority
			err error
		}
		results := make(chan outcome, 10)
		acquire := func(p reliability.Priority) {
			go func() {
				r, err := b.Acquire(ctx, p)
				if err == nil {
					defer r()
				}
				results <- outcome{p, err}
			}()
			synctest.Wait()
		}
		acquire(reliability.PriorityLow)
		acquire(reliability.PriorityNormal)
		// Queue full: a critical call sheds the low one.
		acquire(reliability.PriorityCritical)
		if o := <-results; o.p != reliability.PriorityLow || envelope.CodeOf(o.err) != envelope.CodeOverloaded {
			t.Fatalf("first outcome = %+v; want the low call shed with OVERLOADED", o)
		}
		// Queue full of normal+critical: another low call is refused at once.
		r, err := b.Acquire(ctx, reliability.PriorityLow)
		if envelope.CodeOf(err) != envelope.CodeOverloaded || r != nil {
			t.Fatalf("low call on a full queue: %v; want OVERLOADED", err)
		}
		// A slot frees: the critical call goes first.
		releases[0]()
		if o := <-results; o.p != reliability.PriorityCritical || o.err != nil {
			t.Fatalf("admitted first = %+v; want the critical call", o)
		}
		if o := <-results; o.p != reliability.PriorityNormal || o.err != nil {
			t.Fatalf("admitted next = %+v; want the normal call", o)
		}
		// Queue timeout: fill the pool again, then queue two calls.
		held, err := b.Acquire(ctx, reliability.PriorityNormal)
		if err != nil {
			t.Fatal(err)
		}
		acquire(reliability.PriorityNormal)
		acquire(reliability.PriorityNormal)
		time.Sleep(time.Second + time.Millisecond)
		for range 2 {
			if o := <-results; envelope.CodeOf(o.err) != envelope.CodeOverloaded {
				t.Errorf("queued past queueTimeout: %+v; want OVERLOADED", o)
			}
		}
		releases[1]()
		held()
		if run, q := b.Active(); run != 0 || q != 0 {
			t.Errorf("Active = %d running, %d queued; want 0, 0", run, q)
		}
		if b.Rejected() != 4 {
			t.Errorf("Rejected = %d; want 4", b.Rejected())
		}
	})
}

// scripted answers attempt n with errs[n] (nil: success) and counts calls.
type scripted struct {
	mu    sync.Mutex
	errs  []error
	calls int
	seen  []int // retryCount per call
}

func (s *scripted) invoke(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
	s.mu.Lock()
	n := s.calls
	s.calls++
	s.seen = append(s.seen, req.Headers.RetryCount)
	s.mu.Unlock()
	if n < len(s.errs) && s.errs[n] != nil {
		return nil, s.errs[n]
	}
	return &envelope.Response{ID: req.ID, Result: []byte("1")}, nil
}

func TestRetryDecisions(t *testing.T) {
	unavail := func() error { return envelope.NewError(envelope.CodeUnavailable, "down") }
	notSent := func() error { return envelope.NewError(envelope.CodeUnavailable, "no link").MarkNotSent() }
	cases := []struct {
		name       string
		idempotent bool
		errs       []error
		wantCalls  int
		wantErr    envelope.Code
		notSent    bool // the final error says no attempt reached a handler
	}{
		{"idempotent retried until success", true, []error{unavail(), unavail()}, 3, envelope.CodeOK, false},
		{"not idempotent not retried", false, []error{unavail()}, 1, envelope.CodeUnavailable, false},
		{"not sent retried even if not idempotent", false, []error{notSent(), notSent()}, 3, envelope.CodeOK, false},
		{"invalid params never retried", true, []error{envelope.NewError(envelope.CodeInvalidParams, "x")}, 1, envelope.CodeInvalidParams, false},
		{"rpc error never retried", true, []error{envelope.NewError(envelope.CodeRPCError, "x")}, 1, envelope.CodeRPCError, false},
		{"attempts exhausted", true, []error{unavail(), unavail(), unavail(), unavail()}, 4, envelope.CodeUnavailable, false},
		{"final downstream not retried", true, []error{envelope.NewError(envelope.CodeUnavailable, "x").WithAttempts(3)}, 1, envelope.CodeUnavailable, false},
		{"every attempt not sent: not sent", true, []error{notSent(), notSent(), notSent(), notSent()}, 4, envelope.CodeUnavailable, true},
		// An earlier attempt may have run: the call as a whole is not
		// "not sent", though its last attempt was (a false "not sent"
		// would let a caller retry a call that ran).
		{"sent once, then not sent: maybe sent", true, []error{unavail(), notSent(), notSent(), notSent()}, 4, envelope.CodeUnavailable, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ps, _ := reliability.NewPolicySet(reliability.Policy{Timeout: time.Minute, Retries: 3, Idempotent: tc.idempotent,
					Backoff: reliability.BackoffConfig{Strategy: reliability.Fixed, Initial: 10 * time.Millisecond}}, nil)
				s := &scripted{errs: tc.errs}
				inv := reliability.Retry(ps, reliability.RetryOptions{})(s.invoke)
				res, err := inv(context.Background(), &envelope.Request{Method: "m"})
				if envelope.CodeOf(err) != tc.wantErr {
					t.Fatalf("error = %v; want %s", err, tc.wantErr)
				}
				if s.calls != tc.wantCalls {
					t.Errorf("calls = %d; want %d", s.calls, tc.wantCalls)
				}
				if err != nil && envelope.AsError(err).NotSent() != tc.notSent {
					t.Errorf("final error not sent = %v; want %v", envelope.AsError(err).NotSent(), tc.notSent)
				}
				for i, rc := range s.seen {
					if rc != i {
						t.Errorf("attempt %d carried retryCount %d", i, rc)
					}
				}
				if err == nil && res.Metrics.Retries != tc.wantCalls-1 {
					t.Errorf("metrics.retries = %d; want %d", res.Metrics.Retries, tc.wantCalls-1)
				}
				var e *envelope.Error
				if errors.As(err, &e) && e.Attempts() != tc.wantCalls && tc.name != "final downstream not retried" {
					t.Errorf("error attempts = %d; want %d", e.Attempts(), tc.wantCalls)
				}
				// The loop in parts (the hub's forward path): the first
				// attempt made outside it, then Settle or Resume, ends
				// the same way.
				s2 := &scripted{errs: tc.errs}
				p := ps.For("m")
				o := reliability.RetryOptions{}
				req := &envelope.Request{Method: "m"}
				o.Begin("m", time.Now())
				res2, err2 := s2.invoke(context.Background(), req)
				if err2 != nil {
					if first := envelope.AsError(err2); !reliability.Retries(p, first) {
						err2 = o.Settle(p, "m", first)
					} else {
						ctx, cancel := context.WithTimeout(context.Background(), p.Timeout)
						res2, err2 = o.Resume(ctx, req, p, s2.invoke, time.Now(), first)
						cancel()
					}
				}
				if s2.calls != s.calls || envelope.CodeOf(err2) != envelope.CodeOf(err) {
					t.Errorf("in parts: %d calls, %v; the loop: %d calls, %v", s2.calls, err2, s.calls, err)
				}
				if err != nil && (envelope.AsError(err2).NotSent() != envelope.AsError(err).NotSent() || envelope.AsError(err2).Attempts() != envelope.AsError(err).Attempts()) {
					t.Errorf("in parts: %v (not sent %v, attempts %d); the loop: %v (not sent %v, attempts %d)", err2, envelope.AsError(err2).NotSent(),
						envelope.AsError(err2).Attempts(), err, envelope.AsError(err).NotSent(), envelope.AsError(err).Attempts())
				}
				if err == nil && res2.Metrics.Retries != res.Metrics.Retries {
					t.Errorf("in parts: metrics.retries %d; the loop: %d", res2.Metrics.Retries, res.Metrics.Retries)
				}
			})
		})
	}
}

func TestRetryDeadlineDuringBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ps, _ := reliability.NewPolicySet(reliability.Policy{Timeout: time.Minute, Retries: 3, Idempotent: true,
			Backoff: reliability.BackoffConfig{Strategy: reliability.Fixed, Initial: time.Second}}, nil)
		var calls atomic.Int32
		inv := reliability.Retry(ps, reliability.RetryOptions{})(func(ctx context.Context, r *envelope.Request) (*envelope.Response, error) {
			calls.Add(1)
			return nil, envelope.NewError(envelope.CodeUnavailable, "down")
		})
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		defer cancel()
		_, err := inv(ctx, &envelope.Request{Method: "m"})
		// 2nd attempt at 1s; the 3rd would start at 2s, after the deadline:
		// the loop does not wait for it.
		if envelope.CodeOf(err) != envelope.CodeUnavailable || calls.Load() != 2 {
			t.Errorf("err = %v after %d calls; want UNAVAILABLE after 2 (no wait past the deadline)", err, calls.Load())
		}
	})
}

func TestRetryBudgetBoundsAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ps, _ := reliability.NewPolicySet(reliability.Policy{Timeout: time.Minute, Retries: 3, Idempotent: true,
			Backoff: reliability.BackoffConfig{Strategy: reliability.Fixed}}, nil)
		budget := reliability.NewBudget(reliability.BudgetConfig{Ratio: 0.2, MinPerSecond: 1, Window: 10 * time.Second})
		var calls atomic.Int32
		var budgetRefusals atomic.Int32
		inv := reliability.Retry(ps, reliability.RetryOptions{Budget: budget, OnSkip: func(_, reason string) {
			if reason == "budget" {
				budgetRefusals.Add(1)
			}
		}})(func(ctx context.Context, r *envelope.Request) (*envelope.Response, error) {
			calls.Add(1)
			return nil, envelope.NewError(envelope.CodeUnavailable, "down")
		})
		for range 100 {
			_, _ = inv(context.Background(), &envelope.Request{Method: "m"})
		}
		// Without a budget: 400 attempts. With it: 100 + at most 20 + 10.
		if got := calls.Load(); got > 130 {
			t.Errorf("attempts = %d for 100 requests; want at most 130 under the budget", got)
		}
		if budgetRefusals.Load() == 0 {
			t.Error("no retry was refused by the budget")
		}
	})
}

func TestRetryDeadlineAware(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ps, _ := reliability.NewPolicySet(reliability.Policy{Timeout: time.Minute, Retries: 3, Idempotent: true,
			Backoff: reliability.BackoffConfig{Strategy: reliability.Fixed, Initial: time.Millisecond}}, nil)
		lat := reliability.NewLatency()
		for range 20 {
			lat.Observe("m", 500*time.Millisecond)
		}
		var calls atomic.Int32
		inv := reliability.Retry(ps, reliability.RetryOptions{Latency: lat})(func(ctx context.Context, r *envelope.Request) (*envelope.Response, error) {
			calls.Add(1)
			time.Sleep(200 * time.Millisecond)
			return nil, envelope.NewError(envelope.CodeUnavailable, "down")
		})
		ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
		defer cancel()
		_, err := inv(ctx, &envelope.Request{Method: "m"})
		// After the first attempt 400ms are left, less than the 500ms p90.
		if calls.Load() != 1 || envelope.CodeOf(err) != envelope.CodeUnavailable {
			t.Errorf("%d calls, err %v; want 1 call and no retry that could not finish", calls.Load(), err)
		}
	})
}

func TestHedging(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ps, _ := reliability.NewPolicySet(reliability.Policy{Timeout: time.Minute, Retries: 1, Idempotent: true, HedgeAfter: 50 * time.Millisecond}, nil)
		var cancelled atomic.Int32
		inv := reliability.Retry(ps, reliability.RetryOptions{UseTried: true})(func(ctx context.Context, r *envelope.Request) (*envelope.Response, error) {
			tr := reliability.TriedFrom(ctx)
			if r.Headers.RetryCount == 0 {
				tr.Add("slow")
				select { // the slow instance
				case <-time.After(time.Second):
					return &envelope.Response{Result: []byte(`"slow"`)}, nil
				case <-ctx.Done():
					cancelled.Add(1)
					return nil, ctx.Err()
				}
			}
			if !tr.Has("slow") {
				t.Error("the hedge does not know which instance the first attempt took")
			}
			time.Sleep(10 * time.Millisecond)
			return &envelope.Response{Result: []byte(`"fast"`)}, nil
		})
		start := time.Now()
		res, err := inv(context.Background(), &envelope.Request{Method: "m"})
		if err != nil || string(res.Result) != `"fast"` {
			t.Fatalf("hedged call = %v, %v; want the hedge's answer", res, err)
		}
		if d := time.Since(start); d != 60*time.Millisecond {
			t.Errorf("hedged call took %v; want 50ms + 10ms", d)
		}
		if cancelled.Load() != 1 {
			t.Error("the losing attempt was not cancelled")
		}
	})
}

func TestRetryHonoursPushback(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ps, _ := reliability.NewPolicySet(reliability.Policy{Timeout: time.Minute, Retries: 2, Idempotent: true,
			Backoff: reliability.BackoffConfig{Strategy: reliability.Fixed, Initial: time.Millisecond}}, nil)
		var at []time.Time
		inv := reliability.Retry(ps, reliability.RetryOptions{})(func(ctx context.Context, r *envelope.Request) (*envelope.Response, error) {
			at = append(at, time.Now())
			if len(at) == 1 {
				return nil, envelope.NewError(envelope.CodeOverloaded, "slow down").WithData(map[string]int{"retryAfterMs": 250})
			}
			return &envelope.Response{}, nil
		})
		if _, err := inv(context.Background(), &envelope.Request{Method: "m"}); err != nil {
			t.Fatal(err)
		}
		if len(at) != 2 || at[1].Sub(at[0]) != 250*time.Millisecond {
			t.Errorf("attempts at %v; want the retry 250ms after the pushback, not the 1ms backoff", at)
		}
	})
}

// TestRetryReasons: OnRetry hears of each attempt sent beyond the first,
// with the failed attempt's code in snake case, and only once it is sent
// (not a retry whose backoff the deadline cut); OnSkip hears of a failure
// a retry could have helped and none was made, never of a code no retry
// helps (METHOD_NOT_FOUND) or of a non-retryable call.
func TestRetryReasons(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type ev struct{ kind, reason string }
		run := func(p reliability.Policy, errs []error, timeout time.Duration) []ev {
			ps, _ := reliability.NewPolicySet(p, nil)
			var got []ev
			var n int
			inv := reliability.Retry(ps, reliability.RetryOptions{
				OnRetry: func(_, r string) { got = append(got, ev{"retry", r}) },
				OnSkip:  func(_, r string) { got = append(got, ev{"skip", r}) },
			})(func(ctx context.Context, r *envelope.Request) (*envelope.Response, error) {
				e := errs[min(n, len(errs)-1)]
				n++
				if e == nil {
					return &envelope.Response{}, nil
				}
				return nil, e
			})
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			_, _ = inv(ctx, &envelope.Request{Method: "m"})
			return got
		}
		fixed := reliability.BackoffConfig{Strategy: reliability.Fixed, Initial: time.Second}
		idem := reliability.Policy{Retries: 2, Idempotent: true, Backoff: fixed}
		unavailable := envelope.NewError(envelope.CodeUnavailable, "down")
		for _, tc := range []struct {
			name    string
			p       reliability.Policy
			errs    []error
			timeout time.Duration
			want    []ev
		}{
			{"retried then ok", idem, []error{unavailable, nil}, time.Minute, []ev{{"retry", "unavailable"}}},
			{"attempts exhausted", idem, []error{unavailable}, time.Minute, []ev{{"retry", "unavailable"}, {"retry", "unavailable"}, {"skip", "attempts_exhausted"}}},
			{"method not found: nothing", idem, []error{envelope.NewError(envelope.CodeMethodNotFound, "no")}, time.Minute, nil},
			{"not idempotent", reliability.Policy{Retries: 2, Backoff: fixed}, []error{unavailable}, time.Minute, []ev{{"skip", "not_idempotent"}}},
			{"not sent is retried anyway", reliability.Policy{Retries: 2, Backoff: fixed}, []error{envelope.NewError(envelope.CodeUnavailable, "x").MarkNotSent(), nil}, time.Minute, []ev{{"retry", "not_sent"}}},
			{"no retries configured: nothing", reliability.Policy{Idempotent: true}, []error{unavailable}, time.Minute, nil},
			{"deadline before the backoff", idem, []error{unavailable}, 500 * time.Millisecond, []ev{{"skip", "deadline"}}},
		} {
			if got := run(tc.p, tc.errs, tc.timeout); !slices.Equal(got, tc.want) {
				t.Errorf("%s: %v; want %v", tc.name, got, tc.want)
			}
		}
	})
}

// TestBulkheadWaiters: a call queued with no goroutine (Waiter.Init,
// Enqueue) gets the verdicts Acquire gives, through its admit func:
// admitted highest priority first and FIFO within one, shed by a higher
// call on a full queue, OVERLOADED after the queue timeout, TIMEOUT at its
// deadline when that comes first; Withdraw takes it back. Waiters and
// Acquire's blocked callers share one queue.
func TestBulkheadWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := reliability.NewBulkhead(reliability.BulkheadConfig{MaxConcurrent: 1, QueueSize: 3, QueueTimeout: time.Second})
		held, ok := b.TryAcquire()
		if !ok {
			t.Fatal("TryAcquire on an empty pool failed")
		}
		var mu sync.Mutex // the queue timer's goroutine writes too
		var order []string
		verdicts := map[string]envelope.Code{}
		seen := func() ([]string, map[string]envelope.Code) {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(order), maps.Clone(verdicts)
		}
		waiter := func(name string, p reliability.Priority, deadline time.Time) *reliability.Waiter {
			var w *reliability.Waiter
			w = newWaiter(b, p, func(release func(), err *envelope.Error) {
				mu.Lock()
				order = append(order, name)
				verdicts[name] = codeOf(err)
				mu.Unlock()
				if release != nil {
					release() // done at once: the next admission runs in the releaser's loop
				}
			})
			if release, err := b.Enqueue(w, deadline); release != nil || err != nil {
				t.Fatalf("%s: Enqueue on a full pool = %v, %v; want it queued", name, release != nil, err)
			}
			return w
		}
		waiter("low", reliability.PriorityLow, time.Time{})
		waiter("normal-1", reliability.PriorityNormal, time.Time{})
		gone := waiter("normal-2", reliability.PriorityNormal, time.Time{})
		if !gone.Withdraw() || gone.Withdraw() {
			t.Fatal("Withdraw of a queued waiter: want true once, then false")
		}
		waiter("normal-3", reliability.PriorityNormal, time.Time{})
		// Full: a high call sheds the low one, whose admit hears it at once.
		waiter("high", reliability.PriorityHigh, time.Time{})
		if order, verdicts := seen(); len(order) != 1 || order[0] != "low" || verdicts["low"] != envelope.CodeOverloaded {
			t.Fatalf("after the high call: %v %v; want the low call shed with OVERLOADED", order, verdicts)
		}
		// A full queue of normal and high refuses another normal at once.
		w := newWaiter(b, reliability.PriorityNormal, func(func(), *envelope.Error) { t.Error("refused waiter admitted") })
		if release, err := b.Enqueue(w, time.Time{}); release != nil || codeOf(err) != envelope.CodeOverloaded {
			t.Fatalf("Enqueue on a full queue = %v, %v; want OVERLOADED", release != nil, err)
		}
		// A blocked critical Acquire sheds the newest normal waiter.
		acquired := make(chan error, 1)
		go func() {
			r, err := b.Acquire(context.Background(), reliability.PriorityCritical)
			if err == nil {
				r()
			}
			acquired <- err
		}()
		synctest.Wait()
		if order, verdicts := seen(); len(order) != 2 || order[1] != "normal-3" || verdicts["normal-3"] != envelope.CodeOverloaded {
			t.Fatalf("after the critical Acquire: %v %v; want normal-3 shed with OVERLOADED", order, verdicts)
		}
		held()
		if err := <-acquired; err != nil {
			t.Errorf("the critical Acquire: %v", err)
		}
		synctest.Wait()
		if order, verdicts := seen(); !slices.Equal(order, []string{"low", "normal-3", "high", "normal-1"}) ||
			verdicts["high"] != envelope.CodeOK || verdicts["normal-1"] != envelope.CodeOK {
			t.Errorf("verdicts %v %v; want low and normal-3 shed, then high and normal-1 admitted", order, verdicts)
		}

		// Timeouts: the queue's, and a deadline that comes first.
		held, _ = b.TryAcquire()
		mu.Lock()
		order, verdicts = nil, map[string]envelope.Code{}
		mu.Unlock()
		waiter("queue-timeout", reliability.PriorityNormal, time.Time{})
		waiter("deadline", reliability.PriorityNormal, time.Now().Add(100*time.Millisecond))
		time.Sleep(150 * time.Millisecond)
		synctest.Wait()
		if order, verdicts := seen(); !slices.Equal(order, []string{"deadline"}) || verdicts["deadline"] != envelope.CodeTimeout {
			t.Errorf("at 150 ms: %v %v; want the deadline's TIMEOUT alone", order, verdicts)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if _, verdicts := seen(); verdicts["queue-timeout"] != envelope.CodeOverloaded {
			t.Errorf("after the queue timeout: %v; want OVERLOADED", verdicts)
		}
		held()

		// The pool's one timer, armed for a call admitted before its
		// queue timeout, finds nothing due and re-arms for the next.
		held, _ = b.TryAcquire()
		mu.Lock()
		order, verdicts = nil, map[string]envelope.Code{}
		mu.Unlock()
		waiter("early", reliability.PriorityNormal, time.Time{})
		time.Sleep(500 * time.Millisecond)
		held() // early is admitted (and releases at once)
		held, _ = b.TryAcquire()
		waiter("late", reliability.PriorityNormal, time.Time{}) // its timeout: 1.5 s
		time.Sleep(700 * time.Millisecond)                      // 1.2 s: the stale timer has fired
		synctest.Wait()
		if order, verdicts := seen(); !slices.Equal(order, []string{"early"}) || verdicts["early"] != envelope.CodeOK {
			t.Errorf("at 1.2 s: %v %v; want early admitted, late still queued", order, verdicts)
		}
		time.Sleep(301 * time.Millisecond)
		synctest.Wait()
		if _, verdicts := seen(); verdicts["late"] != envelope.CodeOverloaded {
			t.Errorf("at 1.5 s: %v; want late's queue timeout", verdicts)
		}
		held()
		if run, q := b.Active(); run != 0 || q != 0 {
			t.Errorf("Active = %d running, %d queued; want 0, 0", run, q)
		}
	})
}

// TestBulkheadHandoffIsALoop: a thousand queued waiters, each done as soon
// as it is admitted, are admitted one after the other in a loop, never
// one stack frame deeper than the last; the release that freed the first
// slot makes at most maxHandoff (64) of those admissions itself, and
// hands the rest to goroutines of the pool's, 64 each.
func TestBulkheadHandoffIsALoop(t *testing.T) {
	b := reliability.NewBulkhead(reliability.BulkheadConfig{MaxConcurrent: 1, QueueSize: 1000})
	held, _ := b.TryAcquire()
	var mu sync.Mutex
	var depths []int
	var wg sync.WaitGroup
	for range 1000 {
		wg.Add(1)
		w := newWaiter(b, reliability.PriorityNormal, func(release func(), err *envelope.Error) {
			defer wg.Done()
			if err != nil {
				t.Errorf("admit: %v", err)
				return
			}
			mu.Lock()
			depths = append(depths, runtime.Callers(0, make([]uintptr, 256)))
			mu.Unlock()
			release()
		})
		if release, err := b.Enqueue(w, time.Time{}); release != nil || err != nil {
			t.Fatalf("Enqueue = %v, %v; want it queued", release != nil, err)
		}
	}
	held()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(depths) != 1000 {
		t.Fatalf("%d admitted; want 1000", len(depths))
	}
	if slices.Max(depths) != depths[0] {
		t.Errorf("stack depths from %d to %d: admissions nest", depths[0], slices.Max(depths))
	}
	// The releaser's stack (the test, release, handOff) is deeper than a
	// handed-off goroutine's (handOff): count the admissions made on it.
	onReleaser := 0
	for _, d := range depths {
		if d == depths[0] {
			onReleaser++
		}
	}
	if onReleaser != 64 {
		t.Errorf("the releasing goroutine made %d admissions; want 64 (maxHandoff)", onReleaser)
	}
	if run, q := b.Active(); run != 0 || q != 0 {
		t.Errorf("Active = %d running, %d queued; want 0, 0", run, q)
	}
}

// codeOf is err's code, OK for none (a nil *envelope.Error is not a nil error).
func codeOf(err *envelope.Error) envelope.Code {
	if err == nil {
		return envelope.CodeOK
	}
	return err.Code
}

// admitFunc is a func as a reliability.Admitter.
type admitFunc func(release func(), err *envelope.Error)

func (f admitFunc) Admitted(release func(), err *envelope.Error) { f(release, err) }

// newWaiter is a Waiter of priority p in b whose verdict goes to f.
func newWaiter(b *reliability.Bulkhead, p reliability.Priority, f func(release func(), err *envelope.Error)) *reliability.Waiter {
	w := new(reliability.Waiter)
	w.Init(b, p, admitFunc(f))
	return w
}

// TestAcquireWaitsOnThePoolTimer: a blocked Acquire waits for its queue
// timeout and its deadline on the pool's one timer, and for a
// deadline.Ctx nothing asked Done of, on its parent alone: its Done is
// never asked for (it stays Lazy). Each wait ends with its own code, at
// its own time, and leaves the queue.
func TestAcquireWaitsOnThePoolTimer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := reliability.NewBulkhead(reliability.BulkheadConfig{MaxConcurrent: 1, QueueSize: 4, QueueTimeout: time.Second})
		held, ok := b.TryAcquire()
		if !ok {
			t.Fatal("TryAcquire on an empty pool failed")
		}
		acquire := func(ctx context.Context) (envelope.Code, time.Duration, func()) {
			start := time.Now()
			release, err := b.Acquire(ctx, reliability.PriorityNormal)
			return codeOf(envelope.AsError(err)), time.Since(start), release
		}
		type out struct {
			code    envelope.Code
			took    time.Duration
			release func()
		}
		run := func(ctx context.Context) chan out {
			ch := make(chan out, 1)
			go func() { c, d, r := acquire(ctx); ch <- out{c, d, r} }()
			synctest.Wait()
			return ch
		}

		dl := deadline.New(context.Background(), time.Now().Add(300*time.Millisecond))
		byDeadline := run(dl)
		first := run(context.Background())
		pctx, cancel := context.WithCancel(context.Background())
		cdl := deadline.New(pctx, time.Now().Add(time.Hour))
		byCancel := run(cdl)
		admitted := run(deadline.New(context.Background(), time.Now().Add(time.Hour)))
		if _, q := b.Active(); q != 4 {
			t.Fatalf("%d queued, want 4", q)
		}

		cancel()
		if o := <-byCancel; o.code != envelope.CodeCancelled || o.took != 0 {
			t.Fatalf("cancelled wait: %s after %v", o.code, o.took)
		}
		if o := <-byDeadline; o.code != envelope.CodeTimeout || o.took != 300*time.Millisecond {
			t.Fatalf("deadline: %s after %v, want TIMEOUT after 300ms", o.code, o.took)
		}
		if _, _, ok := deadline.Lazy(dl); !ok {
			t.Fatal("the wait asked the deadline.Ctx for Done")
		}
		// A release admits the first in the queue, and its release the next.
		held()
		o := <-first
		if o.code != envelope.CodeOK || o.release == nil || o.took != 300*time.Millisecond {
			t.Fatalf("after the release: %s after %v", o.code, o.took)
		}
		o.release()
		o = <-admitted
		if o.code != envelope.CodeOK || o.release == nil {
			t.Fatalf("after the second release: %s", o.code)
		}
		// The queue timeout, on the pool's timer (the slot stays held).
		if o := <-run(context.Background()); o.code != envelope.CodeOverloaded || o.took != time.Second {
			t.Fatalf("queue timeout: %s after %v, want OVERLOADED after 1s", o.code, o.took)
		}
		o.release()
		dl.End()
		cdl.End()
		if _, q := b.Active(); q != 0 {
			t.Fatalf("%d left in the queue", q)
		}
	})
}
