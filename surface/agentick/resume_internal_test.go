package agentick

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentmesh/agentmesh/surface"
)

// ids lists the events' ids.
func ids(evs []agEvent) []uint64 {
	var out []uint64
	for _, e := range evs {
		out = append(out, e.id)
	}
	return out
}

// TestAgentickRing: the ring numbers its frames 1, 2, …, keeps the newest
// within its count and byte bounds (the newest always, however large),
// and answers "after id" with the events held and the gap before them.
func TestAgentickRing(t *testing.T) {
	r := newAgRing(4, 1<<20)
	if evs, from, to := r.after(0, 10, nil); len(evs) != 0 || to != 0 {
		t.Errorf("empty ring: after(0) = %v, gap %d..%d", ids(evs), from, to)
	}
	for i := 1; i <= 6; i++ {
		if id := r.add([]byte(fmt.Sprint(i))); id != uint64(i) {
			t.Fatalf("add %d: id %d", i, id)
		}
	}
	for _, tc := range []struct {
		after, n int
		want     []uint64
		from, to uint64
	}{
		{0, 10, []uint64{3, 4, 5, 6}, 1, 2}, // 1 and 2 dropped by the count bound
		{1, 10, []uint64{3, 4, 5, 6}, 2, 2},
		{2, 10, []uint64{3, 4, 5, 6}, 0, 0},
		{4, 10, []uint64{5, 6}, 0, 0},
		{6, 10, nil, 0, 0},
		{9, 10, nil, 0, 0},
		{2, 2, []uint64{3, 4}, 0, 0}, // at most n
	} {
		evs, from, to := r.after(uint64(tc.after), tc.n, nil)
		if !slices.Equal(ids(evs), tc.want) || from != tc.from || to != tc.to {
			t.Errorf("after(%d, %d) = %v, gap %d..%d; want %v, gap %d..%d", tc.after, tc.n, ids(evs), from, to, tc.want, tc.from, tc.to)
		}
	}
	if evs, _, _ := r.after(3, 1, nil); string(evs[0].frame) != "4" {
		t.Errorf("event 4's frame %q", evs[0].frame)
	}

	b := newAgRing(100, 10)
	for range 3 {
		b.add([]byte("abcd"))
	}
	if b.first() != 2 || b.bytes != 8 {
		t.Errorf("byte bound: held from %d, %d bytes; want from 2, 8 bytes", b.first(), b.bytes)
	}
	b.add(make([]byte, 25))
	if b.first() != 4 || b.last != 4 || b.bytes != 25 {
		t.Errorf("an event past the byte bound: held %d..%d, %d bytes; want it alone", b.first(), b.last, b.bytes)
	}
	if evs, from, to := b.after(1, 10, nil); !slices.Equal(ids(evs), []uint64{4}) || from != 2 || to != 3 {
		t.Errorf("after(1) = %v, gap %d..%d", ids(evs), from, to)
	}
}

// noAuth is a host without authentication: attachSSE asks it.
type noAuth struct{ surface.Host }

func (noAuth) AuthOn() bool { return false }

func testGateway() *gateway {
	return &gateway{h: noAuth{}, clients: map[string]*agClient{}, sessions: map[string]*agSession{}, activity: map[string]time.Time{}}
}

// testSSEClient is a new SSE client of gw (what serveEvents makes).
func testSSEClient(gw *gateway, id string) *agClient {
	ctx, cancel := context.WithCancel(context.Background())
	c := &agClient{gw: gw, id: id, ctx: ctx, cancel: cancel, subs: map[string]*agSub{}, channels: map[string]struct{}{}}
	gw.sseClient(c)
	return c
}

func testConn() *agConn {
	ctx, cancel := context.WithCancel(context.Background())
	return &agConn{ctx: ctx, cancel: cancel}
}

// open attaches a connection to client id as serveEvents does: it returns
// the client it got (or nil, the refusal), the id it writes after and
// whether it resumed.
func open(t *testing.T, gw *gateway, id string, last uint64, given bool) (*agClient, *agConn, uint64, bool, *agError) {
	t.Helper()
	fresh := testSSEClient(gw, id)
	conn := testConn()
	c, from, resumed, e := gw.attachSSE(fresh, conn, last, given)
	if c != fresh {
		fresh.cancel()
	}
	return c, conn, from, resumed, e
}

// drain is the writer: the events conn is to write now, marked written.
func drain(c *agClient, conn *agConn) (evs []agEvent, from, to uint64) {
	evs, from, to, _, ok := c.sse.next(conn, nil)
	if !ok {
		return nil, 0, 0
	}
	upTo := to
	if len(evs) > 0 {
		upTo = evs[len(evs)-1].id
	}
	c.sse.wrote(conn, upTo)
	return evs, from, to
}

