package link

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/wspipe"
	"github.com/agentmesh/agentmesh/stream"
)

// rawPeer is the far end of a link, speaking frames by hand: a peer that
// may break the protocol.
type rawPeer struct {
	t  *testing.T
	ws *websocket.Conn
}

func (p rawPeer) write(frame string) {
	p.t.Helper()
	if err := p.ws.WriteMessage(websocket.TextMessage, []byte(frame)); err != nil {
		p.t.Fatalf("peer write: %v", err)
	}
}

// read returns the next frames the link sent (a batch is split).
func (p rawPeer) read() []envelope.Frame {
	p.t.Helper()
	_, msg, err := p.ws.ReadMessage()
	if err != nil {
		p.t.Fatalf("peer read: %v", err)
	}
	var out []envelope.Frame
	envelope.EachFrame(msg, envelope.Limits{}, func(f *envelope.Frame, e *envelope.Error) {
		if e != nil {
			p.t.Fatalf("peer got an invalid frame %s: %v", msg, e)
		}
		c := *f
		c.Data = append([]byte(nil), f.Data...)
		out = append(out, c)
	})
	return out
}

// callerWithRawPeer is a link whose peer is a rawPeer.
func callerWithRawPeer(t *testing.T) (*Link, rawPeer) {
	sws, cws := wspipe.Pair(t)
	l := New(cws, Config{})
	t.Cleanup(l.Close)
	return l, rawPeer{t, sws}
}

// TestStreamPeerBreaksProtocol: a stream's callee that sends a chunk
// beyond the credit granted, or out of order, ends the stream with
// INTERNAL naming the fault (and the last sequence number delivered);
// the callee is told to cancel; the link stays up for the other calls,
// and a chunk for a stream that does not exist is ignored.
func TestStreamPeerBreaksProtocol(t *testing.T) {
	for _, tc := range []struct {
		name   string
		chunks []string // after the request: frames the peer sends
		want   string   // in the error's message
		last   uint64
	}{
		{"beyond credit", []string{`{"type":"chunk","seq":%d,"n":1,"data":1}`, `{"type":"chunk","seq":%d,"n":2,"data":2}`, `{"type":"chunk","seq":%d,"n":3,"data":3}`}, "beyond the credit", 2},
		{"out of order", []string{`{"type":"chunk","seq":%d,"n":1,"data":1}`, `{"type":"chunk","seq":%d,"n":3,"data":3}`}, "chunk 3 arrived where 2 was due", 1},
		{"a repeat", []string{`{"type":"chunk","seq":%d,"n":1,"data":1}`, `{"type":"chunk","seq":%d,"n":1,"data":1}`}, "chunk 1 arrived where 2 was due", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				l, peer := callerWithRawPeer(t)
				p := stream.NewPipe(stream.Window{Chunks: 2})
				done := make(chan error, 1)
				go func() {
					_, err := l.Call(stream.With(context.Background(), p), &envelope.Request{ID: "s", Method: "m.s", Stream: true})
					done <- err
				}()
				req := peer.read()[0]
				if req.Type != envelope.FrameRequest || !req.Request.Stream || req.N != 2 {
					t.Fatalf("request frame %+v; want a stream with 2 chunks of credit", req)
				}
				peer.write(fmt.Sprintf(`{"type":"chunk","seq":%d,"n":1,"data":0}`, req.Seq+1000)) // no such stream
				for _, c := range tc.chunks {
					peer.write(fmt.Sprintf(c, req.Seq))
				}
				err := envelope.AsError(<-done)
				if err.Code != envelope.CodeInternal || !strings.Contains(err.Message, tc.want) {
					t.Fatalf("the stream ended with %v; want INTERNAL: %s", err, tc.want)
				}
				var d struct{ LastSeq uint64 }
				if _ = json.Unmarshal(err.Data, &d); d.LastSeq != tc.last {
					t.Errorf("lastSeq %d (%s); want %d", d.LastSeq, err.Data, tc.last)
				}
				if f := peer.read(); f[0].Type != envelope.FrameCancel || f[0].Seq != req.Seq {
					t.Errorf("the peer got %+v; want a cancel of seq %d", f[0], req.Seq)
				}
				// The link carries on.
				go func() {
					_, err := l.Call(context.Background(), &envelope.Request{ID: "u", Method: "m.u"})
					done <- err
				}()
				r := peer.read()[0]
				peer.write(fmt.Sprintf(`{"type":"res","seq":%d,"result":1}`, r.Seq))
				if err := <-done; err != nil || l.Err() != nil {
					t.Fatalf("a call after the broken stream: %v (link %v)", err, l.Err())
				}
			})
		})
	}
}

