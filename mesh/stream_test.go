package mesh_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
)

type chunk struct {
	I   int64  `json:"i"`
	Pad string `json:"pad"`
}

// TestStreamTenThousandChunksInOrder: 10,000 chunks through the hub, over
// real sockets, arrive complete and in order, with a window of 16 (so the
// credit is granted again some 1,250 times on the way), and the end says
// how many were sent.
func TestStreamTenThousandChunksInOrder(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	m.RunAgent(t, agents.NewEcho())
	c := m.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := c.Stream(ctx, "echo.stream", map[string]any{"n": 10000}, mesh.Window(16))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var want int64 = 1
	for raw, err := range s.All() {
		if err != nil {
			t.Fatalf("after %d chunks: %v", want-1, err)
		}
		var ch chunk
		if err := json.Unmarshal(raw, &ch); err != nil || ch.I != want {
			t.Fatalf("chunk %d: %s (%v)", want, raw, err)
		}
		want++
	}
	if want != 10001 {
		t.Fatalf("got %d chunks; want 10000", want-1)
	}
	res := s.Result()
	if res == nil || string(res.Result) != `{"chunks":10000}` {
		t.Fatalf("end: %+v", res)
	}
}

// TestStreamErrorsBeforeAndAfterChunks: a stream that fails before its
// first chunk ends with the handler's error; one that fails after chunks
// ends with it after them, and says the last sequence number; a plain
// call to a streaming method is refused.
func TestStreamErrorsBeforeAndAfterChunks(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	a := agents.New("st")
	a.HandleStream("st.fail", func(ctx context.Context, p json.RawMessage, s *agents.Stream) error {
		var n int
		_ = json.Unmarshal(p, &n)
		for i := range n {
			if err := s.Send(ctx, i); err != nil {
				return err
			}
		}
		return envelope.NewError(envelope.CodePermissionDenied, "quota gone")
	})
	m.RunAgent(t, a)
	c := m.Client(t)
	ctx := context.Background()

	s, err := c.Stream(ctx, "st.fail", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); envelope.CodeOf(err) != envelope.CodePermissionDenied {
		t.Fatalf("before any chunk: %v", err)
	}
	s.Close()

	s, err = c.Stream(ctx, "st.fail", 3)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if raw, err := s.Recv(); err != nil || string(raw) != string(rune('0'+i)) {
			t.Fatalf("chunk %d: %s %v", i+1, raw, err)
		}
	}
	_, err = s.Recv()
	var e *envelope.Error
	if !errors.As(err, &e) || e.Code != envelope.CodePermissionDenied {
		t.Fatalf("after 3 chunks: %v", err)
	}
	var d struct{ LastSeq uint64 }
	if json.Unmarshal(e.Data, &d) != nil || d.LastSeq != 3 || e.Attempts() == 0 {
		t.Fatalf("after 3 chunks the error's details are %s (attempts %d); want lastSeq 3, final", e.Data, e.Attempts())
	}
	s.Close()
	if _, err := s.Recv(); err == nil || err == io.EOF {
		t.Fatalf("Recv after the end: %v", err)
	}

	err = c.Call(ctx, "st.fail", 1, nil)
	if envelope.CodeOf(err) != envelope.CodeInvalidRequest {
		t.Fatalf("a plain call to a streaming method: %v", err)
	}
}

// TestStreamCancelReachesHandler: a client that closes its stream
// mid-way cancels the agent's handler context, through the hub, within
// 50 ms (real sockets), and the handler's next Send fails CANCELLED with
// its context done (never with it still live: the link marked the stream
// ended before it cancelled the context, and a Send could see the one
// without the other).
func TestStreamCancelReachesHandler(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	a := agents.New("slow")
	cancelled := make(chan time.Time, 1)
	sendErr := make(chan error, 1)
	a.HandleStream("slow.tick", func(ctx context.Context, _ json.RawMessage, s *agents.Stream) error {
		for i := 0; ; i++ {
			if err := s.Send(ctx, i); err != nil {
				// The handler sees the cancel: its Send fails, its context
				// done. (Not a context.AfterFunc stopped as the handler
				// returns: ctx.Err is set before the AfterFuncs start, so
				// a handler that returns at once can stop its AfterFunc
				// before it runs; the test then failed under load with the
				// cancel delivered.)
				if ctx.Err() != nil {
					cancelled <- time.Now()
				}
				sendErr <- err
				return err
			}
			select {
			case <-time.After(5 * time.Millisecond):
			case <-ctx.Done():
			}
		}
	})
	m.RunAgent(t, a)
	c := m.Client(t)
	for round := range 5 {
		s, err := c.Stream(context.Background(), "slow.tick", nil)
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if _, err := s.Recv(); err != nil {
				t.Fatal(err)
			}
		}
		closed := time.Now()
		s.Close()
		select {
		case at := <-cancelled:
			if d := at.Sub(closed); d > 50*time.Millisecond {
				t.Errorf("round %d: the handler saw the cancel %v after the client closed; want within 50ms", round, d)
			} else {
				t.Logf("round %d: cancel reached the handler in %v", round, d.Round(10*time.Microsecond))
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: the handler never saw the cancel", round)
		}
		if err := <-sendErr; envelope.CodeOf(err) != envelope.CodeCancelled {
			t.Errorf("round %d: the handler's Send after the cancel: %v; want CANCELLED", round, err)
		}
	}
}

// TestStreamFlowControlHoldsTheAgent: a consumer that stops reading holds
// the agent's handler at its window: the handler has sent exactly the
// window's chunks and waits in Send, and reading again lets it go on.
func TestStreamFlowControlHoldsTheAgent(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	a := agents.New("fast")
	var sent atomic.Int64
	a.HandleStream("fast.many", func(ctx context.Context, _ json.RawMessage, s *agents.Stream) error {
		for i := range 1000 {
			if err := s.Send(ctx, i); err != nil {
				return err
			}
			sent.Add(1)
		}
		return nil
	})
	m.RunAgent(t, a)
	c := m.Client(t)
	s, err := c.Stream(context.Background(), "fast.many", nil, mesh.Window(8))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	meshtest.WaitFor(t, 5*time.Second, func() bool { return sent.Load() == 8 })
	time.Sleep(100 * time.Millisecond) // (a real network: the agent could only overrun it late)
	if n, r := sent.Load(), s.Received(); n != 8 || r != 8 {
		t.Fatalf("with a window of 8 and nothing read, the agent sent %d and the client holds %d; want 8 and 8", n, r)
	}
	got := 0
	for _, err := range s.All() {
		if err != nil {
			t.Fatal(err)
		}
		got++
	}
	if got != 1000 {
		t.Fatalf("read %d chunks; want 1000", got)
	}
}
