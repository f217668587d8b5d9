// Package ratelimit is a per-key token-bucket rate limiter with a bounded
// number of keys: the hub keeps one bucket per token (or connection, or
// source address) and answers a request over its key's rate with
// OVERLOADED and a retry-after hint.
//
// Memory is bounded by Config.MaxKeys whatever the traffic: keys are kept
// in least-recently-used order, a key idle long enough for its bucket to
// refill completely is dropped (a new bucket for it would be identical),
// and when the map is full the least recently used key is evicted. A flood
// of distinct keys therefore costs at most MaxKeys buckets; it also gives
// each new key a full burst, which is why per-key limits go together with
// a global limit (a Limiter used with one key) in front of them.
package ratelimit

import (
	"container/list"
	"errors"
	"math"
	"sync"
	"time"
)

// Config sets a Limiter's rate.
type Config struct {
	// Rate is the sustained rate per key, in requests per second.
	Rate float64
	// Burst is the bucket size: requests a key may make at once after
	// being idle. At least 1.
	Burst int
	// MaxKeys bounds the number of keys tracked (default 10,000).
	MaxKeys int
	// Now replaces time.Now (tests).
	Now func() time.Time
}

// Limiter is safe for concurrent use.
type Limiter struct {
	rate    float64
	burst   float64
	maxKeys int
	refill  time.Duration // time for an empty bucket to fill
	now     func() time.Time

	mu   sync.Mutex
	keys map[string]*list.Element
	lru  list.List // of *bucket; front = most recently used
}

type bucket struct {
	key    string
	tokens float64
	last   time.Time
}

// New returns a Limiter; it refuses a rate that is not positive and finite
// and a burst below 1.
func New(c Config) (*Limiter, error) {
	if !(c.Rate > 0) || math.IsInf(c.Rate, 0) {
		return nil, errors.New("ratelimit: rate must be positive and finite")
	}
	if c.Burst < 1 {
		return nil, errors.New("ratelimit: burst must be at least 1")
	}
	if c.MaxKeys <= 0 {
		c.MaxKeys = 10_000
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return &Limiter{
		rate:    c.Rate,
		burst:   float64(c.Burst),
		maxKeys: c.MaxKeys,
		refill:  time.Duration(float64(c.Burst) / c.Rate * float64(time.Second)),
		now:     c.Now,
		keys:    make(map[string]*list.Element),
	}, nil
}

// Allow takes one token from key's bucket. When the bucket is empty it
// returns false and how long until a token will be there: the retry-after
// hint for an OVERLOADED answer (at least 1 ms).
func (l *Limiter) Allow(key string) (ok bool, retryAfter time.Duration) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.dropIdle(now)
	var b *bucket
	if e, found := l.keys[key]; found {
		b = e.Value.(*bucket)
		l.lru.MoveToFront(e)
		if el := now.Sub(b.last); el > 0 {
			b.tokens = math.Min(l.burst, b.tokens+el.Seconds()*l.rate)
		}
		if now.After(b.last) {
			b.last = now
		}
	} else {
		if len(l.keys) >= l.maxKeys {
			l.evict(l.lru.Back())
		}
		b = &bucket{key: key, tokens: l.burst, last: now}
		l.keys[key] = l.lru.PushFront(b)
	}
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	wait := time.Duration((1 - b.tokens) / l.rate * float64(time.Second))
	return false, max(wait, time.Millisecond)
}

// dropIdle removes least-recently-used keys whose buckets are full again
// (a couple per call: amortised O(1)).
func (l *Limiter) dropIdle(now time.Time) {
	for range 2 {
		e := l.lru.Back()
		if e == nil || now.Sub(e.Value.(*bucket).last) < l.refill {
			return
		}
		l.evict(e)
	}
}

func (l *Limiter) evict(e *list.Element) {
	delete(l.keys, e.Value.(*bucket).key)
	l.lru.Remove(e)
}

// Len returns the number of keys tracked.
func (l *Limiter) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.keys)
}

// Forget drops key's bucket (when its connection closes, say).
func (l *Limiter) Forget(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.keys[key]; ok {
		l.evict(e)
	}
}
