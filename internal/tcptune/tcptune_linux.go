// Package tcptune sets the TCP options a link's socket needs beyond Go's
// defaults, best effort: a kernel without an option keeps its default.
package tcptune

import (
	"net"
	"syscall"
)

// Socket options of linux/tcp.h that x/sys/unix does not name yet.
const (
	ThinLinearTimeouts = 16 // TCP_THIN_LINEAR_TIMEOUTS
	RTOMaxMS           = 44 // TCP_RTO_MAX_MS, Linux 6.14
	RTOMinUS           = 45 // TCP_RTO_MIN_US, Linux 6.15
)

// A link's retransmission timeout bounds (see Thin).
const (
	LinkRTOMin = 50_000 // µs
	LinkRTOMax = 1000   // ms
)

// Thin sets what a link's socket needs beyond Go's defaults (which
// already disable Nagle), best effort: a kernel without an option keeps
// its default. Linear timeouts go on every link's socket; the bounds on
// the retransmission timeout (BoundRTO) on the sockets of the links this
// process dialled, and on a hub's accepted peer links (wsconn.TuneLink).
//
// A link carries small frames, many calls over one connection, so every
// call behind a lost segment waits for its retransmission. Linux waits
// at least 200 ms for it when nothing behind the segment triggers a fast
// retransmit (tcp_rto_min, a floor set for bulk transfers across
// 2000-era WANs), and doubles the wait for each retransmission lost in
// turn. Under 5 % loss on one cross-hub link (the lab's S07b) chains of
// 200 + 400 ms came in every run, and a longer one (200 + 400 + 800 +
// 1600 ms) stalled the link 2.5 s until its heartbeat gave up on it.
//
//   - The floor is 50 ms (TCP_RTO_MIN_US): above Linux's shortest
//     delayed ACK (40 ms), so a peer that delays its ACK rarely costs a
//     spurious retransmission, and one costs a small segment, undone by
//     the sender's spurious-RTO detection. The timeout is still srtt +
//     4 rttvar where the path is longer: only short paths gain.
//   - The backoff stops at 1 s (TCP_RTO_MAX_MS): a link waiting longer
//     for one segment has missed its pings; a retransmission every
//     second costs nothing and finds the path as soon as it heals.
//   - Linear timeouts while the stream is thin (fewer than 4 segments in
//     flight): the first 6 retransmissions wait the RTO each, without
//     backing off (RFC 6298 allows it; tcp(7)).
func Thin(c net.Conn) {
	setsockopt(c, ThinLinearTimeouts, 1)
}

// BoundRTO bounds c's retransmission timeout. Not on the connections a
// hub accepts from clients and agents: the zero-window probes to a peer
// that stopped reading back off by the same timeout, and the kernel
// drops an orphaned socket (one a hub closed as a slow consumer, its
// close frame still queued) after 8 probes: at a 1 s ceiling that came
// within the 12 s of the hub's slow-consumer close (10 s write timeout,
// 2 s grace), and the peer, reading again, found a reset instead of its
// 1008 close (TestStreamCallerStopsReading).
func BoundRTO(c net.Conn) {
	setsockopt(c, RTOMinUS, LinkRTOMin)
	setsockopt(c, RTOMaxMS, LinkRTOMax)
}

func setsockopt(c net.Conn, opt, v int) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, opt, v) })
}
