//go:build linux && !race && !msan && !asan

package wsconn

import (
	"syscall"
	"unsafe"
)

// sysWrite and sysRead are the non-waiting write(2) and read(2) of
// tryWrite and the read-ahead, on a socket that is non-blocking (Go's
// netpoller set it so): the call cannot block, so it is made without
// telling the scheduler (RawSyscall). syscall.Write's entersyscall and
// exitsyscall cost a few hundred nanoseconds a call, and on a process
// whose Ps were all idle entersyscall also wakes sysmon: at 10,000 idle
// links that was one more thread woken for many of the pongs. Builds
// with the race detector keep syscall.Write and syscall.Read, whose
// annotations tell it about the order that a socket gives a write and
// the read of it.
func sysWrite(fd int, p []byte) (int, error) { return rawRW(syscall.SYS_WRITE, fd, p) }

func sysRead(fd int, p []byte) (int, error) { return rawRW(syscall.SYS_READ, fd, p) }

// rawRW is read(2) or write(2) (trap) of p on fd: n, or -1 and the errno.
func rawRW(trap uintptr, fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	n, _, e := syscall.RawSyscall(trap, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if e != 0 {
		return -1, e
	}
	return int(n), nil
}
