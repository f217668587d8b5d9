//go:build unix

package wsconn

import "syscall"

// rawWrites: tryWrite writes to the socket itself (fdWrite.write).
const rawWrites = true

// write is tryWrite's one write(2) on the socket fd, never waiting: a
// socket without room (EAGAIN) or an interrupted call wrote nothing,
// which is no error (the caller writes the rest under its deadline).
func (w *fdWrite) write(fd uintptr) bool {
	w.n, w.err = sysWrite(int(fd), w.b)
	w.n = max(w.n, 0)
	if w.err == syscall.EAGAIN || w.err == syscall.EINTR {
		w.err = nil
	}
	return true
}
