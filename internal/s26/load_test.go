package s26

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

// Split sorts calls by the window they touch: a call overlapping a loaded
// window at all counts for it; a quiet call counts as healthy only past
// Settle after the loaded window before it; calls outside the timetable
// count for nothing.
func TestScheduleSplit(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := Schedule{Start: t0, Window: time.Second, Loaded: 2, Control: true}
	// quiet [0,1) hostile [1,2) quiet [2,3) benign [3,4) quiet [4,5)
	at := func(ms int, d time.Duration) Sample {
		return Sample{Start: t0.Add(time.Duration(ms) * time.Millisecond), D: d}
	}
	samples := []Sample{
		at(-10, time.Millisecond),      // before the start: nothing
		at(100, time.Millisecond),      // healthy
		at(999, 2*time.Millisecond),    // straddles into the hostile window: hostile
		at(1500, 3*time.Millisecond),   // hostile
		at(2050, 4*time.Millisecond),   // settling after the hostile window: nothing
		at(2200, 5*time.Millisecond),   // healthy
		at(3500, 6*time.Millisecond),   // benign
		at(4050, 7*time.Millisecond),   // settling after the benign window: nothing
		at(4500, 8*time.Millisecond),   // healthy
		at(4999, 9*time.Millisecond),   // ends past the end: nothing
		at(1999, 10*time.Millisecond),  // starts in the hostile window: hostile
		at(2999, 11*time.Millisecond),  // straddles into the benign window: benign
		at(2100, 12*time.Millisecond),  // exactly Settle after: healthy
		at(2099, 13*time.Microsecond),  // just before: nothing
		at(3999, 14*time.Microsecond),  // still benign
		at(4100, 15*time.Microsecond),  // healthy
		at(4900, 100*time.Millisecond), // ends at the end: healthy
	}
	healthy, hostile, benign := s.Split(samples)
	ms := func(ds ...time.Duration) []time.Duration { return ds }
	if want := ms(time.Millisecond, 5*time.Millisecond, 8*time.Millisecond, 12*time.Millisecond, 15*time.Microsecond, 100*time.Millisecond); !slices.Equal(healthy, want) {
		t.Errorf("healthy %v; want %v", healthy, want)
	}
	if want := ms(2*time.Millisecond, 3*time.Millisecond, 10*time.Millisecond); !slices.Equal(hostile, want) {
		t.Errorf("hostile %v; want %v", hostile, want)
	}
	if want := ms(6*time.Millisecond, 11*time.Millisecond, 14*time.Microsecond); !slices.Equal(benign, want) {
		t.Errorf("benign %v; want %v", benign, want)
	}
	// Without the control every loaded window is hostile.
	s.Control = false
	if _, hostile, benign := s.Split(samples); len(benign) != 0 || len(hostile) != 6 {
		t.Errorf("no control: hostile %v, benign %v; want 6 hostile, no benign", hostile, benign)
	}
}

// RunWindows calls its traffic at each loaded window's start, with a
// context ending at the window's end, and stops when its context ends.
func TestRunWindows(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now().Add(500 * time.Millisecond)
		s := Schedule{Start: start, Window: time.Second, Loaded: 4, Control: true}
		type call struct {
			k        int
			hostile  bool
			from, to time.Duration
		}
		var calls []call
		err := s.RunWindows(t.Context(), func(ctx context.Context, k int, hostile bool) {
			from := time.Since(start)
			<-ctx.Done()
			calls = append(calls, call{k, hostile, from, time.Since(start)})
		})
		if err != nil {
			t.Fatal(err)
		}
		want := []call{{0, true, 1 * time.Second, 2 * time.Second}, {1, false, 3 * time.Second, 4 * time.Second},
			{2, true, 5 * time.Second, 6 * time.Second}, {3, false, 7 * time.Second, 8 * time.Second}}
		if !slices.Equal(calls, want) {
			t.Errorf("windows %+v; want %+v", calls, want)
		}
		if end := time.Since(start); end != 8*time.Second || s.End().Sub(start) != 9*time.Second {
			t.Errorf("returned at %v, End %v after the start; want 8 s, 9 s (a quiet window last)", end, s.End().Sub(start))
		}

		ctx, cancel := context.WithCancel(t.Context())
		time.AfterFunc(1500*time.Millisecond, cancel)
		n := 0
		s.Start = time.Now()
		if err := s.RunWindows(ctx, func(ctx context.Context, _ int, _ bool) { n++; <-ctx.Done() }); err != context.Canceled || n != 1 {
			t.Errorf("cancelled in the first window: %v after %d windows; want context.Canceled after 1", err, n)
		}
	})
}
