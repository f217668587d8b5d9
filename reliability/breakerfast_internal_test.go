package reliability

import (
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/agentmesh/agentmesh/envelope"
)

// TestBreakerFastPathIsGobreaker drives a breaker of Breakers (with its
// closed-state fast path) and a plain gobreaker two-step breaker with the
// same settings through the same random sequence of admissions, outcomes
// in any order (successes, failures, excluded errors) and clock jumps past
// the recovery timeout: every verdict, state and failure count must be
// the same. It fails if the fast path let a success hide a failure count,
// counted an outcome of an older generation, or admitted where gobreaker
// refuses.
func TestBreakerFastPathIsGobreaker(t *testing.T) {
	for seed := range uint64(40) {
		synctest.Test(t, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, seed*7+1))
			cfg := BreakerConfig{FailureThreshold: uint32(1 + rng.IntN(4)), RecoveryTimeout: time.Second, SuccessThreshold: uint32(1 + rng.IntN(3))}
			b := NewBreakers(cfg, nil)
			ref := gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
				MaxRequests: cfg.SuccessThreshold, Timeout: cfg.RecoveryTimeout,
				ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= cfg.FailureThreshold },
				IsExcluded:  func(err error) bool { return !counted(err) },
			})
			k := BreakerKey{Method: "m", Instance: "i"}
			b.get(k) // made on first use: listed from the start
			type pair struct {
				t    Ticket
				done func(error)
			}
			var out []pair
			fail := envelope.NewError(envelope.CodeUnavailable, "down")
			excluded := envelope.NewError(envelope.CodeInvalidParams, "bad")
			fastUsed := 0
			for step := range 400 {
				switch op := rng.IntN(10); {
				case op < 4: // admit
					tk, err := b.Allow(k)
					done, rerr := ref.Allow()
					if (err == nil) != (rerr == nil) {
						t.Fatalf("seed %d step %d: Allow = %v, gobreaker's = %v", seed, step, err, rerr)
					}
					if err == nil {
						if tk.done == nil {
							fastUsed++
						}
						out = append(out, pair{tk, done})
					}
				case op < 9 && len(out) > 0: // an outcome, of any call in flight
					i := rng.IntN(len(out))
					p := out[i]
					out = append(out[:i], out[i+1:]...)
					var err error
					switch rng.IntN(6) {
					case 0, 1:
						err = fail
					case 2:
						err = excluded
					}
					p.t.Done(err)
					p.done(err)
				default:
					time.Sleep(time.Duration(rng.IntN(1500)) * time.Millisecond)
				}
				got := b.List()[0]
				rc := ref.Counts()
				if got.State != ref.State().String() || got.ConsecutiveFailures != rc.ConsecutiveFailures || got.TotalFailures != rc.TotalFailures {
					t.Fatalf("seed %d step %d: state %s, consecutive failures %d, failures %d; gobreaker: %s, %d, %d",
						seed, step, got.State, got.ConsecutiveFailures, got.TotalFailures, ref.State(), rc.ConsecutiveFailures, rc.TotalFailures)
				}
			}
			if fastUsed == 0 {
				t.Fatalf("seed %d: the fast path admitted nothing", seed)
			}
		})
	}
}

// TestBreakerFastPathConcurrent runs admissions and outcomes from many
// goroutines at once (for the race detector), then checks that a run of
// successes leaves the breaker closed, clean and counting no failure.
func TestBreakerFastPathConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := NewBreakers(BreakerConfig{FailureThreshold: 3, RecoveryTimeout: time.Millisecond, SuccessThreshold: 1}, nil)
		k := BreakerKey{Method: "m"}
		fail := envelope.NewError(envelope.CodeUnavailable, "down")
		done := make(chan struct{})
		for g := range 8 {
			go func() {
				defer func() { done <- struct{}{} }()
				rng := rand.New(rand.NewPCG(uint64(g), 1))
				for range 3000 {
					tk, err := b.Allow(k)
					if err != nil {
						continue
					}
					if rng.IntN(10) == 0 {
						tk.Done(fail)
					} else {
						tk.Done(nil)
					}
				}
			}()
		}
		for range 8 {
			<-done
		}
		time.Sleep(2 * time.Millisecond) // past the recovery timeout, if it ended open
		for range 3 {
			if tk, err := b.Allow(k); err == nil {
				tk.Done(nil)
			}
		}
		got := b.List()[0]
		if got.State != "closed" || got.ConsecutiveFailures != 0 {
			t.Fatalf("after successes: state %s, consecutive failures %d; want closed, 0", got.State, got.ConsecutiveFailures)
		}
		if br, _ := b.m.Load(k); br.clean.Load() == 0 {
			t.Fatal("closed with no failure counted, but not clean: the fast path stays off")
		}
	})
}
