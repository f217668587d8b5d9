//go:build unix

package wsconn

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
)

const readAheadOS = true

// readNow reads what the socket holds into a pooled buffer without
// waiting for more; ok is false when it holds nothing, and the caller
// reads as usual.
func (ra *readAhead) readNow(p []byte) (int, bool, error) {
	ra.more = false
	bp := getReadAhead()
	bp.n, bp.err = 0, nil
	if err := ra.raw.Read(bp.take); err != nil {
		putReadAhead(bp)
		return 0, false, nil // closed, or past a deadline: the caller's read says so
	}
	n, errno := bp.n, bp.err
	bp.err = nil
	if errno != nil {
		putReadAhead(bp)
		if errors.Is(errno, syscall.EAGAIN) || errors.Is(errno, syscall.EINTR) {
			return 0, false, nil
		}
		// The read took the socket's error (a reset): report it as
		// net.Conn.Read would, not as the end of the stream the next
		// read would see.
		return 0, true, &net.OpError{Op: "read", Net: ra.conn.LocalAddr().Network(), Source: ra.conn.LocalAddr(), Addr: ra.conn.RemoteAddr(), Err: os.NewSyscallError("read", errno)}
	}
	if n == 0 {
		putReadAhead(bp)
		return 0, true, io.EOF
	}
	ra.more = n == len(bp.b)
	k := copy(p, bp.b[:n])
	if k == n {
		putReadAhead(bp)
	} else {
		ra.buf, ra.r, ra.w = bp, k, n
	}
	return k, true, nil
}

// readFD reads what the socket fd holds into rb, never waiting: an
// empty socket is the caller's read.
func (rb *raBuf) readFD(fd uintptr) bool {
	rb.n, rb.err = sysRead(int(fd), rb.b)
	return true
}
