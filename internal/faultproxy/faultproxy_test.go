package faultproxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"
)

// echoServer echoes every connection until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(c, c); _ = c.Close() })
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

func newProxy(t *testing.T) *Proxy {
	t.Helper()
	base := runtime.NumGoroutine()
	p, err := New(t.Context(), echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = p.Close()
		// Every goroutine of the proxy is gone once Close returns; the echo
		// server's copiers end as they see the proxy's sockets close, and
		// its accept loop (+1) ends in a later cleanup.
		deadline := time.Now().Add(time.Second)
		for runtime.NumGoroutine() > base+1 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if n := runtime.NumGoroutine(); n > base+1 {
			buf := make([]byte, 1<<16)
			t.Errorf("%d goroutines after Close, %d before:\n%s", n, base, buf[:runtime.Stack(buf, true)])
		}
	})
	return p
}

func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// roundTrip writes msg and reads it back, within d.
func roundTrip(c net.Conn, msg []byte, d time.Duration) (time.Duration, error) {
	start := time.Now()
	_ = c.SetDeadline(start.Add(d))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write(msg); err != nil {
		return 0, err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return 0, err
	}
	if !bytes.Equal(got, msg) {
		return 0, errors.New("echo mismatch")
	}
	return time.Since(start), nil
}

func TestPassThrough(t *testing.T) {
	p := newProxy(t)
	c := dial(t, p)
	for i := range 100 {
		msg := bytes.Repeat([]byte{byte(i)}, 1+i*100)
		if _, err := roundTrip(c, msg, 2*time.Second); err != nil {
			t.Fatalf("round trip %d: %v", i, err)
		}
	}
	if acc, open, _ := p.Stats(); acc != 1 || open != 1 {
		t.Errorf("accepted %d, open %d; want 1, 1", acc, open)
	}
}

func TestBlackholeHoldsThenDelivers(t *testing.T) {
	p := newProxy(t)
	c := dial(t, p)
	if _, err := roundTrip(c, []byte("warm"), time.Second); err != nil {
		t.Fatal(err)
	}
	p.Blackhole()
	_, err := roundTrip(c, []byte("held"), 300*time.Millisecond)
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("round trip through a blackhole: %v; want a read timeout", err)
	}
	// A new connection is accepted (the socket opens) but gets nothing.
	c2 := dial(t, p)
	if _, err := roundTrip(c2, []byte("new"), 200*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("new connection through a blackhole: %v; want a read timeout", err)
	}
	p.Unblackhole()
	// The held bytes arrive, in order, on the same connection.
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	got := make([]byte, 4)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "held" {
		t.Fatalf("after heal read %q, %v; want the held bytes", got, err)
	}
	if _, err := roundTrip(c, []byte("again"), time.Second); err != nil {
		t.Fatalf("after heal: %v", err)
	}
}

func TestDelayKeepsOrder(t *testing.T) {
	p := newProxy(t)
	c := dial(t, p)
	p.Delay(Up, 40*time.Millisecond, 30*time.Millisecond)
	p.Delay(Down, 40*time.Millisecond, 0)
	var total time.Duration
	// The up delay is uniform in 10-70 ms: the mean of n round trips has
	// a standard deviation of 17.3/sqrt(n) ms around 80. With n = 10 and
	// a floor of 70 ms (1.8 sigma) one run in thirty failed with no fault
	// (a CI run: 69.2 ms); with n = 20 and a floor of 60 ms (5 sigma) a
	// proxy that missed the up delay (mean 40 ms) still fails every time.
	const n = 20
	for i := range n {
		rtt, err := roundTrip(c, []byte{byte(i)}, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if rtt < 45*time.Millisecond {
			t.Errorf("rtt %v; want >= 10+40 ms", rtt)
		}
		total += rtt
	}
	mean := total / n
	t.Logf("mean rtt with 40±30 ms up and 40 ms down: %v", mean)
	if mean < 60*time.Millisecond || mean > 160*time.Millisecond {
		t.Errorf("mean rtt %v; want about 80 ms", mean)
	}
	// Many small writes with jitter: the bytes still come back in order.
	go func() {
		for i := range 200 {
			_, _ = c.Write([]byte{byte(i)})
		}
	}()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, 200)
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	for i, b := range got {
		if b != byte(i) {
			t.Fatalf("byte %d is %d: order not kept", i, b)
		}
	}
	p.Delay(Both, 0, 0)
	if rtt, err := roundTrip(c, []byte("x"), time.Second); err != nil || rtt > 30*time.Millisecond {
		t.Errorf("after removing the delay: rtt %v, %v", rtt, err)
	}
}

