package wsconn

// The writer of a Conn: one goroutine, started on the first frame queued
// and lingering a little after the last, that coalesces queued frames
// into few writes.

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sync"
	"time"

	"github.com/agentmesh/agentmesh/internal/mono"
)

// writeLoop writes what is queued, batch by batch, until the queue stays
// empty for writerLinger or the connection closes.
func (c *Conn) writeLoop() {
	defer c.wg.Done()
	var linger *time.Timer
	lastWrite := int64(math.MinInt64 / 2) // mono; long ago
	batched := false                      // the last write carried more than one frame
	defer func() {
		if linger != nil {
			linger.Stop()
		}
	}()
	for {
		c.qmu.Lock()
		for len(c.q) == 0 {
			if c.closed {
				c.writerOn = false
				c.qmu.Unlock()
				return
			}
			c.idle = true
			c.qmu.Unlock()
			if linger == nil {
				linger = time.NewTimer(writerLinger)
			} else {
				linger.Reset(writerLinger)
			}
			select {
			case <-c.wake:
			case <-c.closing:
			case <-linger.C:
			}
			c.qmu.Lock()
			c.idle = false
			if len(c.q) == 0 && !c.closed {
				select {
				case <-c.wake:
					continue // a frame came and went? look again
				default:
				}
				c.writerOn = false
				c.qmu.Unlock()
				return
			}
		}
		now := mono.Now()
		if len(c.q) == 1 && !c.closed && (batched || now-lastWrite < int64(batchYieldGap)) {
			// Frames are coming in bursts (the last write carried
			// several, or this one follows it closely): let the
			// goroutines that are about to queue a frame do so, so that
			// one write carries them all: one batch on a native link,
			// messages back to back on a text one (a plain JSON-RPC
			// client over this layer wrote 0.66 times per call while
			// only native links yielded, 0.11 since; see
			// BenchmarkTextBurstWrites). A lone frame after a pause
			// goes out at once: the yield would queue it behind every
			// runnable goroutine, which on a hub busy with other
			// connections adds up for a call crossing four links (S26).
			c.qmu.Unlock()
			runtime.Gosched()
			c.qmu.Lock()
		}
		lastWrite = now
		frames := c.q
		batched = len(frames) > 1
		c.q = c.spare[:0]
		c.spare = nil
		c.writing.Store(int32(len(frames)))
		var taken int64 // the owed frames' bytes, out of qbytes once written
		var takenN int
		if c.bp {
			for _, n := range c.acc {
				if n > 0 {
					taken += int64(n)
					takenN++
				}
			}
			c.acc = c.acc[:0]
		}
		if c.room != nil {
			close(c.room)
			c.room = nil
		}
		closed := c.closed
		c.qmu.Unlock()

		var err error
		if closed {
			for _, b := range frames {
				PutBuf(b)
			}
		} else {
			c.wmu.Lock()
			err = c.writeFrames(frames)
			c.wmu.Unlock()
		}
		clear(frames)
		c.writing.Store(0)
		c.qmu.Lock()
		if c.spare == nil {
			c.spare = frames[:0]
		}
		c.qbytes.Add(-taken)
		c.qowed.Add(-int64(takenN))
		c.wakeReaderLocked()
		c.qmu.Unlock()
		if c.drained != nil && c.TakeDrained() {
			c.drained()
		}
		if err != nil {
			c.Shutdown(err)
		}
	}
}

// writeFrames writes frames in order: as batches on a native link (one
// message of many frames), several messages in one write otherwise. It
// returns every buffer to the pool.
func (c *Conn) writeFrames(frames []*[]byte) error {
	var err error
	for len(frames) > 0 && err == nil {
		if c.raw != nil {
			if err = c.waitSendRoom(c.nextWrite(frames)); err != nil {
				break
			}
		}
		var n, used int
		if len(frames) > 1 {
			n, used, err = c.writeGroup(frames)
		} else {
			n, used = len(*frames[0]), 1
			err = c.writeMessage(*frames[0])
			PutBuf(frames[0])
		}
		if c.cfg.Bytes != nil {
			c.cfg.Bytes(0, n)
		}
		frames = frames[used:]
	}
	for _, b := range frames {
		PutBuf(b) // not written: the connection is going
	}
	return err
}