// TestStreamCreditHoldsSender: an agent's Send waits once the caller's
// credit is used up and goes on when a credit frame grants more; a grant
// for a stream that does not exist is ignored; the end frame counts the
// chunks sent.
func TestStreamCreditHoldsSender(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sws, cws := wspipe.Pair(t)
		var sent atomic.Int64
		served := New(sws, Config{}, WithHandler(func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
			s := stream.SenderFrom(ctx)
			for i := range 5 {
				if err := s.Send(ctx, json.RawMessage(fmt.Sprint(i))); err != nil {
					return nil, err
				}
				sent.Add(1)
			}
			return &envelope.Response{Result: json.RawMessage(`"done"`)}, nil
		}))
		t.Cleanup(served.Close)
		peer := rawPeer{t, cws}
		peer.write(`{"type":"req","seq":7,"id":"s","method":"m.s","stream":2}`)
		var got []envelope.Frame
		for len(got) < 2 {
			got = append(got, peer.read()...)
		}
		synctest.Wait()
		if n := sent.Load(); n != 2 {
			t.Fatalf("with 2 chunks of credit the handler sent %d; want 2, then wait", n)
		}
		peer.write(`{"type":"credit","seq":99,"n":100}`) // no such stream
		synctest.Wait()
		if n := sent.Load(); n != 2 {
			t.Fatalf("a grant to another stream let the handler send %d", n)
		}
		peer.write(`{"type":"credit","seq":7,"n":10}`)
		for len(got) < 6 {
			got = append(got, peer.read()...)
		}
		for i, f := range got[:5] {
			if f.Type != envelope.FrameChunk || f.Seq != 7 || f.N != uint64(i+1) || string(f.Data) != fmt.Sprint(i) {
				t.Errorf("frame %d: %+v; want chunk %d of seq 7", i, f, i+1)
			}
		}
		if end := got[5]; end.Type != envelope.FrameEnd || end.Seq != 7 || end.N != 5 || string(end.Response.Result) != `"done"` {
			t.Errorf("end: %+v; want an end of seq 7 after 5 chunks", end)
		}
	})
}

// TestStreamCancelFrameReachesHandler: the caller's cancel frame cancels
// the handler's context, its Send fails CANCELLED, and the end says so.
func TestStreamCancelFrameReachesHandler(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sws, cws := wspipe.Pair(t)
		served := New(sws, Config{}, WithHandler(func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
			s := stream.SenderFrom(ctx)
			for {
				if err := s.Send(ctx, json.RawMessage(`1`)); err != nil {
					return nil, err
				}
			}
		}))
		t.Cleanup(served.Close)
		peer := rawPeer{t, cws}
		peer.write(`{"type":"req","seq":3,"id":"s","method":"m.s","stream":1}`)
		if f := peer.read(); f[0].Type != envelope.FrameChunk {
			t.Fatalf("got %+v; want the first chunk", f)
		}
		peer.write(`{"type":"cancel","seq":3}`)
		end := peer.read()[0]
		if end.Type != envelope.FrameEnd || end.Err == nil || end.Err.Code != envelope.CodeCancelled || end.N != 1 {
			t.Fatalf("after the cancel: %+v (%v); want an end CANCELLED after 1 chunk", end, end.Err)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if served.Serving() != 0 {
			t.Errorf("%d requests still served", served.Serving())
		}
	})
}

// TestRelayWindowParksOnBudget: a relay (the hub's side of a stream it
// forwards) passes on the caller's credit only while the connection
// holds less than its budget unwritten: with a caller that reads nothing,
// 100 chunks granted, 1 KiB each and a budget of 8 KiB, the feeder gets
// credit for a few chunks, not 100; once the caller reads, the parked
// stream goes on to the end.
func TestRelayWindowParksOnBudget(t *testing.T) {
	for _, tc := range []struct {
		name    string
		budget  int
		small   int // the first chunk's size
		size    int // the others'
		maxHeld int // bytes relayed at most while the caller reads nothing
	}{
		{"1-KiB chunks", 8 << 10, 1000, 1000, 16 << 10},
		// A tiny first chunk, then large ones: the relay's byte window
		// holds them to its share, whatever the first chunk's size said.
		{"a tiny chunk, then 32-KiB ones", 64 << 10, 1, 32 << 10, 2*(64<<10) + 32<<10},
	} {
		t.Run(tc.name, func(t *testing.T) { relayParks(t, tc.budget, tc.small, tc.size, tc.maxHeld) })
	}
}