func TestDropChunksForADuration(t *testing.T) {
	p := newProxy(t)
	c := dial(t, p)
	p.DropChunks(Up, 1, 200*time.Millisecond)
	if _, err := roundTrip(c, []byte("lost"), 100*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("round trip with every chunk dropped: %v; want a timeout", err)
	}
	time.Sleep(150 * time.Millisecond)
	// Part of "lost" may have come back: the next round trip goes over a
	// fresh connection.
	if _, err := roundTrip(dial(t, p), []byte("kept"), time.Second); err != nil {
		t.Fatalf("after the drop period: %v", err)
	}
	if _, _, dropped := p.Stats(); dropped != 1 {
		t.Errorf("dropped %d chunks; want 1", dropped)
	}
	// Half of them until healed.
	p.DropChunks(Both, 0.5, 0)
	lost := 0
	for i := range 40 {
		if _, err := roundTrip(c, []byte{byte(i)}, 50*time.Millisecond); err != nil {
			lost++
		}
	}
	p.Heal()
	// A longer chunk loses a span, not necessarily all of it: the stream
	// comes back shorter.
	c2 := dial(t, p)
	p.DropChunks(Up, 1, 0)
	msg := bytes.Repeat([]byte("x"), 1000)
	if _, err := c2.Write(msg); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	p.Heal()
	_ = c2.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	got, _ := io.ReadAll(c2)
	if len(got) >= len(msg) {
		t.Errorf("read back %d of %d bytes with a span dropped; want fewer", len(got), len(msg))
	}
	t.Logf("40 one-byte round trips at 50%% drop per direction: %d did not come back", lost)
	if lost < 10 || lost == 40 {
		t.Errorf("%d of 40 round trips lost; want about 3/4", lost)
	}
}

func TestResetAll(t *testing.T) {
	p := newProxy(t)
	c := dial(t, p)
	if _, err := roundTrip(c, []byte("a"), time.Second); err != nil {
		t.Fatal(err)
	}
	p.Blackhole() // a reset also ends connections whose bytes are held
	_, _ = c.Write([]byte("held"))
	time.Sleep(20 * time.Millisecond)
	p.ResetAll()
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read after ResetAll: %v; want EOF or reset", err)
	}
	p.Unblackhole()
	c2 := dial(t, p)
	if _, err := roundTrip(c2, []byte("b"), time.Second); err != nil {
		t.Fatalf("new connection after ResetAll: %v", err)
	}
	deadline := time.Now().Add(time.Second)
	for {
		if _, open, _ := p.Stats(); open == 1 {
			break
		}
		if time.Now().After(deadline) {
			_, open, _ := p.Stats()
			t.Fatalf("%d connections open; want 1", open)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestContextEndClosesEverything(t *testing.T) {
	base := runtime.NumGoroutine()
	target := echoServer(t)
	ctx, cancel := context.WithCancel(t.Context())
	p, err := New(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p.Blackhole()
	_, _ = c.Write([]byte("x"))
	cancel()
	_ = p.Close()
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("read after the context ended: %v; want the connection closed", err)
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), 200*time.Millisecond); err == nil {
		t.Error("the listener still accepts after the context ended")
	}
	// Only the echo server's goroutines (accept loop and the one copier) remain.
	if n := runtime.NumGoroutine(); n > base+3 {
		t.Errorf("%d goroutines, %d before", n, base)
	}
}
