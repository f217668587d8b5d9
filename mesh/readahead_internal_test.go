package mesh

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"
)

// countingConn counts the reads that reach the socket.
type countingConn struct {
	net.Conn
	reads int
}

func (c *countingConn) Read(p []byte) (int, error) { c.reads++; return c.Conn.Read(p) }

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
	cc := &countingConn{Conn: raw}
	var ra readAhead
	var got []byte
	small := 0
	for {
		n := 1 + rand.IntN(4096)
		if rand.IntN(8) == 0 {
			n = readAheadSize + rand.IntN(readAheadSize)
		}
		p := make([]byte, n)
		k, err := ra.read(cc, p)
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
	// ~3 MiB at most 64 KiB per syscall, plus the large reads and the
	// end: far fewer syscalls than the ~1,500 small reads.
	if cc.reads > small/4 {
		t.Errorf("%d syscalls for %d small reads", cc.reads, small)
	}
	t.Logf("%d syscalls for %d small reads", cc.reads, small)
}
