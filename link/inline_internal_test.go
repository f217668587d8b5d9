package link

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/wspipe"
)

// TestInlineServesOnTheReader: a method WithInline names is served on the
// link's reader, in the order its requests came, with the request's
// deadline; while its handler runs the link serves nothing else, which
// is what tells it from a worker's. Other methods still go to workers.
func TestInlineServesOnTheReader(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		var order []int
		var workerServed int
		h := func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
			switch req.Method {
			case "inline.wait":
				<-gate // holds the reader: nothing else is read meanwhile
				return &envelope.Response{Result: req.Params}, nil
			case "inline.order":
				n, _ := strconv.Atoi(string(req.Params))
				order = append(order, n) // no lock: one reader runs them all
				return &envelope.Response{Result: req.Params}, nil
			case "inline.deadline":
				d, ok := ctx.Deadline()
				if !ok || d.Sub(time.Now()) != 2*time.Second {
					return nil, envelope.Errorf(envelope.CodeInternal, "deadline %v %v, want 2s from now", d, ok)
				}
				time.Sleep(3 * time.Second) // the fake clock: past the ttl
				if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
					return nil, envelope.Errorf(envelope.CodeInternal, "ctx.Err() = %v past the deadline", ctx.Err())
				}
				return nil, envelope.NewError(envelope.CodeInvalidParams, "refused")
			default:
				workerServed++
				return &envelope.Response{Result: req.Params}, nil
			}
		}
		sws, cws := wspipe.Pair(t)
		served := New(sws, Config{}, WithHandler(h), WithInline(func(m string) bool { return m != "worker.m" }))
		caller := New(cws, Config{})
		t.Cleanup(func() { caller.Close(); served.Close() })
		call := func(method, params string, ttl int64) (*envelope.Response, error) {
			req := &envelope.Request{ID: method, Method: method, Params: json.RawMessage(params)}
			req.Headers.TTL = ttl
			return caller.Call(context.Background(), req)
		}

		// A held inline handler holds the reader: the worker's method,
		// sent after it, waits until it returns.
		waited := make(chan error, 2)
		go func() { _, err := call("inline.wait", "1", 0); waited <- err }()
		synctest.Wait()
		go func() { _, err := call("worker.m", "2", 0); waited <- err }()
		synctest.Wait()
		if workerServed != 0 {
			t.Fatalf("a request was served while an inline handler held the reader")
		}
		close(gate)
		for range 2 {
			if err := <-waited; err != nil {
				t.Fatal(err)
			}
		}
		if workerServed != 1 {
			t.Fatalf("worker.m served %d times, want 1", workerServed)
		}

		// Pipelined inline calls are served in the order they came.
		const n = 20
		outs := make([]outcome, n)
		for i := range n {
			req := &envelope.Request{ID: strconv.Itoa(i), Method: "inline.order", Params: json.RawMessage(strconv.Itoa(i))}
			if _, err := caller.Go(req, time.Now().Add(10*time.Second), CompletionFunc(outs[i].done)); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		for i := range n {
			if outs[i].runs != 1 || outs[i].err != nil || string(outs[i].res.Result) != strconv.Itoa(i) {
				t.Fatalf("call %d: %d runs, %v, %v", i, outs[i].runs, outs[i].err, outs[i].res)
			}
			if order[i] != i {
				t.Fatalf("served in order %v", order)
			}
		}

		// The request's ttl is its context's deadline; an error is answered
		// with its code.
		_, err := call("inline.deadline", "0", 2000)
		if envelope.CodeOf(err) != envelope.CodeInvalidParams {
			t.Fatalf("inline.deadline: %v, want INVALID_PARAMS", err)
		}
		if s := served.Serving(); s != 0 {
			t.Fatalf("%d requests still counted as served", s)
		}
	})
}
