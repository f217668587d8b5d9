// Package freeport hands tests loopback addresses to bind later: in another
// process, or again after a restart.
//
// The usual trick (listen on port 0, note the port, close) returns a port
// from the kernel's ephemeral range, the same range every outgoing
// connection takes its source port from and every other ":0" listener is
// given. Between the close and the bind, a busy test (eight agents dialling
// a hub, a load generator) can take it: "bind: address already in use" in
// a process the test cannot restart. A dead ephemeral port is no better as
// a "nothing listens here" target: a dial to it can connect to itself.
//
// So freeport takes ports from below the ephemeral range, which the kernel
// never hands out by itself, picked at random and checked by binding them.
// Within one process no port is handed out twice.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// lowest is the bottom of the range freeport picks from: above the ports
// system services are usually configured on.
const lowest = 10000

var (
	mu    sync.Mutex
	given = map[int]bool{}
)

// Addr returns a loopback host:port that nothing listens on.
func Addr(tb testing.TB) string {
	tb.Helper()
	return Addrs(tb, 1)[0]
}

// Port returns a loopback port that nothing listens on.
func Port(tb testing.TB) int {
	tb.Helper()
	return pick(tb)
}

// Addrs returns n distinct loopback host:port addresses nothing listens on.
func Addrs(tb testing.TB, n int) []string {
	tb.Helper()
	out := make([]string, n)
	for i := range out {
		out[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(pick(tb)))
	}
	return out
}

func pick(tb testing.TB) int {
	tb.Helper()
	return pickIn(tb, lowest, ephemeralLow()-1)
}

func pickIn(tb testing.TB, lo, hi int) int {
	tb.Helper()
	mu.Lock()
	defer mu.Unlock()
	if hi-lo < 20 { // an unusual range: fall back to the kernel's choice
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		defer ln.Close()
		return ln.Addr().(*net.TCPAddr).Port
	}
	for range 1000 {
		p := lo + rand.IntN(hi-lo+1)
		if given[p] {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		ln.Close()
		given[p] = true
		return p
	}
	tb.Fatalf("freeport: no free loopback port in %d-%d", lo, hi)
	return 0
}

// ephemeralLow is the bottom of the kernel's ephemeral port range
// (Linux's default is 32768).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return n
}

// String is for logs: the range picked from on this machine.
func String() string { return fmt.Sprintf("%d-%d", lowest, ephemeralLow()-1) }
