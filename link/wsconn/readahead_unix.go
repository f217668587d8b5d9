//go:build unix

package wsconn

import (
	"errors"
	"io"
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
		return 0, true, sysError("read", ra.conn, errno)
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

// fill reads what the socket holds, up to the buffer's size, behind the
// bytes buffered (ra.room). With wait, a socket that holds nothing is
// waited for, with no buffer held while it is (an idle connection holds
// none): the read runs inside the RawConn's Read, which waits for the
// socket and calls it again. Without wait, it reports false when the
// socket holds nothing.
func (ra *readAhead) fill(wait bool) (bool, error) {
	if ra.raw == nil {
		return ra.fillBlocking()
	}
	ra.waits++
	if ra.fillFn == nil {
		ra.fillFn = ra.fillFD
	}
	ra.fillWait, ra.filled, ra.fillErr = wait, 0, nil
	err := ra.raw.Read(ra.fillFn)
	n, errno := ra.filled, ra.fillErr
	ra.fillErr = nil
	if err == nil && errno == nil && n > 0 {
		return true, nil
	}
	ra.dropEmpty()
	switch {
	case err != nil:
		return false, err // closed, or past the read deadline
	case errno == syscall.EAGAIN:
		return false, nil // nothing, and not to wait
	case errno != nil:
		return false, sysError("read", ra.conn, errno)
	}
	return false, io.EOF
}

// fillFD is fill's read of the socket fd: false (wait for the socket,
// then call again) when it holds nothing and fill may wait, the buffer
// back in the pool meanwhile unless it holds bytes.
func (ra *readAhead) fillFD(fd uintptr) bool {
	ra.room()
	for {
		n, err := sysRead(int(fd), ra.buf.b[ra.w:])
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			if !ra.fillWait {
				ra.fillErr = err
				return true
			}
			ra.dropEmpty()
			ra.carry()
			return false
		case err != nil:
			ra.fillErr = err
		default:
			ra.w += n
			ra.filled = n
		}
		return true
	}
}
