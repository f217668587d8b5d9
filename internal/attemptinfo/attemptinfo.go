// Package attemptinfo carries, from a retry loop (reliability) to the
// attempt it sends (telemetry's attempt span), why that attempt is a
// retry and how long the loop waited before it: a context value both
// may read, since neither imports the other.
package attemptinfo

import (
	"context"
	"time"
)

// Info is why an attempt beyond a call's first was sent.
type Info struct {
	Reason  string        // the failed attempt's code in snake case, "not_sent" or "hedge"
	Backoff time.Duration // the wait before it (a hedge: its delay)
}

type key struct{}

// With returns ctx carrying i for the attempt about to be sent.
func With(ctx context.Context, i Info) context.Context { return context.WithValue(ctx, key{}, i) }

// From returns the Info in ctx, if any.
func From(ctx context.Context) (Info, bool) {
	i, ok := ctx.Value(key{}).(Info)
	return i, ok
}
