package mesh_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
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
