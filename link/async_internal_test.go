package link

import (
	"context"
	"encoding/json"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/wspipe"
)

// asyncPair is a native link over net.Pipe: caller is the side that calls
// with Go, served serves with h. Both close when the test ends.
func asyncPair(t *testing.T, h envelope.Invoker) (caller, served *Link) {
	sws, cws := wspipe.Pair(t)
	served = New(sws, Config{}, WithHandler(h))
	caller = New(cws, Config{})
	t.Cleanup(func() { caller.Close(); served.Close() })
	return caller, served
}

// outcome is what one Completion got, and how often it ran.
type outcome struct {
	mu   sync.Mutex
	runs int
	res  *envelope.Response
	err  *envelope.Error
	at   time.Time
}

func (o *outcome) done(res *envelope.Response, err *envelope.Error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.runs++
	if res != nil {
		r := *res // the reader's, until done returns
		res = &r
	}
	o.res, o.err, o.at = res, err, time.Now()
}

// TestGoAnswers: concurrent calls made with Go each complete exactly
// once, with their own answer, on the link's goroutines; nothing stays
// in the table or the deadline heap.
func TestGoAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		caller, _ := asyncPair(t, func(_ context.Context, req *envelope.Request) (*envelope.Response, error) {
			return &envelope.Response{Result: req.Params}, nil
		})
		const n = 50
		outs := make([]outcome, n)
		for i := range n {
			req := &envelope.Request{ID: strconv.Itoa(i), Method: "echo.echo", Params: json.RawMessage(strconv.Itoa(i))}
			if _, err := caller.Go(req, time.Now().Add(10*time.Second), CompletionFunc(outs[i].done)); err != nil {
				t.Fatalf("call %d not sent: %v", i, err)
			}
		}
		synctest.Wait()
		for i := range outs {
			o := &outs[i]
			if o.runs != 1 || o.err != nil || o.res == nil || string(o.res.Result) != strconv.Itoa(i) {
				t.Errorf("call %d: done ran %d times, res %+v, err %v; want once, result %d", i, o.runs, o.res, o.err, i)
			}
		}
		if p := caller.Pending(); p != 0 {
			t.Errorf("%d calls still pending", p)
		}
		caller.mu.Lock()
		left := len(caller.asyncDeadlines.h)
		caller.mu.Unlock()
		if left != 0 {
			t.Errorf("%d deadlines left in the heap", left)
		}
	})
}

// TestGoTimeout: calls whose answer does not come end with TIMEOUT at
// their own deadlines, the earliest first, whatever the order they were
// made in; the peer's handlers see their contexts end (the cancel frame,
// or their ttl, at the same instant), and the answers they send after
// that are dropped and counted as late, never delivered.
func TestGoTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var ended atomic.Int64
		release := make(chan struct{})
		caller, _ := asyncPair(t, func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
			<-ctx.Done()
			ended.Add(1)
			<-release // answers only after the test looked
			return &envelope.Response{Result: req.Params}, nil
		})
		start := time.Now()
		ttls := []time.Duration{300 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond}
		outs := make([]outcome, len(ttls))
		for i, d := range ttls {
			if _, err := caller.Go(&envelope.Request{ID: strconv.Itoa(i), Method: "slow.wait"}, start.Add(d), CompletionFunc(outs[i].done)); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Second)
		synctest.Wait()
		for i, d := range ttls {
			o := &outs[i]
			if o.runs != 1 || o.err == nil || o.err.Code != envelope.CodeTimeout || o.at.Sub(start) != d {
				t.Errorf("call %d (deadline %v): done ran %d times, res %+v, err %v after %v; want once, TIMEOUT at its deadline", i, d, o.runs, o.res, o.err, o.at.Sub(start))
			}
		}
		if c := ended.Load(); c != int64(len(ttls)) {
			t.Errorf("the peer's handlers saw %d contexts end; want %d", c, len(ttls))
		}
		close(release)
		synctest.Wait()
		if late := caller.LateResponses(); late != int64(len(ttls)) {
			t.Errorf("%d late responses counted; want %d", late, len(ttls))
		}
		for i := range outs {
			if outs[i].runs != 1 {
				t.Errorf("call %d: done ran %d times after the late answers; want once", i, outs[i].runs)
			}
		}
		if p := caller.Pending(); p != 0 {
			t.Errorf("%d calls still pending", p)
		}
	})
}

// TestGoLinkLost: calls waiting when the link is lost end once with
// UNAVAILABLE (not marked not-sent: the peer may have run them); a call
// made after the loss is refused at once, not sent, and its completion
// never runs.
func TestGoLinkLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		caller, served := asyncPair(t, func(ctx context.Context, _ *envelope.Request) (*envelope.Response, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		})
		outs := make([]outcome, 3)
		for i := range outs {
			deadline := time.Time{} // one without a deadline, too
			if i > 0 {
				deadline = time.Now().Add(time.Hour)
			}
			if _, err := caller.Go(&envelope.Request{ID: strconv.Itoa(i), Method: "slow.wait"}, deadline, CompletionFunc(outs[i].done)); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		served.Close()
		<-caller.Done()
		synctest.Wait()
		for i := range outs {
			o := &outs[i]
			if o.runs != 1 || o.err == nil || o.err.Code != envelope.CodeUnavailable || o.err.NotSent() {
				t.Errorf("call %d: done ran %d times, err %v; want once, UNAVAILABLE (maybe sent)", i, o.runs, o.err)
			}
		}
		var after outcome
		_, err := caller.Go(&envelope.Request{ID: "late", Method: "slow.wait"}, time.Now().Add(time.Second), CompletionFunc(after.done))
		if err == nil || err.Code != envelope.CodeUnavailable || !err.NotSent() {
			t.Errorf("Go on a closed link: %v; want UNAVAILABLE, not sent", err)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if after.runs != 0 {
			t.Errorf("the refused call's completion ran %d times", after.runs)
		}
	})
}

// TestGoCompletesAfterSending: a completion may reuse its request at once
// (a forward path pools them), even when the deadline passes as the call
// is made: Go has read the request by then, and a timeout's cancel frame
// follows the request it cancels. Real time, deadlines of microseconds,
// under the race detector; every completion runs exactly once.
func TestGoCompletesAfterSending(t *testing.T) {
	caller, _ := asyncPair(t, func(ctx context.Context, _ *envelope.Request) (*envelope.Response, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	const n = 2000
	var runs, refused atomic.Int64
	var wg sync.WaitGroup
	for i := range n {
		req := &envelope.Request{ID: strconv.Itoa(i), Method: "slow.wait", Params: json.RawMessage(`{"x":1}`)}
		wg.Add(1)
		var once atomic.Bool
		_, err := caller.Go(req, time.Now().Add(time.Duration(i%20)*time.Microsecond), CompletionFunc(func(*envelope.Response, *envelope.Error) {
			req.Params = nil // reused by its owner
			if once.Swap(true) {
				t.Errorf("call %d completed twice", i)
			}
			runs.Add(1)
			wg.Done()
		}))
		if err != nil {
			refused.Add(1)
			wg.Done()
		}
	}
	wg.Wait()
	if runs.Load()+refused.Load() != n {
		t.Errorf("%d completions and %d refusals for %d calls", runs.Load(), refused.Load(), n)
	}
	if p := caller.Pending(); p != 0 {
		t.Errorf("%d calls still pending", p)
	}
}
