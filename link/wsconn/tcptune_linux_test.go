package wsconn

import (
	"errors"
	"net"
	"syscall"
	"testing"

	"github.com/agentmesh/agentmesh/internal/tcptune"
)

// TestLinkRetransmissionTimeouts: both ends of a link's socket, dialed
// and accepted, back off linearly while thin; the dialed end retransmits
// after 50 ms at least, 1 s at most, the accepted end after the kernel's
// defaults until TuneLink (a hub's accepted peer link), then as the
// dialed end. A kernel older than 6.15 has no per-socket bounds: the test
// says so and checks the rest.
func TestLinkRetransmissionTimeouts(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := NewCapListener(ln, 10, nil)
	defer cl.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := cl.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	d, err := DialReadAhead(t.Context(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	a, ok := <-accepted
	if !ok {
		t.Fatal("accept failed")
	}
	defer a.Close()
	check := func(name string, c net.Conn, bounded bool) {
		raw, err := c.(*net.TCPConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		get := func(opt int) (v int, err error) {
			_ = raw.Control(func(fd uintptr) { v, err = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, opt) })
			return v, err
		}
		if v, err := get(tcptune.ThinLinearTimeouts); err != nil || v != 1 {
			t.Errorf("%s socket: TCP_THIN_LINEAR_TIMEOUTS = %d, %v; want 1", name, v, err)
		}
		// The kernel keeps the floor in jiffies: 50 ms reads back as up
		// to one jiffy (10 ms at HZ=100) more.
		if v, err := get(tcptune.RTOMinUS); errors.Is(err, syscall.ENOPROTOOPT) {
			t.Logf("%s socket: this kernel has no TCP_RTO_MIN_US", name)
		} else if bounded != (err == nil && v >= tcptune.LinkRTOMin && v <= tcptune.LinkRTOMin+10_000) {
			t.Errorf("%s socket: TCP_RTO_MIN_US = %d, %v; want %d: %v", name, v, err, tcptune.LinkRTOMin, bounded)
		}
		if v, err := get(tcptune.RTOMaxMS); errors.Is(err, syscall.ENOPROTOOPT) {
			t.Logf("%s socket: this kernel has no TCP_RTO_MAX_MS", name)
		} else if bounded != (err == nil && v == tcptune.LinkRTOMax) {
			t.Errorf("%s socket: TCP_RTO_MAX_MS = %d, %v; want %d: %v", name, v, err, tcptune.LinkRTOMax, bounded)
		}
	}
	check("dialed", d.(*readAheadConn).Conn, true)
	check("accepted", a.(*cappedConn).Conn, false)
	TuneLink(a)
	check("accepted peer link (TuneLink)", a.(*cappedConn).Conn, true)
}
