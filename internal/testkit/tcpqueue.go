package testkit

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"strings"
)

// TCPQueues reports, from /proc/net/tcp and tcp6 (Linux), the send and
// receive queues of the socket whose local and remote addresses are
// given: tx is the bytes written but not yet acknowledged by the peer
// (on loopback: not yet taken into the peer's receive buffer), rx the
// bytes received and not yet read by the application. A test uses it
// to see, without timing, that a peer has stopped reading and data for
// it is waiting at a server whose socket the test does not hold.
func TCPQueues(local, remote string) (tx, rx int, err error) {
	l, err := netip.ParseAddrPort(local)
	if err != nil {
		return 0, 0, err
	}
	r, err := netip.ParseAddrPort(remote)
	if err != nil {
		return 0, 0, err
	}
	for _, name := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(name)
		if err != nil {
			return 0, 0, err
		}
		tx, rx, found := scanTCP(f, l, r)
		_ = f.Close()
		if found {
			return tx, rx, nil
		}
	}
	return 0, 0, fmt.Errorf("no TCP socket %s -> %s in /proc/net/tcp{,6}", local, remote)
}

func scanTCP(f *os.File, l, r netip.AddrPort) (tx, rx int, found bool) {
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 5 {
			continue
		}
		la, ok1 := procAddr(fs[1])
		ra, ok2 := procAddr(fs[2])
		if !ok1 || !ok2 || !sameAddr(la, l) || !sameAddr(ra, r) {
			continue
		}
		q := strings.SplitN(fs[4], ":", 2)
		if len(q) != 2 {
			continue
		}
		t, err1 := strconv.ParseUint(q[0], 16, 32)
		x, err2 := strconv.ParseUint(q[1], 16, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		return int(t), int(x), true
	}
	return 0, 0, false
}

// procAddr decodes "0100007F:1F90": the address as 32-bit words in the
// host's (little-endian) order, the port big-endian.
func procAddr(s string) (netip.AddrPort, bool) {
	h, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, false
	}
	raw, err := hex.DecodeString(h)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, false
	}
	for i := 0; i < len(raw); i += 4 {
		binary.BigEndian.PutUint32(raw[i:], binary.LittleEndian.Uint32(raw[i:]))
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, false
	}
	a, _ := netip.AddrFromSlice(raw)
	return netip.AddrPortFrom(a, uint16(port)), true
}

func sameAddr(a, b netip.AddrPort) bool {
	return a.Port() == b.Port() && a.Addr().Unmap() == b.Addr().Unmap()
}
