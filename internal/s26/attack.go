package s26

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/rawhttp"
)

// Target is where the attackers aim.
type Target struct {
	Addr string // host:port of the hub
	WS   string // its ws:// URL
}

// Stats gathers what the hostile senders saw. It travels as JSON from
// the attacker process to the process that started it.
type Stats struct {
	mu        sync.Mutex
	Lat       []time.Duration // first byte sent → answer (reply, status or close)
	Sent      int
	Bad       []string // unexpected outcomes (first few)
	NBad      int
	Closes    map[string]int // how over-limit WebSocket messages ended
	RoutedOK  int64          // "method and METHOD" answered: count.hit must have run this often
	ByOutcome map[string]int
	ByItem    map[string][]time.Duration
}

// NewStats returns empty Stats.
func NewStats() *Stats {
	return &Stats{Closes: map[string]int{}, ByOutcome: map[string]int{}, ByItem: map[string][]time.Duration{}}
}

func (s *Stats) record(it *Item, tr string, d time.Duration, outcome string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Sent++
	s.Lat = append(s.Lat, d)
	s.ByOutcome[outcome]++
	s.ByItem[it.Name+" / "+tr] = append(s.ByItem[it.Name+" / "+tr], d)
	if err != nil {
		s.NBad++
		if len(s.Bad) < 10 {
			s.Bad = append(s.Bad, fmt.Sprintf("%s over %s: %v", it.Name, tr, err))
		}
	}
}

func (s *Stats) routed() {
	s.mu.Lock()
	s.RoutedOK++
	s.mu.Unlock()
}

// Slowest names the n inputs (per transport) with the highest p99, with
// their p50/p99/max in ms.
func (s *Stats) Slowest(n int) []string {
	type row struct {
		name string
		p99  time.Duration
	}
	var rows []row
	for k, ds := range s.ByItem {
		rows = append(rows, row{k, Pctl(ds, 99)})
	}
	slices.SortFunc(rows, func(a, b row) int { return int(b.p99 - a.p99) })
	var out []string
	for _, r := range rows[:min(n, len(rows))] {
		ds := s.ByItem[r.name]
		out = append(out, fmt.Sprintf("%s: n=%d p50=%.1f p99=%.1f max=%.1f", r.name, len(ds), Ms(Pctl(ds, 50)), Ms(r.p99), Ms(Pctl(ds, 100))))
	}
	return out
}

// Pctl returns the p-th percentile (0..100) of ds, or 0 for none.
func Pctl(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(float64(len(s)-1)*p/100)]
}

// Ms is d in milliseconds, to the microsecond.
func Ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// Once sends each item once on each transport: HTTP /rpc, a plain
// JSON-RPC WebSocket and, where it applies, a native link, each on a
// connection of its own.
func Once(ctx context.Context, m Target, corpus []*Item) *Stats {
	st := NewStats()
	for _, it := range corpus {
		var rc *rawhttp.Conn
		sendHTTP(ctx, m.Addr, &rc, it, st)
		if rc != nil {
			rc.Close()
		}
		var ws *websocket.Conn
		sendWS(ctx, m, &ws, it, st, false)
		if it.native != nil {
			var nws *websocket.Conn
			sendWS(ctx, m, &nws, it, st, true)
			if nws != nil {
				nws.Close()
			}
		}
		if ws != nil {
			ws.Close()
		}
	}
	return st
}

// Attack runs 4 HTTP, 4 plain WebSocket and 2 native attackers, each
// sending one corpus input every 10 ms (closed loop: never more than one
// outstanding), until ctx ends. corpus must not be empty.
func Attack(ctx context.Context, m Target, corpus []*Item, st *Stats) {
	var native []*Item
	for _, it := range corpus {
		if it.native != nil {
			native = append(native, it)
		}
	}
	var wg sync.WaitGroup
	for a := range 10 {
		wg.Go(func() {
			tk := time.NewTicker(10 * time.Millisecond)
			defer tk.Stop()
			var rc *rawhttp.Conn
			var ws *websocket.Conn
			defer func() {
				if rc != nil {
					rc.Close()
				}
				if ws != nil {
					ws.Close()
				}
			}()
			for i := a; ctx.Err() == nil; i++ {
				switch {
				case a < 4:
					sendHTTP(ctx, m.Addr, &rc, corpus[i%len(corpus)], st)
				case a < 8:
					sendWS(ctx, m, &ws, corpus[i%len(corpus)], st, false)
				case len(native) > 0:
					sendWS(ctx, m, &ws, native[i%len(native)], st, true)
				default: // a corpus (narrowed by s26diag -only) with no native input
					sendHTTP(ctx, m.Addr, &rc, corpus[i%len(corpus)], st)
				}
				select {
				case <-ctx.Done():
				case <-tk.C:
				}
			}
		})
	}
	wg.Wait()
}

// ctxOver reports whether ctx has ended or reached its deadline (a dial
// bounded by the deadline can fail with a timeout a moment before the
// context's own timer marks it done).
func ctxOver(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	return ctx.Err() != nil || (ok && !time.Now().Before(dl))
}