func relayParks(t *testing.T, budget, small, size, maxHeld int) {
	synctest.Test(t, func(t *testing.T) {
		sws, cws := wspipe.Pair(t)
		first := json.RawMessage(`"` + strings.Repeat("x", max(small-2, 0)) + `"`)
		chunk := json.RawMessage(`"` + strings.Repeat("x", size-2) + `"`)
		var passed, relayed, relayedBytes atomic.Int64
		served := New(sws, Config{MaxUnwrittenBytes: budget}, Accepted(), WithHandler(func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
			// A feeder that keeps to the credit it is given, as an
			// agent's link does: chunks, and bytes (overshooting by a
			// chunk at most).
			sink := stream.From(ctx)
			grants := make(chan stream.Credit, 1000)
			c := sink.Attach(func(n stream.Credit) { passed.Add(int64(n.Chunks)); grants <- n })
			passed.Add(int64(c.Chunks))
			chunks, bytes := int64(c.Chunks), int64(c.Bytes)
			defer sink.Attach(nil)
			for relayed.Load() < 100 {
				for chunks == 0 || bytes <= 0 {
					select {
					case n := <-grants:
						chunks += int64(n.Chunks)
						bytes += int64(n.Bytes)
					case <-ctx.Done():
						return nil, ctx.Err()
					}
				}
				c := chunk
				if relayed.Load() == 0 {
					c = first
				}
				if err := sink.Chunk(c); err != nil {
					return nil, err
				}
				chunks--
				bytes -= int64(len(c))
				relayed.Add(1)
				relayedBytes.Add(int64(len(c)))
			}
			return &envelope.Response{}, nil
		}))
		t.Cleanup(served.Close)
		peer := rawPeer{t, cws}
		peer.write(`{"type":"req","seq":1,"id":"s","method":"m.s","stream":100}`)
		synctest.Wait()
		if r := relayedBytes.Load(); r > int64(maxHeld) {
			t.Fatalf("with the caller reading nothing: %d chunks, %d bytes relayed; want at most %d bytes (budget %d)", relayed.Load(), r, maxHeld, budget)
		}
		t.Logf("parked after %d chunks, %d bytes relayed (budget %d)", relayed.Load(), relayedBytes.Load(), budget)
		var got int
		for end := false; !end; {
			for _, f := range peer.read() {
				switch f.Type {
				case envelope.FrameChunk:
					got++
				case envelope.FrameEnd:
					if f.N != 100 || got != 100 {
						t.Fatalf("the end after %d chunks says %d; want 100", got, f.N)
					}
					end = true
				}
			}
		}
	})
}

// TestStreamSendersShareCredit: senders of one stream waiting for credit
// all go on when a grant covers them (no sender waits on credit another
// left unused).
func TestStreamSendersShareCredit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sws, cws := wspipe.Pair(t)
		var sent atomic.Int64
		served := New(sws, Config{}, WithHandler(func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
			s := stream.SenderFrom(ctx)
			done := make(chan error, 3)
			for range 3 {
				go func() {
					err := s.Send(ctx, json.RawMessage(`1`))
					sent.Add(1)
					done <- err
				}()
			}
			for range 3 {
				if err := <-done; err != nil {
					return nil, err
				}
			}
			return &envelope.Response{}, nil
		}))
		t.Cleanup(served.Close)
		peer := rawPeer{t, cws}
		peer.write(`{"type":"req","seq":5,"id":"s","method":"m.s","stream":1}`)
		peer.read()
		synctest.Wait()
		if n := sent.Load(); n != 1 {
			t.Fatalf("with 1 chunk of credit, %d of 3 senders sent", n)
		}
		peer.write(`{"type":"credit","seq":5,"n":2}`)
		synctest.Wait()
		if n := sent.Load(); n != 3 {
			t.Fatalf("after a grant of 2, %d of 3 senders sent; want all", n)
		}
	})
}
