// Package faultproxy is a TCP proxy for fault injection in tests: it sits on
// one link (hub to hub, hub to etcd, agent to hub) on 127.0.0.1 and can
// blackhole it, delay it with jitter, corrupt it by dropping chunks, or
// reset its connections. netem is not available on the project's machines
// (RELIABILITY.md §1.1), so delay and jitter come from here.
//
// The verbs follow go.etcd.io/etcd/pkg/v3/proxy (BlackholeTx/Rx, DelayTx/Rx,
// ModifyTx/Rx, ResetListener), in ~250 lines without its dependencies.
// Blackhole differs on purpose: etcd's proxy discards the bytes, this one
// holds them (bounded, then back-pressure) and delivers them on heal, as a
// dropped-then-retransmitted TCP flow does under a real partition (nft drop
// measured so in §1.1).
package faultproxy

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// Direction selects the half of each connection a fault applies to.
type Direction int

const (
	// Both directions.
	Both Direction = iota
	// Up is client to target (what the dialling side sends).
	Up
	// Down is target to client.
	Down
)

func (d Direction) has(x Direction) bool { return d == Both || d == x }

// Proxy forwards every connection accepted on its listener to the target.
// Faults apply to connections already open and to new ones. Safe for
// concurrent use.
type Proxy struct {
	ln     net.Listener
	target string
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	changed  chan struct{} // closed and replaced whenever a fault changes
	hole     bool
	delay    [3]delaySpec // by Direction (Up, Down used)
	drop     [3]float64
	dropTill time.Time // zero: until healed
	conns    map[*conn]struct{}
	accepted int
	dropped  int
}

type delaySpec struct{ mean, jitter time.Duration }

// conn is one proxied connection: the accepted socket and the one to the
// target.
type conn struct {
	client, server net.Conn
	once           sync.Once
	dead           chan struct{} // closed by close
}

func (c *conn) close() {
	c.once.Do(func() {
		close(c.dead)
		_ = c.client.Close()
		_ = c.server.Close()
	})
}

// New listens on 127.0.0.1:0 and forwards to target until ctx ends or
// Close is called.
func New(ctx context.Context, target string) (*Proxy, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, changed: make(chan struct{}), conns: map[*conn]struct{}{}}
	p.ctx, p.cancel = context.WithCancel(ctx)
	p.wg.Go(p.accept)
	p.wg.Go(func() {
		<-p.ctx.Done()
		_ = p.ln.Close()
		p.ResetAll()
	})
	return p, nil
}

// Addr is the host:port to dial instead of the target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Close stops the proxy, closes every connection and waits for its
// goroutines.
func (p *Proxy) Close() error {
	p.cancel()
	p.wg.Wait()
	return nil
}

// Blackhole stops delivering bytes in both directions; sockets stay open
// and what arrives is held (then back-pressured) until Unblackhole.
func (p *Proxy) Blackhole() { p.set(func() { p.hole = true }) }

// Unblackhole resumes delivery, held bytes first.
func (p *Proxy) Unblackhole() { p.set(func() { p.hole = false }) }

// Delay holds every chunk in dir for mean ± jitter (uniform), keeping the
// byte order of each connection. Delay(dir, 0, 0) removes it.
func (p *Proxy) Delay(dir Direction, mean, jitter time.Duration) {
	p.set(func() {
		for _, x := range []Direction{Up, Down} {
			if dir.has(x) {
				p.delay[x] = delaySpec{mean, jitter}
			}
		}
	})
}

// DropChunks makes each chunk read in dir lose, with probability prob, a
// random span of its bytes (possibly all of them), for d (0: until Heal or
// DropChunks(dir, 0, 0)). On loopback one read is often exactly one
// message of the protocol above, so dropping whole chunks would drop whole
// messages and leave the framing intact; cutting a span out of them
// corrupts the framing, as the scenarios intend: the peers must notice
// and close.
func (p *Proxy) DropChunks(dir Direction, prob float64, d time.Duration) {
	p.set(func() {
		for _, x := range []Direction{Up, Down} {
			if dir.has(x) {
				p.drop[x] = prob
			}
		}
		p.dropTill = time.Time{}
		if d > 0 {
			p.dropTill = time.Now().Add(d)
		}
	})
}

// Heal removes every fault: no blackhole, delay or drops.
func (p *Proxy) Heal() {
	p.set(func() {
		p.hole = false
		p.delay = [3]delaySpec{}
		p.drop = [3]float64{}
	})
}

