package reliability

import "github.com/sony/gobreaker/v2"

// The closed breaker's fast path. While a breaker is closed and counts no
// failure, neither a call's admission nor its success changes anything
// gobreaker decides on: ReadyToTrip reads ConsecutiveFailures only, and no
// Interval clears the counts behind OnStateChange's back (a success only
// resets ConsecutiveFailures, zero already). Such calls skip gobreaker:
// its lock and clock read on either side of the call, and the closure
// its Allow allocates, which on the hub's forward path and in the client
// were a few per cent of the CPU per call (bench profile, c=128). What
// does count, a failure or the first success after one, goes through
// gobreaker, under the breaker's mu, which keeps clean true to its
// counts. A call admitted in one generation whose outcome comes in
// another is dropped, as gobreaker drops it.

// Ticket is a breaker's admission of one call; Done reports the call's
// outcome. The zero Ticket's Done does nothing.
type Ticket struct {
	br   *breaker
	gen  uint64      // fast: the clean generation that admitted it
	done func(error) // gobreaker's, when the call went through it
}

// Done reports the outcome of the call the ticket admitted (nil:
// success). Call it once.
func (t Ticket) Done(err error) {
	br := t.br
	if br == nil {
		return
	}
	if t.done == nil {
		br.fastDone(t.gen, err)
		return
	}
	br.mu.Lock()
	t.done(err)
	if counted(err) {
		br.recheck()
	}
	br.mu.Unlock()
}

// fastDone reports the outcome of a call admitted clean in generation gen.
func (br *breaker) fastDone(gen uint64, err error) {
	if !counted(err) {
		return // excluded: gobreaker would take its request back
	}
	if err == nil && br.clean.Load() == gen {
		br.fastOK.Add(1)
		return // still clean: nothing for gobreaker to count
	}
	br.mu.Lock()
	defer br.mu.Unlock()
	if br.gen.Load() != gen {
		return // another generation: gobreaker would drop it
	}
	// Closed still, this generation: a failure, or a success after one.
	// The call joins gobreaker's counts as if it had gone through it
	// (a closed breaker admits every call).
	br.clean.Store(0)
	if done, aerr := br.cb.Allow(); aerr == nil {
		done(err)
	}
	br.recheck()
}

// recheck, under mu after an outcome reached gobreaker, makes the
// breaker clean again if it is closed and counts no failure.
func (br *breaker) recheck() {
	if br.cb.State() != gobreaker.StateClosed || br.cb.Counts().ConsecutiveFailures != 0 {
		br.clean.Store(0)
		return
	}
	// Closed stays closed under mu (only an outcome, reported under mu,
	// takes it elsewhere), so gen is the closed generation.
	br.clean.Store(br.gen.Load())
}

// transition, under gobreaker's lock (OnStateChange), starts a new
// generation: clean if it is closed (its counts start at zero).
func (br *breaker) transition(to gobreaker.State) {
	g := br.gen.Add(1)
	br.fastOK.Store(0)
	if to == gobreaker.StateClosed {
		br.clean.Store(g)
	} else {
		br.clean.Store(0)
	}
}
