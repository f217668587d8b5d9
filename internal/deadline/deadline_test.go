package deadline

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"testing/synctest"
	"time"
)

type valueKey struct{}

// TestCtxIsAContextWithADeadline: a Ctx answers Deadline, Err, Done and
// Value as context.WithDeadline's does, whether or not Done was asked
// for, and ends with its parent, its deadline or End.
func TestCtxIsAContextWithADeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		parent := context.WithValue(context.Background(), valueKey{}, "v")
		start := time.Now()

		c := New(parent, start.Add(time.Second))
		if d, ok := c.Deadline(); !ok || !d.Equal(start.Add(time.Second)) {
			t.Fatalf("Deadline() = %v, %v", d, ok)
		}
		if c.Value(valueKey{}) != "v" || c.Err() != nil {
			t.Fatalf("Value %v, Err %v", c.Value(valueKey{}), c.Err())
		}
		time.Sleep(time.Second)
		if !errors.Is(c.Err(), context.DeadlineExceeded) {
			t.Fatalf("Err() at the deadline = %v", c.Err())
		}
		c.End()
		if !errors.Is(c.Err(), context.DeadlineExceeded) {
			t.Fatalf("End changed Err to %v", c.Err())
		}
		select {
		case <-c.Done(): // made now, already done
		default:
			t.Fatal("Done() of a Ctx past its deadline is not closed")
		}

		// Done asked for first: closes at the deadline.
		c = New(parent, time.Now().Add(time.Second))
		done := c.Done()
		time.Sleep(999 * time.Millisecond)
		select {
		case <-done:
			t.Fatal("done before the deadline")
		default:
		}
		time.Sleep(time.Millisecond)
		<-done
		if !errors.Is(c.Err(), context.DeadlineExceeded) {
			t.Fatalf("Err() = %v", c.Err())
		}

		// End before Done: Canceled, and Done closed when asked for.
		c = New(parent, time.Now().Add(time.Second))
		c.End()
		if !errors.Is(c.Err(), context.Canceled) {
			t.Fatalf("Err() after End = %v", c.Err())
		}
		<-c.Done()

		// The parent's cancel ends it, with or without Done.
		pctx, cancel := context.WithCancel(parent)
		c = New(pctx, time.Now().Add(time.Hour))
		c2 := New(pctx, time.Now().Add(time.Hour))
		d2 := c2.Done()
		cancel()
		<-d2
		if !errors.Is(c.Err(), context.Canceled) || !errors.Is(c2.Err(), context.Canceled) {
			t.Fatalf("Err() after the parent's cancel = %v, %v", c.Err(), c2.Err())
		}

		// A parent's earlier deadline is its deadline.
		pctx, cancel = context.WithDeadline(parent, time.Now().Add(time.Second))
		defer cancel()
		c = New(pctx, time.Now().Add(time.Hour))
		if d, _ := c.Deadline(); !d.Equal(time.Now().Add(time.Second)) {
			t.Fatalf("Deadline() = %v, want the parent's", d)
		}
	})
}

// TestLazy: a waiter may wait for the deadline itself only while nothing
// derived from the Ctx can end on its own: through value contexts yes;
// once Done was asked for (a cancelable child does), or for a context
// that is not a Ctx, or whose deadline is another's, no.
func TestLazy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		pctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		at := time.Now().Add(time.Second)

		c := New(pctx, at)
		v := context.WithValue(c, valueKey{}, 1)
		d, done, ok := Lazy(v)
		if !ok || !d.Equal(at) || done != pctx.Done() {
			t.Fatalf("Lazy(value child) = %v, %v, %v", d, done, ok)
		}
		if _, done, ok := Lazy(New(context.Background(), at)); !ok || done != nil {
			t.Fatalf("Lazy over Background: done %v, ok %v", done, ok)
		}

		child, ccancel := context.WithCancel(v) // asks c for Done
		defer ccancel()
		if _, _, ok := Lazy(child); ok {
			t.Fatal("Lazy through a cancelable child")
		}
		if _, _, ok := Lazy(c); ok {
			t.Fatal("Lazy after Done was asked for")
		}

		c = New(pctx, at)
		sooner, scancel := context.WithDeadline(context.WithValue(c, valueKey{}, 1), at.Add(-time.Millisecond))
		defer scancel()
		if _, _, ok := Lazy(sooner); ok {
			t.Fatal("Lazy under an earlier deadline")
		}

		c = New(pctx, at)
		c.End()
		if _, _, ok := Lazy(c); ok {
			t.Fatal("Lazy for an ended Ctx")
		}
		if _, _, ok := Lazy(pctx); ok {
			t.Fatal("Lazy for a context without a Ctx")
		}
		var shared Ctx // anyone may End it: its waiters watch Done
		shared.Init(pctx, at, true)
		if _, _, ok := Lazy(&shared); ok {
			t.Fatal("Lazy for a shared Ctx")
		}
		none := New(pctx, time.Time{}) // no deadline: nothing to wait for on a timer
		if _, has := none.Deadline(); has {
			t.Fatal("a Ctx without a deadline has one")
		}
		if _, _, ok := Lazy(none); ok {
			t.Fatal("Lazy for a Ctx without a deadline")
		}
	})
}

// TestDerivedContextsNeedNoWatcher: contexts derived from a Ctx whose
// Done was made find its cancellation through Value, as they would
// context.WithDeadline's: no goroutine is started to watch it.
func TestDerivedContextsNeedNoWatcher(t *testing.T) {
	c := New(context.Background(), time.Now().Add(time.Hour))
	defer c.End()
	c.Done()
	before := runtime.NumGoroutine()
	var cancels []context.CancelFunc
	for range 100 {
		_, cancel := context.WithTimeout(context.WithValue(c, valueKey{}, 1), time.Hour)
		cancels = append(cancels, cancel)
	}
	if n := runtime.NumGoroutine() - before; n > 5 {
		t.Errorf("%d goroutines started for 100 derived contexts", n)
	}
	for _, cancel := range cancels {
		cancel()
	}
}
