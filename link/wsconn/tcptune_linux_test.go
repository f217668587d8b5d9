package wsconn

import (
	"net"
	"syscall"
	"testing"
)

// TestThinLinearTimeouts: both ends of a link's socket, dialed and
// accepted, back off linearly while thin (tuneTCP).
func TestThinLinearTimeouts(t *testing.T) {
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
	for name, c := range map[string]net.Conn{"dialed": d.(*readAheadConn).Conn, "accepted": a.(*cappedConn).Conn} {
		raw, err := c.(*net.TCPConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var v int
		var gerr error
		_ = raw.Control(func(fd uintptr) {
			v, gerr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpThinLinearTimeouts)
		})
		if gerr != nil || v != 1 {
			t.Errorf("%s socket: TCP_THIN_LINEAR_TIMEOUTS = %d, %v; want 1", name, v, gerr)
		}
	}
}
