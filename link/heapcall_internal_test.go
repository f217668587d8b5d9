package link

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/deadline"
)

// TestCallWaitsInTheDeadlineHeap: a Call whose deadline is a deadline.Ctx
// nothing waits on waits for it in the link's deadline heap (no timer
// of its own): it times out at the deadline, ends with its parent's
// cancel (the peer told to cancel), and is answered as any call; a ctx
// whose Done was asked for waits as before, in the pending table.
func TestCallWaitsInTheDeadlineHeap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ended := make(chan error, 1)
		caller, _ := asyncPair(t, func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
			if req.Method == "wait" {
				<-ctx.Done()
				ended <- ctx.Err()
				return nil, ctx.Err()
			}
			return &envelope.Response{Result: req.Params}, nil
		})
		waiting := func(inHeap bool) {
			t.Helper()
			caller.mu.Lock()
			defer caller.mu.Unlock()
			if inHeap && (len(caller.async) != 1 || len(caller.asyncDeadlines.h) != 1 || len(caller.pending) != 0) {
				t.Fatalf("async %d, in the heap %d, pending %d; want the call in the heap", len(caller.async), len(caller.asyncDeadlines.h), len(caller.pending))
			}
			if !inHeap && (len(caller.async) != 0 || len(caller.pending) != 1) {
				t.Fatalf("async %d, pending %d; want the call pending", len(caller.async), len(caller.pending))
			}
		}
		empty := func() {
			t.Helper()
			caller.mu.Lock()
			defer caller.mu.Unlock()
			if len(caller.async)+len(caller.asyncDeadlines.h)+len(caller.pending) != 0 {
				t.Fatalf("left behind: async %d, heap %d, pending %d", len(caller.async), len(caller.asyncDeadlines.h), len(caller.pending))
			}
		}
		call := func(ctx context.Context, method string) (*envelope.Response, error, time.Duration) {
			start := time.Now()
			res, err := caller.Call(ctx, &envelope.Request{ID: method, Method: method, Params: json.RawMessage(`"x"`)})
			return res, err, time.Since(start)
		}

		// Answered.
		dl := deadline.New(context.Background(), time.Now().Add(time.Second))
		res, err, _ := call(context.WithValue(dl, struct{}{}, 1), "echo")
		dl.End()
		if err != nil || string(res.Result) != `"x"` {
			t.Fatalf("echo: %v, %v", res, err)
		}
		empty()

		// Timed out by the link's timer, at the deadline.
		dl = deadline.New(context.Background(), time.Now().Add(time.Second))
		got := make(chan error, 1)
		var took time.Duration
		go func() { _, err, d := call(dl, "wait"); took = d; got <- err }()
		synctest.Wait()
		waiting(true)
		err = <-got
		dl.End()
		if envelope.CodeOf(err) != envelope.CodeTimeout || took != time.Second {
			t.Fatalf("timed out with %v after %v; want TIMEOUT after 1s", err, took)
		}
		<-ended
		empty()

		// The parent's cancel ends it before the deadline, and the peer
		// hears of it (its handler's deadline is an hour away).
		pctx, cancel := context.WithCancel(context.Background())
		dl = deadline.New(pctx, time.Now().Add(time.Hour))
		go func() { _, err, _ := call(dl, "wait"); got <- err }()
		synctest.Wait()
		waiting(true)
		cancel()
		if err := <-got; envelope.CodeOf(err) != envelope.CodeCancelled {
			t.Fatalf("after the parent's cancel: %v", err)
		}
		if err := <-ended; !errors.Is(err, context.Canceled) {
			t.Fatalf("the handler ended with %v, want the caller's cancel", err)
		}
		dl.End()
		empty()

		// Done asked for: the call waits on it, as any context's.
		dl = deadline.New(context.Background(), time.Now().Add(time.Second))
		dl.Done()
		go func() { _, err, _ := call(dl, "wait"); got <- err }()
		synctest.Wait()
		waiting(false)
		if err := <-got; envelope.CodeOf(err) != envelope.CodeTimeout {
			t.Fatalf("with Done asked for: %v", err)
		}
		<-ended
		dl.End()
		empty()
	})
}
