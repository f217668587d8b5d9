package wsconn

import (
	"errors"
	"net"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/internal/mono"
)

// pingBurst is how many pings a peer may send at once; past that it must
// keep to the sustained rate of one per PeerPingMin.
const pingBurst = 5

// pingPolicy enforces PeerPingMin with the generic cell rate algorithm:
// tat is the theoretical arrival time of the next ping at the sustained
// rate; a ping at or before tat - burst × min breaks the policy. One
// comparison and no allocation per ping; the reader goroutine owns it.
type pingPolicy struct {
	min   time.Duration // <= 0: no limit
	burst time.Duration // pingBurst × min
	tat   time.Time
}

func newPingPolicy(min time.Duration) pingPolicy {
	return pingPolicy{min: min, burst: pingBurst * min}
}

// allow records a ping received at now and reports whether the peer keeps
// within the policy.
func (p *pingPolicy) allow(now time.Time) bool {
	if p.min <= 0 {
		return true
	}
	tat := p.tat
	if tat.Before(now) {
		tat = now
	}
	if tat.Sub(now) >= p.burst {
		return false
	}
	p.tat = tat.Add(p.min)
	return true
}

// sendPing runs on the ping timer's goroutine. A peer that pings keeps
// the timer from firing at all (onPing pushes it back), so it fires for
// a peer that never pings (a browser, a client that watches for this
// side's pings), or one that went quiet.
func (c *Conn) sendPing() {
	select {
	case <-c.closing:
		return
	default:
	}
	now := time.Now()
	if pinged := c.peerPinged.Load(); pinged != 0 && c.mayskip() && now.UnixNano()-pinged < int64(c.cfg.PingInterval/2) {
		// The peer pinged within half an interval (the timer fired as
		// its ping arrived): this side heard from it.
		c.rearm()
		return
	}
	if err := writeControl(c, websocket.PingMessage, "", now.Add(c.cfg.WriteTimeout)); err != nil {
		c.Shutdown(err)
		return
	}
	c.pingsSent.Add(1)
	c.rearm()
}

// pingWait is how long this side waits from its last ping, or from the
// peer's, before it pings: an interval, or, on the accepting side of a
// link whose peer pings, 1.25 intervals. Of two ends that ping alike,
// the dialling one (an agent, a client) thus pings and the accepting one
// (the hub) only answers, whatever their phases: one exchange per link
// per interval, and none of the hub's timers fires while its peers ping
// (at 10,000 idle agents that was 2,000 timer goroutines a second). A
// silence between exchanges stays under 1.25 intervals, a grid step
// (onPingGrid: at most 1/64 of an interval) and a round trip,
// inside the 7/8 × IdleTimeout (1.75 intervals by default) at which the
// link may be closed; a shorter IdleTimeout (mayskip) pings every
// interval, as configured.
func (c *Conn) pingWait() time.Duration {
	if c.wire.server && c.mayskip() && c.peerPinged.Load() != 0 {
		return c.cfg.PingInterval + c.cfg.PingInterval/4
	}
	return c.cfg.PingInterval
}

// rearm sets the ping timer for the next ping (pingWait), unless the
// connection closed meanwhile (shutdown's Stop must not be undone).
func (c *Conn) rearm() {
	c.ping.Reset(onPingGrid(time.Now(), c.pingWait(), c.cfg.PingInterval))
	select {
	case <-c.closing:
		c.ping.Stop()
	default:
	}
}

// maxPingGrid is the widest step of the grid ping timers fire on.
const maxPingGrid = 20 * time.Millisecond

// onPingGrid lengthens the wait d from now so that it ends on a step of
// a grid of the wall clock: min(maxPingGrid, interval/64). The pings of
// many links then leave together (and, clocks kept by NTP, those of many
// hosts' links arrive together), so a hub with thousands of idle links
// answers them in bursts instead of waking for each one: as the kernel
// rounds timers to whole ticks to save wake-ups (round_jiffies). An
// interval grows by less than 1/64.
func onPingGrid(now time.Time, d, interval time.Duration) time.Duration {
	step := min(maxPingGrid, interval/64)
	if step <= 0 {
		return d
	}
	if r := time.Duration(now.Add(d).UnixNano() % int64(step)); r != 0 {
		d += step - r
	}
	return d
}

