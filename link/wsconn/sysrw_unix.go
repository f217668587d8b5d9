//go:build unix && !(linux && !race && !msan && !asan)

package wsconn

import "syscall"

// sysWrite and sysRead: see sysrw_linux.go.
func sysWrite(fd int, p []byte) (int, error) { return syscall.Write(fd, p) }

func sysRead(fd int, p []byte) (int, error) { return syscall.Read(fd, p) }