// ResetAll closes every open connection (both sockets); new ones are
// still accepted.
func (p *Proxy) ResetAll() {
	p.mu.Lock()
	cs := make([]*conn, 0, len(p.conns))
	for c := range p.conns {
		cs = append(cs, c)
	}
	p.mu.Unlock()
	for _, c := range cs {
		c.close()
	}
}

// Stats returns how many connections were accepted, how many are open, and
// how many chunks were dropped.
func (p *Proxy) Stats() (accepted, open, dropped int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted, len(p.conns), p.dropped
}

func (p *Proxy) set(f func()) {
	p.mu.Lock()
	f()
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.wg.Go(func() { p.serve(c) })
	}
}

func (p *Proxy) serve(client net.Conn) {
	d := net.Dialer{Timeout: 5 * time.Second}
	server, err := d.DialContext(p.ctx, "tcp", p.target)
	if err != nil {
		_ = client.Close()
		return
	}
	c := &conn{client: client, server: server, dead: make(chan struct{})}
	p.mu.Lock()
	if p.ctx.Err() != nil {
		p.mu.Unlock()
		c.close()
		return
	}
	p.conns[c] = struct{}{}
	p.accepted++
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Go(func() { p.pump(c, client, server, Up) })
	wg.Go(func() { p.pump(c, server, client, Down) })
	wg.Wait()
	c.close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// chunk is what one read returned, and when it may be written.
type chunk struct {
	b   []byte
	at  time.Time
	eof bool
}

// queueLen bounds the chunks held per direction (32 KiB each): beyond it
// the reader stops and TCP back-pressure reaches the sender.
const queueLen = 64

// pump copies src to dst through a queue: the reader stamps each chunk
// with its release time, the writer waits for that time and for the
// blackhole to lift. Either side's end closes both sockets.
func (p *Proxy) pump(c *conn, src, dst net.Conn, dir Direction) {
	q := make(chan chunk, queueLen)
	done := make(chan struct{})
	go func() { // writer; ends before pump returns
		defer close(done)
		for ch := range q {
			if !p.waitRelease(c, ch.at) {
				break
			}
			if ch.eof {
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
				}
				continue
			}
			if _, err := dst.Write(ch.b); err != nil {
				break
			}
		}
		c.close() // unblocks the reader too
		for range q {
		}
	}()
	var last time.Time
	for {
		buf := make([]byte, 32<<10)
		n, err := src.Read(buf)
		if n > 0 && p.dropNow(dir) {
			i := rand.IntN(n)
			j := i + 1 + rand.IntN(n-i)
			n = copy(buf[i:], buf[j:n]) + i
		}
		if n > 0 {
			last = p.release(dir, last)
			q <- chunk{b: buf[:n], at: last}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				q <- chunk{eof: true, at: last}
			} else {
				c.close()
			}
			break
		}
	}
	close(q)
	<-done
}

// release is when a chunk read now in dir may go out: now + mean ±
// jitter, never before the previous chunk.
func (p *Proxy) release(dir Direction, last time.Time) time.Time {
	p.mu.Lock()
	ds := p.delay[dir]
	p.mu.Unlock()
	at := time.Now()
	if ds.mean > 0 || ds.jitter > 0 {
		d := ds.mean
		if ds.jitter > 0 {
			d += time.Duration(rand.Int64N(int64(2*ds.jitter)+1)) - ds.jitter
		}
		at = at.Add(max(d, 0))
	}
	if at.Before(last) {
		at = last
	}
	return at
}

func (p *Proxy) dropNow(dir Direction) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.dropTill.IsZero() && time.Now().After(p.dropTill) {
		p.drop = [3]float64{}
		p.dropTill = time.Time{}
	}
	if pr := p.drop[dir]; pr > 0 && rand.Float64() < pr {
		p.dropped++
		return true
	}
	return false
}

// waitRelease waits until at has passed and no blackhole is on; false if
// the connection or the proxy closed first.
func (p *Proxy) waitRelease(c *conn, at time.Time) bool {
	t := time.NewTimer(time.Hour)
	t.Stop()
	defer t.Stop()
	for {
		p.mu.Lock()
		hole, changed := p.hole, p.changed
		p.mu.Unlock()
		var timer <-chan time.Time
		if !hole {
			d := time.Until(at)
			if d <= 0 {
				return true
			}
			t.Reset(d)
			timer = t.C
		}
		select {
		case <-timer:
			return true
		case <-changed: // a fault changed: look again (Reset discards a stale fire, Go >= 1.23)
		case <-c.dead:
			return false
		case <-p.ctx.Done():
			return false
		}
	}
}