// sendHTTP sends one item over HTTP; *rcp is reused while the server
// keeps the connection open.
func sendHTTP(ctx context.Context, addr string, rcp **rawhttp.Conn, it *Item, st *Stats) {
	if *rcp == nil {
		rc, err := rawhttp.Dial(ctx, addr)
		if err != nil {
			if !ctxOver(ctx) { // not the attack's end cutting a dial short
				st.record(it, "http", 0, "dial error", err)
			}
			return
		}
		*rcp = rc
	}
	start := time.Now()
	status, body, closed, err := (*rcp).ExchangeFunc(it.httpRequest(false), 10*time.Second)
	d := time.Since(start)
	if closed {
		*rcp = nil
	}
	if err != nil {
		st.record(it, "http", d, "transport error", err)
		return
	}
	switch it.expect {
	case expTooBig:
		if status != http.StatusRequestEntityTooLarge {
			err = fmt.Errorf("HTTP %d %.200q; want 413", status, body)
		} else {
			err = it.checkReply(body)
		}
	case expHeader:
		if status != http.StatusRequestHeaderFieldsTooLarge {
			err = fmt.Errorf("HTTP %d; want 431", status)
		}
	default:
		if status != http.StatusOK {
			err = fmt.Errorf("HTTP %d %.200q; want 200", status, body)
		} else {
			err = it.checkReply(body)
		}
	}
	if err == nil && it.expect == expRouted {
		st.routed()
	}
	st.record(it, "http", d, strconv.Itoa(status), err)
}

// writeRawFrame writes p as one unfragmented text frame, straight to the
// connection (gorilla's client writer would split it into buffer-sized
// fragments). The mask key is zero, which leaves the payload as is.
func writeRawFrame(c net.Conn, p *payload) error {
	hdr := []byte{0x81, 0x80 | 127, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
	for i := range 8 {
		hdr[2+i] = byte(uint64(p.size) >> (56 - 8*i))
	}
	if _, err := c.Write(hdr); err != nil {
		return err
	}
	return p.write(c)
}

// sendWS sends one item over a plain JSON-RPC WebSocket (*wsp is
// redialled after a close), or, with native, its native frame over an
// agentmesh.v1 link.
func sendWS(ctx context.Context, m Target, wsp **websocket.Conn, it *Item, st *Stats, native bool) {
	tr := "ws"
	if native {
		tr = "native"
	}
	if it.header {
		rc, err := rawhttp.Dial(ctx, m.Addr)
		if err != nil {
			if !ctxOver(ctx) {
				st.record(it, tr, 0, "dial error", err)
			}
			return
		}
		start := time.Now()
		status, _, _, err := rc.ExchangeFunc(it.httpRequest(true), 10*time.Second)
		d := time.Since(start)
		_ = rc.Close()
		if err == nil && status != http.StatusRequestHeaderFieldsTooLarge {
			err = fmt.Errorf("upgrade with a 16 MiB header: HTTP %d; want 431", status)
		}
		st.record(it, tr, d, strconv.Itoa(status), err)
		return
	}
	if *wsp == nil {
		d := websocket.Dialer{HandshakeTimeout: 10 * time.Second}
		if native {
			d.Subprotocols = []string{envelope.Subprotocol}
		}
		ws, res, err := d.DialContext(ctx, m.WS, nil)
		if err != nil {
			if !ctxOver(ctx) {
				st.record(it, tr, 0, "dial error", err)
			}
			return
		}
		res.Body.Close()
		*wsp = ws
	}
	ws := *wsp
	msg, expect := &it.body, it.expect
	if native {
		msg, expect = it.native, it.natExp
	}
	start := time.Now()
	werr := make(chan error, 1)
	go func() {
		switch {
		case msg.small != nil:
			werr <- ws.WriteMessage(websocket.TextMessage, msg.small)
		case it.chunked: // continuation frames of gorilla's buffer size (4 KiB)
			w, err := ws.NextWriter(websocket.TextMessage)
			if err == nil {
				err = msg.write(w)
			}
			if err == nil {
				err = w.Close()
			}
			werr <- err
		default:
			werr <- writeRawFrame(ws.NetConn(), msg)
		}
	}()
	_ = ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	var reply []byte
	var rerr error
	for {
		var typ int
		typ, reply, rerr = ws.ReadMessage()
		if rerr != nil || !native || typ != websocket.TextMessage {
			break
		}
		// A native link may carry other frames; ours answers seq 7.
		var f struct{ Seq uint64 }
		if json.Unmarshal(reply, &f) == nil && f.Seq == 7 {
			break
		}
	}
	d := time.Since(start)
	if rerr != nil {
		_ = ws.Close()
		*wsp = nil
	}
	<-werr
	var err error
	outcome := "reply"
	switch {
	case expect == expTooBig:
		outcome = "other close"
		if websocket.IsCloseError(rerr, websocket.CloseMessageTooBig) {
			outcome = "close 1009"
		}
		st.mu.Lock()
		st.Closes[outcome]++
		st.mu.Unlock()
		if outcome != "close 1009" {
			err = fmt.Errorf("got %v %.100q; want close 1009", rerr, reply)
		}
	case rerr != nil:
		outcome = "closed"
		err = fmt.Errorf("connection lost: %v", rerr)
	case native:
		err = checkNative(reply, expect)
	default:
		err = it.checkReply(reply)
	}
	if err == nil && expect == expRouted {
		st.routed()
	}
	st.record(it, tr, d, outcome, err)
}
