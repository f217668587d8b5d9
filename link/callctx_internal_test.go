package link

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"testing/synctest"
	"time"
)

// TestCallCtx: a served request's context behaves as context.WithTimeout's
// would (deadline, Done, Err, derived contexts, AfterFunc), with its
// channel and timer made only when a handler asks for them.
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
			if c.Err() != nil || c.done != nil || c.timer != nil {
				t.Fatal("before the deadline: an error, or a channel or timer made without Done")
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
		})
	})
	t.Run("Done at the deadline, derived contexts, AfterFunc", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := newCallCtx(base, time.Second)
			child, cancelChild := context.WithTimeout(c, time.Hour)
			defer cancelChild()
			ran := make(chan struct{})
			context.AfterFunc(c, func() { close(ran) })
			stopped := context.AfterFunc(c, func() { t.Error("a stopped AfterFunc ran") })
			if !stopped() {
				t.Error("stop of a pending AfterFunc = false")
			}
			goroutines := runtime.NumGoroutine()
			if d, _ := child.Deadline(); !d.Equal(time.Now().Add(time.Second)) {
				t.Errorf("the derived context's deadline = %v; want the request's", d)
			}
			synctest.Wait()
			if n := runtime.NumGoroutine(); n != goroutines {
				t.Errorf("%d goroutines watch the derived context; want none", n-goroutines)
			}
			<-c.Done()
			<-child.Done()
			<-ran
			if !errors.Is(c.Err(), context.DeadlineExceeded) || !errors.Is(child.Err(), context.DeadlineExceeded) {
				t.Errorf("Err = %v, child %v; want DeadlineExceeded", c.Err(), child.Err())
			}
		})
	})
	t.Run("cancel", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			c := newCallCtx(base, 0)
			if _, ok := c.Deadline(); ok {
				t.Error("a request without a ttl has a deadline")
			}
			done := c.Done()
			child, cancelChild := context.WithCancel(c)
			defer cancelChild()
			c.CancelServed()
			<-done
			<-child.Done()
			if !errors.Is(c.Err(), context.Canceled) || !errors.Is(child.Err(), context.Canceled) {
				t.Errorf("Err = %v, child %v; want Canceled", c.Err(), child.Err())
			}
			c.end(context.DeadlineExceeded) // the first end wins
			if !errors.Is(c.Err(), context.Canceled) {
				t.Errorf("Err after a second end = %v; want Canceled still", c.Err())
			}
			ran := make(chan struct{})
			if context.AfterFunc(c, func() { close(ran) })() {
				t.Error("stop of an AfterFunc on an ended context = true")
			}
			<-ran
		})
	})
}
