package wsconn

import "github.com/gorilla/websocket"

// What link sets and asks of its connection beyond sending: the budget
// relayed streams share, and the settings made before Start.

// Budget is what the connection may hold unwritten for its peer: the
// relayed streams' window (MaxUnwrittenBytes; 4 MiB when unbounded).
func (c *Conn) Budget() int {
	if m := c.cfg.MaxUnwrittenBytes; m > 0 {
		return m
	}
	return 4 << 20
}

// OverBudget reports that the bytes owed to the peer, queued or being
// written, reach the budget.
func (c *Conn) OverBudget() bool { return c.qbytes.Load() >= int64(c.Budget()) }

// OnDrained sets f to run on the writer after a write that left the
// bytes owed under the budget, once WantDrained was called since the
// last time (relayed streams parked on the budget). Set before Start.
func (c *Conn) OnDrained(f func()) { c.drained = f }

// WantDrained asks for the next OnDrained call.
func (c *Conn) WantDrained() { c.drainWanted.Store(true) }

// TakeDrained reports, once, a drain asked for and not yet reported
// while the connection is under its budget (for a caller that parked
// after the writer last looked).
func (c *Conn) TakeDrained() bool {
	return c.drainWanted.Load() && !c.OverBudget() && c.drainWanted.CompareAndSwap(true, false)
}

// Batched makes the connection send frames queued together as one
// JSON-array message (both ends of a native link read such batches).
// Set before Start.
func (c *Conn) Batched() { c.batch = true }

// Binary makes the connection send binary messages, and a batch the
// frames one after another (each carries its length: agentmesh.v2).
// Set before Start.
func (c *Conn) Binary() { c.binary, c.msgType = true, websocket.BinaryMessage }

// NoCallBound lifts the bound on running calls of a connection with
// backpressure (a peer hub's link). Set before Start.
func (c *Conn) NoCallBound() { c.noCallBound = true }

// Err reports why the connection closed; valid once Done is closed.
func (c *Conn) Err() error { return c.err }

// CloseWith returns a Shutdown cause closing the connection with the
// WebSocket close code and text.
func CloseWith(code int, text string) error { return &closeError{code: code, text: text} }

// SendControl queues a control frame of this side's own (a stream's
// grant of credit, a cancel) whatever the queue's length, without
// waiting: it must not be dropped, and it is not owed to the peer (the
// backpressure bounds do not count it). It fails only when the
// connection is closed.
func (c *Conn) SendControl(b *[]byte) bool {
	if ok, _ := c.enqueueAny(b, false); ok {
		return true
	}
	PutBuf(b)
	return false
}

// SendRoomy queues a frame owed to the peer as Send does, but waits while
// the queue is half full or more: for a stream's frames relayed in a
// protocol of the edge's own (SSE, JSON-RPC notifications, agentick,
// Multica), so that a stream holding back on a slow client leaves the
// rest of the queue to the connection's other frames, which are sent
// without waiting (a full queue there is a client not reading).
func (c *Conn) SendRoomy(b *[]byte) bool {
	limit := max(c.cfg.QueueSize/2, 1)
	ok, room := c.enqueueLimit(b, true, true, limit)
	switch {
	case ok:
		return true
	case room == nil: // closed
		PutBuf(b)
		return false
	}
	return c.sendWaitLimit(b, room, limit)
}
