package agentick

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// SSE resume: an /events client numbers its events and keeps the newest
// in a ring, and outlives its connection for a grace period, so that an
// EventSource reconnecting with Last-Event-ID gets what it missed.
//
// Its state, agSSE, is the event log of one clientId: the ids issued (1,
// 2, … in the order the events were queued), the ring of the newest, the
// live connection if any and how far that connection has written. The
// connection's handler (serveEvents) is only a writer: it writes what the
// ring holds after its cursor, then waits for more. Subscriptions, the
// channel fan-out and streaming methods write into the log whether or
// not a connection is live; while none is, the grace timer runs.

const (
	// agentickRingEvents and agentickRingBytes bound the events an SSE
	// client keeps for a resume: the newest 1024, and at most 1 MiB of
	// frames (the newest event is always kept, however large). A turn of
	// the scripted provider is a few hundred events of ~150 bytes; a
	// reader that falls further behind, or stays away longer, gets a gap.
	agentickRingEvents = 1024
	agentickRingBytes  = 1 << 20
	// agentickRetryMs is the reconnect delay each stream suggests
	// (retry:): EventSource's default is 3 s, long for a dropped stream
	// when the gateway keeps the client for agentickResumeGrace.
	agentickRetryMs = 1000
	// agentickStreamAhead bounds how far a streaming method's events may
	// run ahead of what the live connection has written: a slow reader
	// holds the stream back, and its events never crowd the ring.
	agentickStreamAhead = 32
	// agentickWriteBatch is how many events a writer takes from the ring
	// per flush.
	agentickWriteBatch = 64
)

// agentickResumeGrace is how long an SSE client is kept after its
// connection dropped (its subscriptions, ids and ring), waiting for a
// resume. A variable so that tests shorten it, as agentickKeepAlive.
var agentickResumeGrace = 30 * time.Second

// ---- the ring ----

// agEvent is a numbered frame.
type agEvent struct {
	id    uint64
	frame []byte
}

// agRing holds the newest numbered frames within its bounds. Ids are
// consecutive: the events held are first()..last.
type agRing struct {
	evs       []agEvent // oldest first
	bytes     int       // of the frames held
	maxEvents int
	maxBytes  int
	last      uint64 // id of the newest event; 0 before the first
}

func newAgRing(maxEvents, maxBytes int) *agRing {
	return &agRing{maxEvents: maxEvents, maxBytes: maxBytes}
}

// add numbers frame (the next id), holds it and drops the oldest events
// beyond the bounds; it returns the id.
func (r *agRing) add(frame []byte) uint64 {
	r.last++
	r.evs = append(r.evs, agEvent{r.last, frame})
	r.bytes += len(frame)
	for len(r.evs) > 1 && (len(r.evs) > r.maxEvents || r.bytes > r.maxBytes) {
		r.bytes -= len(r.evs[0].frame)
		r.evs[0] = agEvent{} // the array keeps no dropped frame alive
		r.evs = r.evs[1:]
	}
	return r.last
}

// first is the id of the oldest event held (last+1 when none is).
func (r *agRing) first() uint64 { return r.last - uint64(len(r.evs)) + 1 }

// after appends to dst the events held after id, at most n, and returns
// them with the gap: the ids after id that are no longer held, from..to
// (to == 0: none missing).
func (r *agRing) after(id uint64, n int, dst []agEvent) (evs []agEvent, from, to uint64) {
	if id >= r.last {
		return dst, 0, 0
	}
	first := r.first()
	if id+1 < first {
		from, to = id+1, first-1
		id = first - 1
	}
	i := int(id + 1 - first)
	end := min(len(r.evs), i+n)
	return append(dst, r.evs[i:end]...), from, to
}

// ---- an SSE client's event log ----

// agConn is one /events connection of a client.
type agConn struct {
	ctx    context.Context // ends with the request, or when another takes over
	cancel context.CancelFunc
}

// agSSE is the event log of an SSE client: it outlives the client's
// connections, and lives as long as the client (until detach).
type agSSE struct {
	done <-chan struct{} // the client's ctx.Done()

	mu    sync.Mutex
	ring  *agRing
	wake  chan struct{} // closed and replaced at each change: an event, a write, the connection
	conn  *agConn       // the live connection; nil while in grace
	sent  uint64        // the newest id the live connection has written (or resumed after)
	timer *time.Timer   // the grace period running, while conn is nil
	gen   uint64        // counts connections and releases: a stale grace timer does nothing
	dead  bool          // detached, or being detached: no resume, no new events
}

