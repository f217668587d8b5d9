package wsconn

import (
	"io"
	"runtime"
	"sync"

	"github.com/agentmesh/agentmesh/envelope"
)

// scratch holds read buffers: a message is read into one, checked there,
// and copied out at its exact size only if it passed. A message refused
// while it is read (over the limit, a broken stream) or by its checks
// (invalid JSON or UTF-8, too deep, a batch too big) then allocates
// nothing, and a valid one allocates exactly its size instead of the
// doublings of a growing buffer: under a flood of hostile input the hub's
// garbage stays small and so do the collector's pauses and assists on
// everyone else's calls (S26).
var scratch = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

// bigScratch keeps a few buffers that grew past 64 KiB across garbage
// collections (a sync.Pool drops its items within two): a flood of large
// messages reuses them instead of growing a new one per message. It holds
// at most 4 (4.25 MiB at the default 1 MiB limit: S26 bounds the hub's
// heap at 2 × the limit × 10 attackers over its baseline).
var bigScratch = make(chan []byte, 4)

// ReadExact reads r to EOF, refusing (with the reader's own error) past
// what r allows, and returns a new slice of exactly the bytes read.
func ReadExact(r io.Reader, limit int) ([]byte, error) {
	data, _, err := ReadChecked(r, nil, limit, nil, 0)
	return data, err
}

// pacer is a connection that can slow its reader down when a large
// message trickles in (readAhead.pace).
type pacer interface{ pace() bool }

// ReadChecked is ReadExact with a check applied to the message in the
// scratch buffer: if check refuses it, data is a copy of at most its
// first keep bytes (for a receiver that looks for what to answer) and
// refused says why. pc, if not nil, is the connection r reads from: it
// paces the reads of a message past 64 KiB that trickles in.
func ReadChecked(r io.Reader, pc pacer, limit int, check func([]byte) *envelope.Error, keep int) (data []byte, refused *envelope.Error, err error) {
	var lc func([]byte, envelope.Limits) *envelope.Error
	if check != nil {
		lc = func(b []byte, _ envelope.Limits) *envelope.Error { return check(b) }
	}
	return readChecked(r, pc, limit, lc, envelope.Limits{}, keep)
}

// readChecked is ReadChecked with a check that takes lim: a
// connection's reader passes its own check and limits, not a closure
// made per message.
func readChecked(r io.Reader, pc pacer, limit int, check func([]byte, envelope.Limits) *envelope.Error, lim envelope.Limits, keep int) (data []byte, refused *envelope.Error, err error) {
	bp := scratch.Get().(*[]byte)
	buf := (*bp)[:0]
	defer func() {
		if cap(buf) > 64<<10 {
			select {
			case bigScratch <- buf[:0]:
			default:
			}
			buf = (*bp)[:0] // the small one goes back to the pool
		}
		*bp = buf[:0]
		scratch.Put(bp)
	}()
	for {
		if len(buf) == cap(buf) {
			buf = grow(buf, limit)
		}
		// At most 64 KiB per read: one syscall copying a megabyte holds
		// its P (of two, here) for a few hundred microseconds, while
		// other connections' small calls wait (S26).
		before := len(buf)
		n, err := r.Read(buf[len(buf):min(cap(buf), len(buf)+64<<10)])
		buf = buf[:len(buf)+n]
		if before>>16 != len(buf)>>16 && (pc == nil || !pc.pace()) {
			// Every 64 KiB of one message, let other goroutines run: a
			// flood of large messages must not hold a P for the
			// scheduler's 10 ms quantum while small calls wait (S26).
			// (A pace that slept has let them run.)
			runtime.Gosched()
		}
		if err == io.EOF {
			if check != nil {
				if refused = check(buf, lim); refused != nil {
					return append([]byte(nil), buf[:min(len(buf), keep)]...), refused, nil
				}
			}
			out := make([]byte, len(buf))
			copy(out, buf)
			return out, nil, nil
		}
		if err != nil {
			return nil, nil, err
		}
	}
}

// grow returns buf with more room: doublings up to 64 KiB, then a kept
// big buffer (or a new one) of limit+1 bytes at once.
func grow(buf []byte, limit int) []byte {
	want := max(min(2*cap(buf), limit+1), len(buf)+512)
	if want > 64<<10 {
		// One size for every reader of about the limit (HTTP bodies at
		// the limit, WebSocket messages at the limit plus a frame's
		// slack), so that the kept buffers suit them all.
		want = (max(limit+1, len(buf)+512) + 64<<10 - 1) &^ (64<<10 - 1)
		for {
			var b []byte
			select {
			case b = <-bigScratch:
			default:
			}
			if b == nil {
				break
			}
			if cap(b) >= want {
				return append(b[:0], buf...)
			}
		}
	}
	nb := make([]byte, len(buf), want)
	copy(nb, buf)
	return nb
}