// mayskip reports whether a ping may be skipped at all: the silence it
// allows (up to 1.5 intervals) must stay inside the 7/8 × IdleTimeout at
// which the link may be closed, as with the default IdleTimeout of 2
// intervals. With a shorter one every ping goes out, as configured.
func (c *Conn) mayskip() bool { return c.cfg.PingInterval*12 < c.cfg.IdleTimeout*7 }

// heardFrom notes, on the reader goroutine, that something arrived at
// now: the read deadline moves IdleTimeout past it, but only once the
// last move has aged an eighth of IdleTimeout (moving it costs a runtime
// timer update, which at tens of thousands of messages a second showed
// in profiles). A link is thus closed after between 7/8 × IdleTimeout
// and IdleTimeout of silence.
func (c *Conn) heardFrom() {
	if mono.Now()-c.heard.Load() >= int64(c.cfg.IdleTimeout/8) {
		_ = c.setReadDeadline(time.Now().Add(c.cfg.IdleTimeout))
	}
}

// onPing runs on the reader goroutine for every ping: it enforces the
// peer ping policy, then answers with a pong as gorilla's default handler
// does. An error ends the read loop, which closes the connection.
func (c *Conn) onPing(data string) error {
	if err := c.heardPing(); err != nil {
		return err
	}
	return c.pong(data)
}

// heardPing notes a ping from the peer and enforces the peer ping
// policy (errTooManyPings).
func (c *Conn) heardPing() error {
	now := time.Now()
	c.heardFrom()
	c.peerPinged.Store(now.UnixNano())
	if c.mayskip() {
		c.rearm() // the peer watches the link: this side need not ping (pingWait)
	}
	if !c.pings.allow(now) {
		if c.cfg.PingAbuse != nil {
			c.cfg.PingAbuse()
		}
		return errTooManyPings
	}
	return nil
}

// pong answers a ping. An idle reader runs it from its loop's frame, on
// its 2 KiB stack (TestIdleReaderStackStays): what it calls on the way
// to write(2) must stay small.
func (c *Conn) pong(data string) error {
	return pongError(writeControl(c, websocket.PongMessage, data, time.Now().Add(time.Second)))
}

// pongError is the error a failed pong ends the read with: none for a
// connection already closing or a writer stuck (its own timeout tells).
//
//go:noinline
func pongError(err error) error {
	if err == nil || errors.Is(err, websocket.ErrCloseSent) {
		return nil
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return nil
	}
	return err
}

// Stalled reports that the connection has read nothing, not even the
// pong to a ping sent since, for longer than a ping interval and a
// margin (IdleTimeout/4: the reader notes what it reads only every
// IdleTimeout/8, and the pong takes a round trip). A connection that is
// healthy always has something to read by then; one that is stalled
// (its TCP stream held up by retransmission timeouts, its path cut) will
// be closed at IdleTimeout. Calls that ran out of time on a stalled
// connection say nothing of the agent behind it. False while the reader
// is paused by backpressure (it reads nothing then, by choice).
func (c *Conn) Stalled() bool {
	heard := c.heard.Load()
	return heard != 0 && mono.Now()-heard > int64(c.cfg.PingInterval+c.cfg.IdleTimeout/4)
}

// LastHeard is when the connection last read something, to within an
// eighth of IdleTimeout (heardFrom moves the mark no oftener); now while
// the reader is paused by backpressure (it reads nothing then, by
// choice).
func (c *Conn) LastHeard() time.Time {
	heard := c.heard.Load()
	if heard == 0 {
		return time.Now()
	}
	return mono.Time(heard)
}