func newAgSSE(done <-chan struct{}) *agSSE {
	return &agSSE{done: done, ring: newAgRing(agentickRingEvents, agentickRingBytes), wake: make(chan struct{})}
}

// signal wakes the waiters (s.mu held).
func (s *agSSE) signal() {
	close(s.wake)
	s.wake = make(chan struct{})
}

// push queues an event without waiting; false: the client is gone.
func (s *agSSE) push(frame []byte) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return false
	}
	s.ring.add(frame)
	s.signal()
	return true
}

// stream queues a streaming method's event once a connection is live and
// has written all but agentickStreamAhead of the events before it: while
// the client is away (its grace period) the stream waits for its return.
// False: ctx ended, or the client is gone (its grace period passed).
func (s *agSSE) stream(ctx context.Context, frame []byte) bool {
	for {
		s.mu.Lock()
		if s.dead {
			s.mu.Unlock()
			return false
		}
		if s.conn != nil && s.ring.last-s.sent < agentickStreamAhead {
			s.ring.add(frame)
			s.signal()
			s.mu.Unlock()
			return true
		}
		wake := s.wake
		s.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return false
		case <-s.done:
			return false
		}
	}
}

// open makes conn the live connection, writing the events after id; a
// connection live until now is closed (a resume takes over). s.mu held.
func (s *agSSE) open(conn *agConn, id uint64) {
	if s.conn != nil {
		s.conn.cancel()
	}
	if s.timer != nil {
		s.timer.Stop()
		s.timer = nil
	}
	s.gen++
	s.conn, s.sent = conn, id
	s.signal()
}

// resumable reports whether a request carrying Last-Event-ID id resumes
// this log: it is alive and issued id (0: the connected frame of a new
// client). s.mu held.
func (s *agSSE) resumable(id uint64) bool {
	return !s.dead && id <= s.ring.last
}

// next returns the events conn is to write next (at most
// agentickWriteBatch, appended to dst) and the gap before them (to == 0:
// none), or ok false once conn is no longer the live connection. wake is
// closed when there may be more.
func (s *agSSE) next(conn *agConn, dst []agEvent) (evs []agEvent, from, to uint64, wake <-chan struct{}, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != conn || s.dead {
		return dst, 0, 0, nil, false
	}
	evs, from, to = s.ring.after(s.sent, agentickWriteBatch, dst)
	return evs, from, to, s.wake, true
}

// wrote records that conn has written the events up to id.
func (s *agSSE) wrote(conn *agConn, id uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == conn && id > s.sent {
		s.sent = id
		s.signal()
	}
}

// release ends conn. When conn was the live connection of a client that
// is not ending, the grace period starts: expire runs at its end unless a
// resume came first. It reports whether the caller detaches the client
// now (it is ending).
func (s *agSSE) release(conn *agConn, expire func()) (detach bool) {
	conn.cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn != conn {
		return false // taken over by a resume
	}
	s.conn = nil
	s.gen++
	s.signal()
	if s.dead || chanClosed(s.done) {
		s.dead = true
		return true
	}
	gen := s.gen
	s.timer = time.AfterFunc(agentickResumeGrace, func() {
		if s.expired(gen) {
			expire()
		}
	})
	return false
}

// expired reports whether the grace period that release numbered gen
// ends the client now (no resume came, nothing else ended it).
func (s *agSSE) expired(gen uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead || s.conn != nil || s.gen != gen {
		return false
	}
	s.dead = true
	return true
}

// close ends the client's transport (kill): the live connection's
// handler detaches it; a client in its grace period has none, so its
// grace period ends now (the timer detaches it; kill must not wait).
func (s *agSSE) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.conn != nil:
		s.conn.cancel()
	case s.timer != nil && !s.dead:
		s.timer.Reset(0)
	}
}

// idle claims a client in its grace period for detaching (killAll, which
// may wait): true when the caller is to detach it.
func (s *agSSE) idle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead || s.conn != nil {
		return false
	}
	s.dead = true
	if s.timer != nil {
		s.timer.Stop()
	}
	return true
}

