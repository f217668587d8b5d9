package meshtest

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/mesh"
)

// Transport is an in-memory stand-in for the hub, for testing code that
// uses mesh.Client without sockets (the kOS seed's RpcTestClient): canned
// results and errors per method, added delays, and N failures before
// success. Methods with no rule answer METHOD_NOT_FOUND. Safe for
// concurrent use; its Invoke honours the context like a real link.
type Transport struct {
	mu    sync.Mutex
	rules map[string]*rule
	calls map[string]int
	reqs  []envelope.Request
}

type rule struct {
	result    json.RawMessage
	err       *envelope.Error
	delay     time.Duration
	failTimes int
	failErr   *envelope.Error
}

// NewTransport returns a transport with no rules.
func NewTransport() *Transport {
	return &Transport{rules: map[string]*rule{}, calls: map[string]int{}}
}

func (t *Transport) rule(method string) *rule {
	r, ok := t.rules[method]
	if !ok {
		r = &rule{result: json.RawMessage("null")}
		t.rules[method] = r
	}
	return r
}

// Respond makes method answer result (marshalled with encoding/json).
func (t *Transport) Respond(method string, result any) *Transport {
	raw, err := json.Marshal(result)
	if err != nil {
		panic("meshtest: cannot marshal the canned result: " + err.Error())
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.rule(method)
	r.result, r.err = raw, nil
	return t
}

// Fail makes method answer err every time.
func (t *Transport) Fail(method string, err *envelope.Error) *Transport {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rule(method).err = err
	return t
}

// FailTimes makes the next n calls of method fail with err, then answer
// as configured.
func (t *Transport) FailTimes(method string, n int, err *envelope.Error) *Transport {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.rule(method)
	r.failTimes, r.failErr = n, err
	return t
}

// Delay makes method take d before answering (or the context's end).
func (t *Transport) Delay(method string, d time.Duration) *Transport {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.rule(method).delay = d
	return t
}

// Calls returns how many attempts reached method.
func (t *Transport) Calls(method string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.calls[method]
}

// Requests returns a copy of every request received, in order.
func (t *Transport) Requests() []envelope.Request {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]envelope.Request(nil), t.reqs...)
}

// Invoke is the transport's envelope.Invoker.
func (t *Transport) Invoke(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
	t.mu.Lock()
	t.calls[req.Method]++
	t.reqs = append(t.reqs, *req)
	r, ok := t.rules[req.Method]
	var res json.RawMessage
	var err *envelope.Error
	var delay time.Duration
	if ok {
		delay = r.delay
		res, err = r.result, r.err
		if r.failTimes > 0 {
			r.failTimes--
			err = r.failErr
		}
	}
	t.mu.Unlock()
	if !ok {
		return nil, envelope.Errorf(envelope.CodeMethodNotFound, "no agent serves %q", req.Method)
	}
	if delay > 0 {
		tm := time.NewTimer(delay)
		defer tm.Stop()
		select {
		case <-tm.C:
		case <-ctx.Done():
			return nil, envelope.AsError(ctx.Err())
		}
	}
	if err != nil {
		cp := *err // each caller gets its own error value
		return nil, &cp
	}
	return &envelope.Response{ID: req.ID, Origin: "meshtest", Timestamp: time.Now().UnixMilli(), Result: res}, nil
}

// NewClient returns a mesh.Client whose calls go to t (with the client's
// whole reliability chain in front), closed when the test ends.
func (t *Transport) NewClient(tb testing.TB, opts ...mesh.ClientOption) *mesh.Client {
	tb.Helper()
	c, err := mesh.NewClient(nil, append([]mesh.ClientOption{mesh.WithTransport(t.Invoke)}, opts...)...)
	if err != nil {
		tb.Fatalf("NewClient: %v", err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	return c
}
