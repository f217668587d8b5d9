// Package mono is the process's monotonic clock as nanoseconds: one clock
// read per Now (time.Since of a time taken at start), where time.Now
// makes two (the wall clock too). For hot paths that only compare times
// with each other, and keep them in atomics.
package mono

import "time"

// epoch is what Now counts from.
var epoch = time.Now()

// Now is the monotonic clock, in nanoseconds since the process started.
func Now() int64 { return int64(time.Since(epoch)) }

// Of is t on the same clock (t's monotonic reading when it has one).
func Of(t time.Time) int64 { return int64(t.Sub(epoch)) }

// Time is n as a time.Time.
func Time(n int64) time.Time { return epoch.Add(time.Duration(n)) }
