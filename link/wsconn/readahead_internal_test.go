package wsconn

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// readSyscalls is this process's count of read syscalls so far.
func readSyscalls(t *testing.T) int {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		if runtime.GOOS == "linux" {
			t.Fatalf("reading /proc/self/io: %v", err)
		}
		t.Skipf("no /proc/self/io on %s: %v", runtime.GOOS, err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "syscr: "); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	t.Fatalf("no syscr in /proc/self/io")
	return 0
}

// TestReadAhead reads a stream over a real TCP connection in small and
// large pieces of random sizes through a readAhead: the bytes come out
// whole and in order, the end of the stream comes after the last of
// them, the buffer is held only while it has unread bytes, and small
// reads of data already in the socket cost one syscall per buffer-full.
func TestReadAhead(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	want := make([]byte, 3<<20)
	for i := range want {
		want[i] = byte(rand.Uint32())
	}
	sent := make(chan error, 1)
	go func() {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			sent <- err
			return
		}
		_, err = c.Write(want)
		c.Close()
		sent <- err
	}()
	raw, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	// Let the socket fill (all of it, where the kernel's buffers take 3
	// MiB; otherwise the writer is blocked with the rest queued).
	select {
	case err := <-sent:
		if err != nil {
			t.Fatal(err)
		}
		sent <- nil
	case <-time.After(time.Second):
	}
	ra := newReadAhead(raw)
	if ra.raw == nil {
		t.Fatal("a TCP connection without read-ahead")
	}
	reads0 := readSyscalls(t)
	var got []byte
	small := 0
	for {
		n := 1 + rand.IntN(4096)
		if rand.IntN(8) == 0 {
			n = readAheadSize + rand.IntN(readAheadSize)
		}
		p := make([]byte, n)
		k, err := ra.read(p)
		got = append(got, p[:k]...)
		if n < readAheadSize/2 {
			small++
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if ra.buf != nil && ra.r >= ra.w {
			t.Fatalf("an empty buffer is held (r %d, w %d)", ra.r, ra.w)
		}
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, not the %d sent (or not in order)", len(got), len(want))
	}
	if ra.buf != nil {
		t.Error("the buffer is held after the end of the stream")
	}
	// ~3 MiB at most 64 KiB per syscall (48 at least), plus one per large
	// read and the end: far fewer syscalls than the hundreds of small
	// reads, each of which is a syscall without read-ahead. (The bound was
	// small/4: with ~190 small reads that is under the 48 syscalls 3 MiB
	// needs at best, and a CI run failed with 55 for 185.)
	reads := readSyscalls(t) - reads0
	if reads > small/2 {
		t.Errorf("%d read syscalls for %d small reads", reads, small)
	}
	t.Logf("%d read syscalls for %d small reads", reads, small)
}

// TestReadAheadIdle: a read that has to wait for data holds no pooled
// buffer (an idle connection's reader sits in one), even right after a
// read that filled its buffer; the data that comes later is read whole.
func TestReadAheadIdle(t *testing.T) {
	a, b := tcpPair(t)
	ra, _ := filledOnce(t, a, b)
	held := readAheadHeld.Load()
	done := make(chan []byte)
	go func() {
		q := make([]byte, 16)
		n, _ := ra.read(q)
		done <- q[:n]
	}()
	time.Sleep(50 * time.Millisecond) // the reader waits in the socket
	if n := readAheadHeld.Load(); n != held {
		t.Errorf("%d pooled buffers held while the reader waits", n-held)
	}
	if _, err := b.Write([]byte("efgh")); err != nil {
		t.Fatal(err)
	}
	if got := <-done; string(got) != "efgh" {
		t.Fatalf("read %q after the wait, want efgh", got)
	}
	if ra.buf != nil {
		t.Error("a buffer is held after a wait")
	}
}

// filledOnce returns a's readAhead after a read that filled its 4-byte
// buffer (so the next read is the non-waiting one), and that buffer.
func filledOnce(t *testing.T, a, b net.Conn) (*readAhead, []byte) {
	t.Helper()
	ra := newReadAhead(a)
	if _, err := b.Write([]byte("abcd")); err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 4)
	if n, err := io.ReadFull(readerFunc(func(q []byte) (int, error) { return ra.read(q) }), p); n != 4 || err != nil {
		t.Fatalf("read %d, %v", n, err)
	}
	if !ra.more {
		t.Fatal("a read that filled its buffer did not mark more")
	}
	return &ra, p
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

func tcpPair(t *testing.T) (net.Conn, net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	b, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	a, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// TestReadAheadReset: a reset that the read-ahead's read takes from the
// socket comes back as the read's error, not as the end of the stream.
func TestReadAheadReset(t *testing.T) {
	a, b := tcpPair(t)
	ra, p := filledOnce(t, a, b)
	_ = b.(*net.TCPConn).SetLinger(0) // close with a reset
	b.Close()
	time.Sleep(50 * time.Millisecond)
	n, err := ra.read(p)
	if n != 0 || err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("read after a reset: %d, %v; want the reset", n, err)
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("read after a reset: %v; want ECONNRESET", err)
	}
	var ne net.Error
	if !errors.As(err, &ne) {
		t.Errorf("%T is not a net.Error", err)
	}
}

// countPacer counts the paces that slept.
type countPacer struct {
	pacer
	slept int
}

func (c *countPacer) pace() bool {
	s := c.pacer.pace()
	if s {
		c.slept++
	}
	return s
}

// TestReadAheadPace: a large message trickled in 4 KiB writes is paced
// (its reader sleeps between 64 KiB pieces instead of waking per write)
// and arrives whole; one written at once is not paced.
func TestReadAheadPace(t *testing.T) {
	for _, tc := range []struct {
		name    string
		size    int
		trickle bool
		paced   func(slept int) bool
		want    string
	}{
		{"trickled", 256 << 10, true, func(n int) bool { return n >= 1 }, "at least one pace"},
		{"at once", 1 << 20, false, func(n int) bool { return n <= 1 }, "at most one pace (of 16)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := tcpPair(t)
			want := make([]byte, tc.size)
			for i := range want {
				want[i] = byte(rand.Uint32())
			}
			sent := make(chan error, 1)
			go func() {
				if !tc.trickle {
					_, err := b.Write(want)
					sent <- err
					return
				}
				for p := want; len(p) > 0; p = p[4<<10:] {
					if _, err := b.Write(p[:4<<10]); err != nil {
						sent <- err
						return
					}
					time.Sleep(500 * time.Microsecond)
				}
				sent <- nil
			}()
			rc := &readAheadConn{Conn: a, readAhead: newReadAhead(a)}
			cp := &countPacer{pacer: rc}
			got, refused, err := ReadChecked(io.LimitReader(rc, int64(tc.size)), cp, tc.size, nil, 0)
			if err != nil || refused != nil {
				t.Fatalf("read: %v %v", err, refused)
			}
			if err := <-sent; err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("read %d bytes, not the %d sent", len(got), len(want))
			}
			if !tc.paced(cp.slept) {
				t.Errorf("%d paces slept; want %s", cp.slept, tc.want)
			}
			t.Logf("%d paces slept", cp.slept)
		})
	}
}
