//go:build !linux

package wsconn

import "syscall"

// sendQueue is known on Linux only (sendqueue_linux.go): elsewhere a
// slow consumer's writer times out mid-frame, and its link is closed
// without a close frame, as before.
func sendQueue(syscall.RawConn) (queued, size int, ok bool) { return 0, 0, false }
