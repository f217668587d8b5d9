package wsconn

import (
	"net"
	"syscall"
)

// tcpThinLinearTimeouts is TCP_THIN_LINEAR_TIMEOUTS (linux/tcp.h).
const tcpThinLinearTimeouts = 16

// tuneTCP sets what a link's socket needs beyond Go's defaults (which
// already disable Nagle): linear retransmission timeouts while the
// stream is thin (fewer than 4 segments in flight, Linux's test). A
// link carries small frames, many calls over one connection, so one
// lost segment with nothing behind it to trigger a fast retransmit
// waits a retransmission timeout (200 ms at least), and every call
// behind it waits too. With the default exponential backoff, losing the
// retransmission as well costs 200 + 400 ms, then 800 ms more: on one
// cross-hub link under 5 % loss (the lab's S07b) such a chain pushed the
// p99 past 1 s. Linear timeouts keep each further try at the first RTO
// for the first 6 retransmissions (RFC 6298 allows a sender not to back
// off for these; Linux documents it for thin streams, tcp(7)).
func tuneTCP(c net.Conn) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(fd uintptr) {
		_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpThinLinearTimeouts, 1)
	})
}
