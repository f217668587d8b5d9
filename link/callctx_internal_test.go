package link

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentmesh/agentmesh/internal/deadline"
)

// TestCallCtx: a served request's context behaves as context.WithTimeout's
// would (deadline, Done, Err, Value, derived contexts, AfterFunc), with
// its inner context made only when a handler waits on it.
func TestCallCtx(t *testing.T) {
	type key struct{}
	base := context.WithoutCancel(context.WithValue(context.Background(), key{}, "v"))
	t.Run("deadline without Done", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := newCallCtx(base, time.Second)
			if d, ok := c.Deadline(); !ok || !d.Equal(time.Now().Add(time.Second)) {
				t.Errorf("Deadline = %v, %v; want now+1s", d, ok)
			}
			if c.Value(key{}) != "v" {
				t.Error("the base's values are lost")
			}
			if c.Err() != nil {
				t.Fatal("an error before the deadline")
			}
			if _, _, lazy := deadline.Lazy(c); lazy {
				t.Fatal("a served request's context is waited for without its Done (the peer's cancel would not reach a call made with it)")
			}
			time.Sleep(time.Second)
			if !errors.Is(c.Err(), context.DeadlineExceeded) {
				t.Errorf("Err at the deadline = %v; want DeadlineExceeded", c.Err())
			}
			select {
			case <-c.Done():
			default:
				t.Error("Done after the deadline is not closed")
			}
			if !errors.Is(c.Err(), context.DeadlineExceeded) {
				t.Errorf("Err after Done = %v; want DeadlineExceeded", c.Err())
			}
		})
	})
	t.Run("Done at the deadline, derived contexts, AfterFunc", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := newCallCtx(base, time.Second)
			goroutines := runtime.NumGoroutine()
			// Derived directly, and through a value context (as a handler's
			// context is: the agent's request, a span): neither is watched
			// by a goroutine.
			child, cancelChild := context.WithTimeout(c, time.Hour)
			defer cancelChild()
			grandchild, cancelGrandchild := context.WithCancel(context.WithValue(c, key{}, "w"))
			defer cancelGrandchild()
			ran := make(chan struct{})
			context.AfterFunc(c, func() { close(ran) })
			stopped := context.AfterFunc(c, func() { t.Error("a stopped AfterFunc ran") })
			if !stopped() {
				t.Error("stop of a pending AfterFunc = false")
			}
			synctest.Wait()
			if n := runtime.NumGoroutine(); n != goroutines {
				t.Errorf("%d goroutines watch the derived contexts; want none", n-goroutines)
			}
			if d, _ := child.Deadline(); !d.Equal(time.Now().Add(time.Second)) {
				t.Errorf("the derived context's deadline = %v; want the request's", d)
			}
			if grandchild.Value(key{}) != "w" || c.Value(key{}) != "v" {
				t.Error("values lost once the inner context is made")
			}
			<-c.Done()
			<-child.Done()
			<-grandchild.Done()
			<-ran
			for _, x := range []context.Context{c, child, grandchild} {
				if !errors.Is(x.Err(), context.DeadlineExceeded) {
					t.Errorf("Err = %v; want DeadlineExceeded", x.Err())
				}
			}
		})
	})
	t.Run("cancel", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := newCallCtx(base, time.Second)
			done := c.Done()
			child, cancelChild := context.WithCancel(c)
			defer cancelChild()
			c.CancelServed()
			<-done
			<-child.Done()
			if !errors.Is(c.Err(), context.Canceled) || !errors.Is(child.Err(), context.Canceled) {
				t.Errorf("Err = %v, child %v; want Canceled", c.Err(), child.Err())
			}
			time.Sleep(2 * time.Second) // the first end wins
			if !errors.Is(c.Err(), context.Canceled) {
				t.Errorf("Err after the deadline = %v; want Canceled still", c.Err())
			}
		})
	})
	t.Run("cancel before Done", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := newCallCtx(base, 0)
			if _, ok := c.Deadline(); ok {
				t.Error("a request without a ttl has a deadline")
			}
			c.CancelServed()
			if !errors.Is(c.Err(), context.Canceled) {
				t.Errorf("Err = %v; want Canceled", c.Err())
			}
			<-c.Done()
			if !errors.Is(c.Err(), context.Canceled) {
				t.Errorf("Err after Done = %v; want Canceled", c.Err())
			}
			ran := make(chan struct{})
			if context.AfterFunc(c, func() { close(ran) })() {
				t.Error("stop of an AfterFunc on an ended context = true")
			}
			<-ran
		})
	})
}
