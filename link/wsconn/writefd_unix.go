//go:build unix

package wsconn

import "syscall"

// rawWrites: tryWrite writes to the socket itself (writeFD).
const rawWrites = true

// writeFD is tryWrite's one write(2) on the socket fd, never waiting.
func (c *Conn) writeFD(fd uintptr) bool {
	c.wn, c.werr = syscall.Write(int(fd), c.wb)
	c.wn = max(c.wn, 0)
	return true
}
