package memnet_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/net/nettest"

	"github.com/agentmesh/agentmesh/internal/memnet"
)

// TestConnConformance runs x/net's net.Conn conformance suite (basic
// I/O, ping-pong, racy reads and writes, deadlines, close) on a pipe.
func TestConnConformance(t *testing.T) {
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		a, b := memnet.Pipe(4096, memnet.Addr("a"), memnet.Addr("b"))
		return a, b, func() { a.Close(); b.Close() }, nil
	})
}

// TestWriteBlocksWhenFull: a writer whose peer does not read stops when
// the buffer is full (as over a socket), and goes on when the peer reads.
func TestWriteBlocksWhenFull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := memnet.Pipe(1024, memnet.Addr("a"), memnet.Addr("b"))
		defer a.Close()
		defer b.Close()
		done := make(chan int)
		go func() {
			n, _ := a.Write(make([]byte, 3000))
			done <- n
		}()
		synctest.Wait()
		select {
		case n := <-done:
			t.Fatalf("a write of 3000 bytes into a 1024-byte buffer returned (%d) before the peer read", n)
		default:
		}
		got, err := io.ReadAll(io.LimitReader(b, 3000))
		if err != nil || len(got) != 3000 {
			t.Fatalf("read %d bytes, %v", len(got), err)
		}
		if n := <-done; n != 3000 {
			t.Errorf("wrote %d; want 3000", n)
		}
	})
}

// TestWriteDeadlineInBubble: a write blocked on a full buffer times out
// at its deadline, on the bubble's clock.
func TestWriteDeadlineInBubble(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := memnet.Pipe(16, memnet.Addr("a"), memnet.Addr("b"))
		defer a.Close()
		defer b.Close()
		start := time.Now()
		a.SetWriteDeadline(start.Add(10 * time.Second))
		n, err := a.Write(make([]byte, 100))
		if !errors.Is(err, os.ErrDeadlineExceeded) || n != 16 {
			t.Fatalf("Write = %d, %v; want 16, deadline exceeded", n, err)
		}
		if d := time.Since(start); d != 10*time.Second {
			t.Errorf("timed out after %v; want exactly 10s", d)
		}
	})
}

// TestDeadlineAfterClose: setting a deadline on a closed connection
// whose deadline timer was pending returns at once (a WebSocket reader
// moves its read deadline after every message, so it may do so just as
// another goroutine closes the connection). Close used to stop the
// timer and leave it set; the next SetReadDeadline took Stop's false
// for a timer that had fired and waited for ever for it to close the
// deadline's channel (a hub's Shutdown hung on it, waiting for that
// reader).
func TestDeadlineAfterClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := memnet.Pipe(64, memnet.Addr("a"), memnet.Addr("b"))
		defer b.Close()
		_ = a.SetReadDeadline(time.Now().Add(time.Minute))
		_ = a.SetWriteDeadline(time.Now().Add(time.Minute))
		a.Close()
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = a.SetReadDeadline(time.Now().Add(time.Minute))
			_ = a.SetDeadline(time.Time{})
		}()
		synctest.Wait()
		select {
		case <-done:
		default:
			t.Fatal("SetReadDeadline on a closed connection blocks")
		}
	})
}

// TestCloseSemantics: after one end closes, the other reads what was
// written and then EOF, and its writes fail.
func TestCloseSemantics(t *testing.T) {
	a, b := memnet.Pipe(64, memnet.Addr("a"), memnet.Addr("b"))
	if _, err := a.Write([]byte("last words")); err != nil {
		t.Fatal(err)
	}
	a.Close()
	got, err := io.ReadAll(b)
	if err != nil || string(got) != "last words" {
		t.Errorf("ReadAll = %q, %v", got, err)
	}
	if _, err := b.Write([]byte("x")); err == nil {
		t.Error("a write to a closed peer succeeded")
	}
	if _, err := a.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("a read on a closed conn = %v; want net.ErrClosed", err)
	}
}

// TestHTTPOverListener: an http.Server serves on the listener and a
// client dials it through DialContext, with no socket.
func TestHTTPOverListener(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ln := memnet.Listen("hub", 0)
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "hello "+r.URL.Path)
		})}
		go srv.Serve(ln)
		tr := &http.Transport{DialContext: ln.DialContext}
		c := &http.Client{Transport: tr}
		res, err := c.Get("http://hub/x")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if !bytes.Equal(body, []byte("hello /x")) {
			t.Errorf("body %q", body)
		}
		tr.CloseIdleConnections()
		srv.Shutdown(context.Background())
		if _, err := ln.Dial(context.Background()); err == nil {
			t.Error("dial after the listener closed succeeded")
		}
	})
}