// shut marks the log dead (detach): no more events, no resume; the
// streams waiting and the writer end.
func (s *agSSE) shut() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dead = true
	if s.timer != nil {
		s.timer.Stop()
	}
	if s.conn != nil {
		s.conn.cancel()
	}
	s.signal()
}

func chanClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// ---- the gateway's side ----

// sseClient makes c an SSE client: its events go to its log.
func (gw *gateway) sseClient(c *agClient) {
	s := newAgSSE(c.ctx.Done())
	c.sse = s
	c.push = s.push
	c.stream = s.stream
	c.close = s.close
}

// lastEventID is the id a request resumes after: the Last-Event-ID
// header, or the lastEventId query parameter (for EventSource polyfills
// that cannot set headers). given is false when it has none; an id that
// is not a number this gateway issues is math.MaxUint64, which no client
// has issued.
func lastEventID(r *http.Request) (id uint64, given bool) {
	v := r.Header.Get("Last-Event-ID")
	if v == "" {
		v = r.URL.Query().Get("lastEventId")
	}
	if v = strings.TrimSpace(v); v == "" {
		return 0, false
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return math.MaxUint64, true
	}
	return n, true
}

// attachSSE gives /events connection conn its client: c (new, an SSE
// client) or the client of that id that conn resumes. A request carrying
// Last-Event-ID id (given) resumes the SSE client of that id, in its
// grace period or live, when that client issued id and is the same
// caller; a live client's connection is closed (the request is the
// reconnect of a stream whose end the gateway has not noticed yet). It
// returns the client and the id to write after (0 for c), whether it
// resumed, or the refusal: GUARD_DENIED for another caller's clientId,
// STATE_ALREADY_COMPLETE (HTTP 409) when the id has a live client (its
// WebSocket, or an event stream) that the request does not resume. A
// client in its grace period that the request does not resume is
// replaced by c.
func (gw *gateway) attachSSE(c *agClient, conn *agConn, id uint64, given bool) (*agClient, uint64, bool, *agError) {
	gw.mu.Lock()
	if gw.closed {
		gw.mu.Unlock()
		return nil, 0, false, agErr(agInternalError, "hub is shutting down")
	}
	old := gw.clients[c.id]
	if old != nil && gw.h.AuthOn() && !sameSubject(old.who, c.who) {
		gw.mu.Unlock()
		return nil, 0, false, agErr(agGuardDenied, "clientId %q is connected as another caller", c.id)
	}
	if old != nil && old.ctx.Err() == nil {
		if old.sse == nil {
			gw.mu.Unlock()
			return nil, 0, false, agErr(agStateComplete, "clientId %q is connected on a WebSocket", c.id)
		}
		s := old.sse
		s.mu.Lock()
		switch {
		case given && s.resumable(id):
			s.open(conn, id)
			s.mu.Unlock()
			gw.mu.Unlock()
			return old, id, true, nil
		case s.conn != nil && !s.dead:
			s.mu.Unlock()
			gw.mu.Unlock()
			return nil, 0, false, agErr(agStateComplete,
				"clientId %q already has a live event stream: resume it with the Last-Event-ID of its last event, or use another clientId", c.id)
		}
		s.mu.Unlock()
	}
	c.sse.mu.Lock()
	c.sse.open(conn, 0)
	c.sse.mu.Unlock()
	gw.clients[c.id] = c
	gw.mu.Unlock()
	if old != nil {
		old.kill()
	}
	return c, 0, false, nil
}

// releaseSSE ends conn, a connection of c: the grace period starts, or c
// goes now when it is ending anyway.
func (gw *gateway) releaseSSE(c *agClient, conn *agConn) {
	if c.sse.release(conn, func() { gw.detach(c) }) {
		gw.detach(c)
	}
}

// agentickGapFrame names the events a resumed stream has lost: ids
// from..to, no longer in the ring.
func agentickGapFrame(from, to uint64) []byte {
	b, _ := json.Marshal(struct {
		Type string `json:"type"`
		From uint64 `json:"from"`
		To   uint64 `json:"to"`
	}{"gap", from, to})
	return b
}
