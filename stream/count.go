package stream

import (
	"context"
	"sync"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
)

// Counter is a Sink that counts what passes through it to the sink it
// wraps: chunks, bytes, the time to the first chunk, and the stalls (a
// chunk that used up the credit passed to the producer, which then waits
// for more). For a stream's span and metrics.
type Counter struct {
	inner Sink
	start time.Time

	mu     sync.Mutex
	chunks uint64
	bytes  uint64
	credit uint64 // passed to the producer, in all
	stalls uint64
	first  time.Duration
}

// Count wraps the sink ctx carries in a Counter (nil, and ctx as it is,
// when it carries none).
func Count(ctx context.Context) (context.Context, *Counter) {
	s := From(ctx)
	if s == nil {
		return ctx, nil
	}
	c := &Counter{inner: s, start: time.Now()}
	return With(ctx, c), c
}

// Chunk implements Sink.
func (c *Counter) Chunk(data []byte) *envelope.Error {
	if err := c.inner.Chunk(data); err != nil {
		return err
	}
	c.mu.Lock()
	c.chunks++
	c.bytes += uint64(len(data))
	if c.chunks == 1 {
		c.first = time.Since(c.start)
	}
	if c.chunks == c.credit && c.chunks > 1 { // (a first chunk that used the whole credit is no stall)
		c.stalls++
	}
	c.mu.Unlock()
	return nil
}

// Attach implements Sink.
func (c *Counter) Attach(grant func(Credit)) Credit {
	if grant == nil {
		return c.inner.Attach(nil)
	}
	c.mu.Lock()
	c.credit = c.chunks // a new producer (a retry) starts from here
	c.mu.Unlock()
	n := c.inner.Attach(func(n Credit) {
		c.mu.Lock()
		c.credit += n.Chunks
		c.mu.Unlock()
		grant(n)
	})
	c.mu.Lock()
	c.credit += n.Chunks // grants made meanwhile were added already
	c.mu.Unlock()
	return n
}

// Stats returns the counts so far: chunks, bytes, time to the first
// chunk (zero: none yet), stalls.
func (c *Counter) Stats() (chunks, bytes uint64, first time.Duration, stalls uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.chunks, c.bytes, c.first, c.stalls
}
