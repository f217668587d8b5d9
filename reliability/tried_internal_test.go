package reliability

import (
	"context"
	"runtime"
	"testing"
	"time"
)

// TestTriedCtx: the context that carries a call's Tried set gives it to
// every context derived from it, passes other values through, and lets
// the context package register its children with the parent's
// cancellation directly: no goroutine per child, and a child ends with
// its parent.
func TestTriedCtx(t *testing.T) {
	type k struct{}
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), k{}, "v"))
	ctx := &triedCtx{Context: parent}
	before := runtime.NumGoroutine()
	var children []context.Context
	for range 100 {
		c, cancelChild := context.WithTimeout(ctx, time.Hour)
		defer cancelChild()
		children = append(children, c)
	}
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines after deriving 100 children, %d before: want none per child", n, before)
	}
	TriedFrom(children[7]).Add("a")
	if !TriedFrom(ctx).Has("a") || TriedFrom(parent) != nil {
		t.Error("a child's Tried is not its parent's, or the parent has one")
	}
	if children[0].Value(k{}) != "v" {
		t.Error("another value did not pass through")
	}
	cancel()
	for _, c := range children {
		<-c.Done()
	}
	if ctx.Err() != context.Canceled {
		t.Errorf("Err = %v; want Canceled", ctx.Err())
	}
}