// TestAgentickSSEGrace: a client whose stream ended is kept for the grace
// period, events going into its ring and a streaming method waiting; a
// resume within it replays what the stream had not written and lets the
// method go on; the grace period's end detaches the client (its context
// ends, the waiting method gives up, the id is free again).
func TestAgentickSSEGrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gw := testGateway()
		c, conn1, from, resumed, e := open(t, gw, "g", 0, false)
		if e != nil || from != 0 || resumed {
			t.Fatalf("first stream: from %d, resumed %v, %v", from, resumed, e)
		}
		for i := range 3 {
			c.push(fmt.Appendf(nil, "e%d", i+1))
		}
		evs, _, _, _, _ := c.sse.next(conn1, nil)
		c.sse.wrote(conn1, evs[1].id) // the third did not make it
		gw.releaseSSE(c, conn1)
		if conn1.ctx.Err() == nil {
			t.Error("the ended connection's context is live")
		}

		time.Sleep(agentickResumeGrace - time.Millisecond)
		synctest.Wait()
		if gw.client("g") != c || c.ctx.Err() != nil {
			t.Fatal("the client is gone within its grace period")
		}
		if !c.push([]byte("e4")) {
			t.Fatal("push in the grace period refused")
		}
		streamed := make(chan bool, 1)
		go func() { streamed <- c.stream(context.Background(), []byte("chunk")) }()
		synctest.Wait()
		select {
		case ok := <-streamed:
			t.Fatalf("a stream's event went out with no connection (%v)", ok)
		default:
		}

		got, conn2, from, resumed, e := open(t, gw, "g", 2, true)
		if e != nil || got != c || from != 2 || !resumed {
			t.Fatalf("resume after 2: client %p (want %p), from %d, resumed %v, %v", got, c, from, resumed, e)
		}
		synctest.Wait()
		if ok := <-streamed; !ok {
			t.Fatal("the waiting stream's event was refused after the resume")
		}
		if evs, _, to := drain(c, conn2); !slices.Equal(ids(evs), []uint64{3, 4, 5}) || to != 0 || string(evs[2].frame) != "chunk" {
			t.Errorf("replay after 2: %v, gap to %d; want 3, 4, 5 (the stream's chunk last), no gap", ids(evs), to)
		}
		time.Sleep(2 * agentickResumeGrace) // the first grace timer is stopped
		synctest.Wait()
		if gw.client("g") != c || c.ctx.Err() != nil {
			t.Fatal("a resumed client was detached by its old grace timer")
		}

		gw.releaseSSE(c, conn2)
		go func() { streamed <- c.stream(context.Background(), []byte("late")) }()
		time.Sleep(agentickResumeGrace + time.Millisecond)
		synctest.Wait()
		if gw.client("g") != nil || c.ctx.Err() == nil {
			t.Fatal("the client outlived its grace period")
		}
		if ok := <-streamed; ok {
			t.Error("a stream waiting past the grace period succeeded")
		}
		if c.push([]byte("x")) {
			t.Error("push to a detached client succeeded")
		}
		if got, _, from, resumed, e := open(t, gw, "g", 5, true); e != nil || got == c || from != 0 || resumed {
			t.Errorf("after the grace period: resumed %v from %d (%v); want a new client", resumed, from, e)
		}
	})
}

// TestAgentickSSEAttach: the second stream of a live clientId is refused
// unless it resumes an id the client issued, which takes over (the old
// connection ends); in the grace period a request that does not resume
// replaces the client (detached at once); killAll ends a client in its
// grace period without waiting for the timer.
func TestAgentickSSEAttach(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gw := testGateway()
		c, conn1, _, _, _ := open(t, gw, "a", 0, false)
		c.push([]byte("e1"))
		c.push([]byte("e2"))
		for _, tc := range []struct {
			last  uint64
			given bool
		}{{0, false}, {3, true}, {^uint64(0), true}} {
			if got, _, _, _, e := open(t, gw, "a", tc.last, tc.given); got != nil || e == nil || e.Code != agStateComplete || e.httpStatus() != 409 {
				t.Errorf("second stream (Last-Event-ID %d given %v): %v; want 409 STATE_ALREADY_COMPLETE", tc.last, tc.given, e)
			}
		}
		if conn1.ctx.Err() != nil || gw.client("a") != c {
			t.Fatal("a refused stream disturbed the live one")
		}
		got, conn2, from, resumed, e := open(t, gw, "a", 1, true)
		if e != nil || got != c || from != 1 || !resumed {
			t.Fatalf("takeover: %v, from %d, resumed %v", e, from, resumed)
		}
		if conn1.ctx.Err() == nil {
			t.Error("the old connection was not closed by the takeover")
		}
		gw.releaseSSE(c, conn1) // its handler returns: the client stays
		if evs, _, _ := drain(c, conn2); !slices.Equal(ids(evs), []uint64{2}) {
			t.Errorf("takeover replay %v; want 2", ids(evs))
		}
		if c.ctx.Err() != nil {
			t.Fatal("the old connection's end detached the client")
		}

		gw.releaseSSE(c, conn2)
		fresh, _, from, resumed, e := open(t, gw, "a", 0, false)
		if e != nil || fresh == c || from != 0 || resumed {
			t.Fatalf("a new stream in the grace period: %v, from %d, resumed %v", e, from, resumed)
		}
		synctest.Wait() // kill ends the grace period at once, off the caller's goroutine
		if c.ctx.Err() == nil || gw.client("a") != fresh {
			t.Error("the replaced client in its grace period was not detached")
		}

		k, kconn, _, _, _ := open(t, gw, "k", 0, false)
		gw.releaseSSE(k, kconn)
		gw.killAll()
		if k.ctx.Err() == nil || gw.client("k") != nil {
			t.Error("killAll left a client in its grace period")
		}
	})
}
