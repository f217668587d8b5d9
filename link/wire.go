package link

import (
	"io"
	"net"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/link/wsconn"
)

// The connection layer lives in link/wsconn: one WebSocket, its reader
// and writer, the send queue, backpressure and the slow-consumer close.
// These names keep link's API whole for its users.

// Config tunes one WebSocket connection (wsconn.Config).
type Config = wsconn.Config

// Conn is one WebSocket connection (wsconn.Conn).
type Conn = wsconn.Conn

// CapListener bounds the connections a listener accepts (wsconn.CapListener).
type CapListener = wsconn.CapListener

// NewConn wraps an established WebSocket (wsconn.NewConn).
func NewConn(ws *websocket.Conn, cfg Config) *Conn { return wsconn.NewConn(ws, cfg) }

// NewConnShared wraps an established WebSocket with a shared
// configuration (wsconn.NewConnShared).
func NewConnShared(ws *websocket.Conn, cfg *Config) *Conn { return wsconn.NewConnShared(ws, cfg) }

// NewCapListener is wsconn.NewCapListener.
func NewCapListener(ln net.Listener, max int64, refused func()) *CapListener {
	return wsconn.NewCapListener(ln, max, refused)
}

// GetBuf takes a frame buffer from the pool (wsconn.GetBuf).
func GetBuf() *[]byte { return wsconn.GetBuf() }

// PutBuf returns a frame buffer to the pool (wsconn.PutBuf).
func PutBuf(b *[]byte) { wsconn.PutBuf(b) }

// ErrHubUnreachable is the cause of the UNAVAILABLE error a client returns
// when it cannot connect to any hub.
var ErrHubUnreachable = wsconn.ErrHubUnreachable

// ErrNotReading is the cause, wrapped, of every close of a peer that
// stopped reading its messages.
var ErrNotReading = wsconn.ErrNotReading

// NotReading is a cause for Shutdown: the peer does not read
// (wsconn.NotReading).
func NotReading(text string) error { return wsconn.NotReading(text) }

// ReadExact reads all of r, at most limit bytes, into a buffer of its
// exact size (wsconn.ReadExact): a request body.
func ReadExact(r io.Reader, limit int) ([]byte, error) { return wsconn.ReadExact(r, limit) }

// ReadChecked is wsconn.ReadChecked for a reader that is not a socket: a
// request body read whole, refused by check before it is copied out.
func ReadChecked(r io.Reader, limit int, check func([]byte) *envelope.Error, keep int) ([]byte, *envelope.Error, error) {
	return wsconn.ReadChecked(r, nil, limit, check, keep)
}

// TuneLink bounds the retransmission timeout of an accepted connection
// that carries a peer hub's link, as on the connections a process dials
// (wsconn.TuneLink).
func TuneLink(c net.Conn) { wsconn.TuneLink(c) }
