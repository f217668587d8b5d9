// Package tokentap is a wiretap for tests: a TCP proxy in front of a
// server that keeps the bearer token of the first HTTP request of every
// connection crossing it (a peer hub's token, as an eavesdropper on the
// link would see it), and forwards everything unchanged.
package tokentap

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/agentmesh/agentmesh/auth"
)

// Tap is a running proxy.
type Tap struct {
	Addr  string       // where it listens (host:port)
	Conns atomic.Int64 // connections accepted

	mu     sync.Mutex
	tokens []string
}

// Start runs a tap in front of target (host:port) until the test ends.
func Start(t testing.TB, target string) *Tap {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Tap{Addr: ln.Addr().String()}
	var wg sync.WaitGroup
	var open sync.Map // net.Conn -> struct{}
	t.Cleanup(func() {
		ln.Close()
		open.Range(func(k, _ any) bool { k.(net.Conn).Close(); return true })
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.Conns.Add(1)
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			open.Store(c, struct{}{})
			open.Store(s, struct{}{})
			wg.Go(func() {
				defer s.Close()
				br := bufio.NewReader(c)
				if req, err := http.ReadRequest(br); err == nil {
					if tok, _ := auth.BearerToken(req); tok != "" {
						p.mu.Lock()
						p.tokens = append(p.tokens, tok)
						p.mu.Unlock()
					}
					if req.Write(s) != nil {
						return
					}
				}
				_, _ = io.Copy(s, br)
			})
			wg.Go(func() {
				defer c.Close()
				_, _ = io.Copy(c, s)
			})
		}
	})
	return p
}

// Captured returns the tokens seen so far, in order.
func (p *Tap) Captured() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.tokens...)
}