// closeReserve is the room waitSendRoom keeps free in the kernel's send
// buffer for what is written beside the writer: pings, pongs and the
// close frame (at most 2 + 4 + 125 bytes each).
const closeReserve = 4 << 10

// nextWrite is the size of the next write writeFrames makes from frames
// (as writeGroup picks them), with the WebSocket headers and a batch's
// brackets and commas.
func (c *Conn) nextWrite(frames []*[]byte) int {
	if len(frames) == 1 {
		return len(*frames[0]) + 14
	}
	used, n := c.group(frames)
	if !c.batch {
		return n + 14*used
	}
	return n + used + 1 + 14
}

// waitSendRoom waits until the kernel's send buffer can take n more
// bytes (keeping closeReserve free), so that a write never blocks with a
// frame cut in two: when the peer stops reading, the frames written are
// whole and a close frame can still follow them. The kernel holds at
// most half its buffer's size in data here (the buffer's size counts
// the kernel's own bookkeeping too). An empty queue takes any frame,
// even one larger than that. If the peer takes nothing of what is
// queued for WriteTimeout, it is a slow consumer (errSlowConsumer).
//
// Looking costs two system calls; it is done only once the bytes written
// since the last look could exceed the room seen then (credit), so a
// connection whose peer keeps up looks about once per half-buffer.
func (c *Conn) waitSendRoom(n int) error {
	if c.credit >= n {
		c.credit -= n
		return nil
	}
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	last, progress := -1, time.Now()
	delay := 50 * time.Microsecond
	for {
		q, size, ok := sendQueue(c.raw)
		if !ok {
			c.raw = nil // not a socket that says: write as before
			c.credit = 0
			c.roomKept.Store(false)
			return nil
		}
		room := size/2 - q - closeReserve
		if room >= n || q == 0 {
			c.credit = room - n
			return nil
		}
		now := time.Now()
		if last < 0 || q < last {
			progress = now // the peer took bytes
		}
		last = q
		if now.Sub(progress) >= c.cfg.WriteTimeout {
			return errSlowConsumer
		}
		if t == nil {
			t = time.NewTimer(delay)
		} else {
			t.Reset(delay)
		}
		select {
		case <-t.C:
		case <-c.closing:
			return errConnClosed
		}
		delay = min(2*delay, 5*time.Millisecond)
	}
}

// batchYieldGap: a frame queued within this long of the previous write
// means a burst, worth a scheduler round to batch what follows.
const batchYieldGap = 200 * time.Microsecond

// maxBatchFrames bounds the frames one write carries.
const maxBatchFrames = 128

// writeGroup writes the first frames in one write, at most
// maxBatchFrames and half the peer's message limit, and reports how many
// it used (at least one) and their bytes. On a native link (batch) they
// go as one message: a JSON array, or (binary) frames that each carry
// their length; otherwise each is its own message (a plain JSON-RPC
// client's answers, which cannot share one).
func (c *Conn) writeGroup(frames []*[]byte) (n, used int, err error) {
	used, n = c.group(frames)
	b := groupPool.Get().(*[]byte)
	switch {
	case !c.batch || used == 1:
		for _, f := range frames[:used] {
			*b = c.wire.appendMessage(*b, c.msgType, *f)
		}
	case c.binary:
		var mask int
		*b, mask = c.wire.appendHeader(*b, c.msgType, n)
		for _, f := range frames[:used] {
			*b = append(*b, *f...)
		}
		maskFrom(*b, mask)
	default:
		var mask int
		*b, mask = c.wire.appendHeader(*b, c.msgType, n+used+1)
		sep := byte('[')
		for _, f := range frames[:used] {
			*b = append(append(*b, sep), *f...)
			sep = ','
		}
		*b = append(*b, ']')
		maskFrom(*b, mask)
	}
	for _, f := range frames[:used] {
		PutBuf(f)
	}
	err = c.writeWire(*b, time.Now().Add(c.cfg.WriteTimeout), false)
	if cap(*b) <= maxGroupKept {
		*b = (*b)[:0]
		groupPool.Put(b)
	}
	return n, used, err
}

