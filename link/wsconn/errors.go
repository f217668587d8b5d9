package wsconn

import (
	"errors"
	"fmt"

	"github.com/gorilla/websocket"
)

// ErrHubUnreachable is the cause of the UNAVAILABLE error a client returns
// when it cannot connect to any hub.
var ErrHubUnreachable = errors.New("cannot reach the hub")

// closeError ends a connection with its WebSocket close code and text.
type closeError struct {
	code       int
	text       string
	notReading bool
}

func (e *closeError) Error() string { return e.text }

func (e *closeError) Unwrap() error {
	if e.notReading {
		return ErrNotReading
	}
	return nil
}

// ErrNotReading is the cause, wrapped, of every close of a peer that
// stopped reading its messages: a slow consumer, a full send queue.
var ErrNotReading = errors.New("peer does not read")

// NotReading is a cause for Shutdown: the peer does not read (its send
// queue is full, say); the connection closes 1008 with text. The close
// frame is sent only when the writer kept room for it in the kernel's
// buffer (WithBackpressure): otherwise the writer is stuck on the
// peer's full buffer and the frame would not arrive, nor would Shutdown
// return before the close frame's deadline.
func NotReading(text string) error {
	return &closeError{code: websocket.ClosePolicyViolation, text: text, notReading: true}
}

var (
	errConnClosed   = errors.New("connection closed")
	errTooManyPings = errors.New("peer pings too often: too many pings")
	// errSlowConsumer: the peer took none of the bytes written to it for
	// WriteTimeout (or left its send queue full that long).
	errSlowConsumer = fmt.Errorf("%w: slow consumer", ErrNotReading)
)
