package wsconn

import (
	"syscall"
	"unsafe"
)

// sendQueue reports the bytes in a socket's send queue, not yet
// acknowledged by the peer's kernel (SIOCOUTQ), and the size of its send
// buffer (SO_SNDBUF, which the kernel tunes as the connection grows); ok
// is false when raw is nil or not a socket that says.
func sendQueue(raw syscall.RawConn) (queued, size int, ok bool) {
	if raw == nil {
		return 0, 0, false
	}
	var q int32
	var qerr, serr error
	err := raw.Control(func(fd uintptr) {
		if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCOUTQ, uintptr(unsafe.Pointer(&q))); e != 0 {
			qerr = e
		}
		size, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF)
	})
	if err != nil || qerr != nil || serr != nil {
		return 0, 0, false
	}
	return int(q), size, true
}