// groupPool holds writeGroup's buffers apart from the frames' (GetBuf).
// A group is up to maxBatchFrames frames, tens of KiB; back in the
// frames' pool it became some later answer's buffer, and an answer owed
// to a peer counts what its buffer holds (its capacity) towards
// MaxUnwrittenBytes: 64 answers of 200 bytes in group-sized buffers made
// 4 MiB, and a JSON-RPC client with 128 calls in flight was refused with
// OVERLOADED (TestGroupBuffersStayApart).
var groupPool = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

// maxGroupKept is the largest group buffer kept for reuse: a group holds
// at most half of Limits.MaxBytes (1 MiB by default) of frames.
const maxGroupKept = 1 << 20

// group is how many of frames writeGroup writes at once, and their
// bytes (without WebSocket headers or a batch's brackets and commas).
func (c *Conn) group(frames []*[]byte) (used, n int) {
	budget := c.cfg.Limits.MaxBytes / 2
	used, n = 1, len(*frames[0])
	for used < len(frames) && used < maxBatchFrames && n+len(*frames[used])+1 <= budget {
		n += len(*frames[used])
		used++
	}
	return used, n
}

// trySend queues a frame without waiting; false if the queue is full or
// the connection closed. The buffer belongs to the connection afterwards.
// It is for this side's own frames (requests, cancels): they do not count
// towards the bounds of what is owed to the peer.
func (c *Conn) TrySend(b *[]byte) bool {
	if ok, _ := c.enqueue(b, false, false); ok {
		return true
	}
	PutBuf(b)
	return false
}

// SendCtx queues one of this side's own frames, as TrySend does, waiting
// for room while the queue is full until ctx ends or the connection
// closes. It reports whether it queued b; the buffer belongs to the
// connection afterwards either way.
func (c *Conn) SendCtx(ctx context.Context, b *[]byte) bool {
	ok, room := c.enqueue(b, true, false)
	for !ok && room != nil {
		select {
		case <-room:
		case <-c.closing:
			room = nil
			continue
		case <-ctx.Done():
			room = nil
			continue
		}
		ok, room = c.enqueue(b, true, false)
	}
	if !ok {
		PutBuf(b)
	}
	return ok
}

// send queues a frame, waiting up to WriteTimeout for room; a peer that
// does not drain its queue for that long is cut off. It is for frames
// owed to the peer (answers): with backpressure they count towards
// MaxUnwrittenBytes and MaxUnwrittenCalls until written.
func (c *Conn) Send(b *[]byte) bool {
	ok, room := c.enqueue(b, true, true)
	if ok {
		return true
	}
	return c.sendWait(b, room)
}

// TrySendOwed queues a frame owed to the peer, as Send does, if there is
// room now; otherwise wait, when not nil, finishes the send as Send would
// (and reports whether it queued the frame). The buffer belongs to the
// connection afterwards either way.
func (c *Conn) TrySendOwed(b *[]byte) (wait func() bool) {
	ok, room := c.enqueue(b, true, true)
	switch {
	case ok:
		return nil
	case room == nil: // closed
		PutBuf(b)
		return nil
	}
	return func() bool { return c.sendWait(b, room) }
}

// sendWait waits for room for b, which found the queue full (room: the
// writer's next take), as Send does.
func (c *Conn) sendWait(b *[]byte, room <-chan struct{}) bool {
	return c.sendWaitLimit(b, room, c.cfg.QueueSize)
}

// sendWaitLimit is sendWait for a queue bounded at limit frames.
func (c *Conn) sendWaitLimit(b *[]byte, room <-chan struct{}, limit int) bool {
	var ok bool
	var t *time.Timer
	for room != nil {
		if t == nil {
			t = time.NewTimer(c.cfg.WriteTimeout)
			defer t.Stop()
		}
		select {
		case <-room:
		case <-c.closing:
			PutBuf(b)
			return false
		case <-t.C:
			if c.bp {
				c.Shutdown(fmt.Errorf("%w: send queue full", errSlowConsumer))
			} else {
				c.Shutdown(fmt.Errorf("%w: send queue full", ErrNotReading))
			}
			PutBuf(b)
			return false
		}
		if ok, room = c.enqueueLimit(b, true, true, limit); ok {
			return true
		}
	}
	PutBuf(b)
	return false
}

