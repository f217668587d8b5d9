package mesh

import (
	"io"
	"runtime"
	"sync"
)

// scratch holds read buffers: a message is read into one and copied out
// at its exact size once it is whole. A message refused while it is read
// (over the limit, a broken stream) then allocates nothing, and a valid
// one allocates exactly its size instead of the doublings of a growing
// buffer: under a flood of oversized input the hub's garbage stays small
// and so do the collector's pauses on everyone else's calls (S26).
var scratch = sync.Pool{New: func() any { b := make([]byte, 0, 16<<10); return &b }}

// readExact reads r to EOF, refusing (with the reader's own error) past
// what r allows, and returns a new slice of exactly the bytes read.
func readExact(r io.Reader, limit int) ([]byte, error) {
	bp := scratch.Get().(*[]byte)
	buf := (*bp)[:0]
	defer func() {
		*bp = buf[:0]
		scratch.Put(bp)
	}()
	for {
		if len(buf) == cap(buf) {
			nb := make([]byte, len(buf), max(min(2*cap(buf), limit+1), len(buf)+512))
			copy(nb, buf)
			buf = nb
		}
		before := len(buf)
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if before>>16 != len(buf)>>16 {
			// Every 64 KiB of one message, let other goroutines run: a
			// flood of large messages must not hold a P for the
			// scheduler's 10 ms quantum while small calls wait (S26).
			runtime.Gosched()
		}
		if err == io.EOF {
			out := make([]byte, len(buf))
			copy(out, buf)
			return out, nil
		}
		if err != nil {
			return nil, err
		}
	}
}
