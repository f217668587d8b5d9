package link

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/link/wsconn"
)

// DefaultHubURL is the hub a client or agent uses unless told otherwise.
const DefaultHubURL = "ws://127.0.0.1:7700/ws"

// WSURL normalises a hub address for a WebSocket link: "host:port",
// "http://host:port" and "ws://host:port" all become "ws://host:port/ws"
// (https becomes wss); an explicit path is kept.
func WSURL(hub string) (string, error) {
	if !strings.Contains(hub, "://") {
		hub = "ws://" + hub
	}
	u, err := url.Parse(hub)
	if err != nil {
		return "", fmt.Errorf("mesh: bad hub URL %q: %w", hub, err)
	}
	switch u.Scheme {
	case "ws", "wss":
	case "http":
		u.Scheme = "ws"
	case "https":
		u.Scheme = "wss"
	default:
		return "", fmt.Errorf("mesh: hub URL %q: scheme must be ws, wss, http or https", hub)
	}
	if u.Host == "" {
		return "", fmt.Errorf("mesh: hub URL %q has no host", hub)
	}
	if u.Path == "" || u.Path == "/" || u.Path == "/rpc" {
		u.Path = "/ws"
	}
	return u.String(), nil
}

// Dial dials a hub's /ws with the native subprotocol and starts a Link
// over it. ctx bounds the dial only.
func Dial(ctx context.Context, hub string, cfg Config, opts ...Option) (*Link, error) {
	return DialToken(ctx, hub, "", cfg, opts...)
}

// DialToken is Dial presenting a bearer token (none if empty).
func DialToken(ctx context.Context, hub, token string, cfg Config, opts ...Option) (*Link, error) {
	return DialCheck(ctx, hub, token, nil, cfg, opts...)
}

// writeBufferSize is a dialled link's WebSocket write buffer.
const writeBufferSize = 32 << 10

// dialWriteBuffers pools the dialled links' write buffers (gorilla's
// WriteBufferPool).
var dialWriteBuffers sync.Pool

// DialCheck is DialToken; check, if set, is given the hub's answer to
// the upgrade before the link starts: when it fails the socket is closed,
// nothing having been sent over it, and its error returned (a peer hub's
// proof, peerauth.go).
//
// Its write buffer comes from a pool only while it writes (an idle link
// holds none), and is large enough that a message up to 32 KiB (a batch
// of small frames, a stream's 16-KiB chunk) goes out as one frame in one
// write: at 4 KiB, an agent streaming 16-KiB chunks made four writes of
// each, 82 % of its CPU (bench -stream's profile).
func DialCheck(ctx context.Context, hub, token string, check func(*http.Response) error, cfg Config, opts ...Option) (*Link, error) {
	u, err := WSURL(hub)
	if err != nil {
		return nil, envelope.WrapError(envelope.CodeInvalidRequest, err.Error(), err)
	}
	d := websocket.Dialer{
		Proxy:            http.ProxyFromEnvironment,
		HandshakeTimeout: 10 * time.Second,
		Subprotocols:     []string{envelope.SubprotocolV2, envelope.Subprotocol},
		ReadBufferSize:   4096,
		WriteBufferSize:  writeBufferSize,
		WriteBufferPool:  &dialWriteBuffers,
		TLSClientConfig:  cfg.TLS,
		NetDialContext:   wsconn.DialReadAhead,
	}
	if cfg.Dial != nil {
		d.NetDialContext = cfg.Dial
	}
	if cfg.JSONFrames {
		d.Subprotocols = d.Subprotocols[1:]
	}
	var hdr http.Header
	if token != "" {
		hdr = http.Header{"Authorization": {"Bearer " + token}}
	}
	ws, resp, err := d.DialContext(ctx, u, hdr)
	if err != nil {
		if resp != nil && (resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden) {
			code := envelope.CodeUnauthenticated
			if resp.StatusCode == http.StatusForbidden {
				code = envelope.CodePermissionDenied
			}
			return nil, envelope.WrapError(code, fmt.Sprintf("hub %s refused the WebSocket: %s", u, resp.Status), err)
		}
		if resp != nil {
			return nil, envelope.WrapError(envelope.CodeUnavailable, fmt.Sprintf("hub %s refused the WebSocket: %s", u, resp.Status), errors.Join(ErrHubUnreachable, err)).MarkNotSent()
		}
		return nil, envelope.WrapError(envelope.CodeUnavailable, fmt.Sprintf("cannot reach hub %s: %v", u, NetErrText(err)), errors.Join(ErrHubUnreachable, err)).MarkNotSent()
	}
	if sp := ws.Subprotocol(); sp != envelope.Subprotocol && (sp != envelope.SubprotocolV2 || cfg.JSONFrames) {
		_ = ws.Close()
		return nil, envelope.Errorf(envelope.CodeUnavailable, "hub %s does not speak %s", u, envelope.Subprotocol)
	}
	if check != nil {
		if err := check(resp); err != nil {
			_ = ws.Close()
			return nil, err
		}
	}
	return New(ws, cfg, opts...), nil
}

// NetErrText shortens "dial tcp 127.0.0.1:1: connect: connection refused".
func NetErrText(err error) string {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		if oe.Addr == nil { // e.g. a TLS alert from the hub
			return oe.Op + ": " + oe.Err.Error()
		}
		return oe.Op + " " + oe.Addr.String() + ": " + oe.Err.Error()
	}
	return err.Error()
}

// Redial is the delay schedule of a link's redials after a failed dial (and
// of an agent's first redial after losing its link): "full jitter", each
// delay uniform between 100 ms and a ceiling that stays at 1 s for the
// first four tries, then grows ×1.5 up to 5 s. The 100 ms floor keeps a
// link from hammering a hub that refuses it; the wide jitter spreads the
// redials of many links that lost the same hub at the same instant over
// the whole second instead of a synchronised wave (S04), and keeping the
// ceiling flat while the hub is likely restarting keeps the attempt rate
// even rather than front-loaded. The zero value is ready; not safe for
// concurrent use.
type Redial struct{ n int }

// Redial bounds.
const (
	RedialMin     = 100 * time.Millisecond
	RedialInitial = time.Second
	RedialMax     = 5 * time.Second
)

// Next returns the next delay.
func (r *Redial) Next() time.Duration {
	ceil := float64(RedialInitial)
	for i := 4; i <= r.n && ceil < float64(RedialMax); i++ {
		ceil *= 1.5
	}
	ceil = min(ceil, float64(RedialMax))
	r.n++
	return RedialMin + time.Duration(rand.Float64()*(ceil-float64(RedialMin)))
}

// Reset starts the schedule again (after a link was established).
func (r *Redial) Reset() { r.n = 0 }

// RedialSpread bounds the first redial of a link that was established and
// is lost while other hubs are listed: the link waits uniform [0,
// RedialSpread), then dials the next hub. Every link of a killed hub loses
// it at the same instant; spread over 2 s, 16 of them put more than 30 %
// of their attempts in one 100 ms window in about 3 % of runs, over 1 s in
// about 18 % (S03's criterion, simulated). Calls made meanwhile wait for
// the new link (within their deadline); calls in flight on the lost link
// have failed UNAVAILABLE at once and are retried per policy. Agents
// spread over their heartbeat interval when it is shorter, so that they
// are registered elsewhere within about two intervals.
const RedialSpread = 2 * time.Second

// LostDelay is the delay before the first redial of a link lost while
// other hubs are listed (see RedialSpread).
func LostDelay() time.Duration { return rand.N(RedialSpread) }