// SendCredited queues a frame that flow control already bounds (a
// stream's chunk within its credit), whatever the queue's length, without
// waiting: it fails only when the connection is closed. It counts as owed
// to the peer (the backpressure bounds see it).
func (c *Conn) SendCredited(b *[]byte) bool {
	if ok, _ := c.enqueueAny(b, true); ok {
		return true
	}
	PutBuf(b)
	return false
}

// enqueue queues b unless the connection is closed or the queue is full;
// then, if wait, it returns a channel closed when the writer next takes
// frames out. It starts a writer if none runs, or wakes the idle one.
func (c *Conn) enqueue(b *[]byte, wait, owed bool) (ok bool, room <-chan struct{}) {
	return c.enqueueLimit(b, wait, owed, c.cfg.QueueSize)
}

// enqueueAny is enqueue with no bound on the queue's length.
func (c *Conn) enqueueAny(b *[]byte, owed bool) (ok bool, room <-chan struct{}) {
	return c.enqueueLimit(b, false, owed, math.MaxInt)
}

func (c *Conn) enqueueLimit(b *[]byte, wait, owed bool, limit int) (ok bool, room <-chan struct{}) {
	c.qmu.Lock()
	if c.closed {
		c.qmu.Unlock()
		return false, nil
	}
	if len(c.q) >= limit {
		if wait {
			if c.room == nil {
				c.room = make(chan struct{})
			}
			room = c.room
		}
		c.qmu.Unlock()
		return false, room
	}
	if c.lone() && len(c.q) == 0 && c.writing.Load() == 0 && c.wmu.TryLock() {
		// A lone frame (nothing queued or being written, nothing written
		// for inlineGap), and the kernel known to have room for it
		// (credit, kept by waitSendRoom on a connection with
		// backpressure): the sender writes it itself, which cannot block,
		// instead of waking the writer goroutine (a futex wake and a
		// goroutine switch per hop of a lone call). Frames that come in a
		// burst go to the writer, which puts them in one write.
		if n := len(*b) + 14; c.credit >= n {
			c.credit -= n
			c.writing.Store(1)
			c.qmu.Unlock()
			c.writeInline(b)
			return true, nil
		}
		c.wmu.Unlock()
	}
	c.q = append(c.q, b)
	if c.bp {
		var n int32
		if owed {
			n = int32(cap(*b)) // what it holds, not what it says
			c.qbytes.Add(int64(n))
			c.qowed.Add(1)
		}
		c.acc = append(c.acc, n)
	}
	switch {
	case !c.writerOn:
		c.writerOn = true
		c.wg.Add(1) // under qmu, before closed is set: Close's Wait sees it
		go c.writeLoop()
	case c.idle:
		c.idle = false
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
	c.qmu.Unlock()
	return true, nil
}

// writeInline writes b on the sender's goroutine, which holds wmu and
// found the queue empty and room in the kernel for b (enqueueLimit).
func (c *Conn) writeInline(b *[]byte) {
	n := len(*b)
	err := c.writeMessage(*b)
	PutBuf(b)
	c.inlined.Add(1)
	c.wmu.Unlock()
	c.writing.Store(0)
	if c.cfg.Bytes != nil {
		c.cfg.Bytes(0, n)
	}
	if err != nil {
		c.Shutdown(err)
	}
}

// inlineGap: a frame queued this long after the one before, itself as
// long after its own, is lone (a call's hop, not part of a burst): its
// sender may write it itself (enqueueLimit).
const inlineGap = 50 * time.Microsecond

// lone reports, under qmu, for a frame being queued, whether it and the
// frame before it each came after inlineGap or more of quiet: frames that
// come one at a time (lone calls), not the start of a burst (the writer
// puts a burst in one write; an inline write of its first frame would be
// one more).
func (c *Conn) lone() bool {
	now := mono.Now()
	quiet := now-c.lastQueued >= int64(inlineGap)
	lone := quiet && c.prevQuiet
	c.lastQueued, c.prevQuiet = now, quiet
	return lone
}
