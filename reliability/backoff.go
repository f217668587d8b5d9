package reliability

import (
	"math/rand/v2"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// jitterFactor is the randomisation of a jittered delay: ±50 %, the
// default of cenkalti/backoff.
const jitterFactor = 0.5

// NewBackOff returns a fresh delay sequence for one call under c: the
// delay before retry 1, 2, …. Fixed and exponential come from
// cenkalti/backoff/v5; linear (initial × n) is ours, since that library
// has none. Every delay is capped at Max, after jitter too.
func (c BackoffConfig) NewBackOff() backoff.BackOff {
	var b backoff.BackOff
	switch c.Strategy {
	case Fixed:
		b = backoff.NewConstantBackOff(c.Initial)
	case Linear:
		b = &linearBackOff{step: c.Initial}
	default:
		eb := &backoff.ExponentialBackOff{
			InitialInterval:     c.Initial,
			RandomizationFactor: 0, // jitter is applied below, after the cap
			Multiplier:          c.Multiplier,
			MaxInterval:         c.Max,
		}
		if eb.Multiplier < 1 {
			eb.Multiplier = 2
		}
		eb.Reset()
		b = eb
	}
	return &capped{b: b, max: c.Max, jitter: c.Jitter}
}

type linearBackOff struct {
	step time.Duration
	n    int
}

func (l *linearBackOff) NextBackOff() time.Duration {
	l.n++
	return l.step * time.Duration(l.n)
}

func (l *linearBackOff) Reset() { l.n = 0 }

type capped struct {
	b      backoff.BackOff
	max    time.Duration
	jitter bool
}

func (c *capped) NextBackOff() time.Duration {
	d := c.b.NextBackOff()
	if d == backoff.Stop {
		return d
	}
	if c.max > 0 && d > c.max {
		d = c.max
	}
	if c.jitter && d > 0 {
		delta := jitterFactor * float64(d)
		d = time.Duration(float64(d) - delta + rand.Float64()*2*delta)
		if c.max > 0 && d > c.max {
			d = c.max
		}
	}
	return d
}

func (c *capped) Reset() { c.b.Reset() }
