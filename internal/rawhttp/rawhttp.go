// Package rawhttp drives an HTTP/1.1 connection by hand, for the
// requests a well-behaved client would never send (the hostile and
// framing scenarios S26, S27, S29).
package rawhttp

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"time"
)

// Conn is one hand-driven HTTP/1.1 connection.
type Conn struct {
	c  net.Conn
	br *bufio.Reader
}

// Dial connects to addr over TCP.
func Dial(ctx context.Context, addr string) (*Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &Conn{c: c, br: bufio.NewReader(c)}, nil
}

// Net returns the underlying connection.
func (rc *Conn) Net() net.Conn { return rc.c }

// Reader returns the buffered reader of the connection's responses.
func (rc *Conn) Reader() *bufio.Reader { return rc.br }

// Close closes the connection.
func (rc *Conn) Close() error { return rc.c.Close() }

// Exchange writes req (on its own goroutine: the server may answer and
// stop reading before the request is fully sent) and reads one response.
// closed reports that the connection is no longer usable (the server
// closed it, or the write did not finish); the conn is then closed.
func (rc *Conn) Exchange(req []byte, timeout time.Duration) (status int, body []byte, closed bool, err error) {
	return rc.ExchangeFunc(func(w io.Writer) error { _, err := w.Write(req); return err }, timeout)
}

// ExchangeFunc is Exchange with the request written by write.
func (rc *Conn) ExchangeFunc(write func(io.Writer) error, timeout time.Duration) (status int, body []byte, closed bool, err error) {
	_ = rc.c.SetDeadline(time.Now().Add(timeout))
	werr := make(chan error, 1)
	go func() { werr <- write(rc.c) }()
	res, err := http.ReadResponse(rc.br, nil)
	if err != nil {
		_ = rc.c.Close()
		<-werr
		return 0, nil, true, err
	}
	body, _ = io.ReadAll(res.Body)
	_ = res.Body.Close()
	if res.Close {
		// The server answered before (or instead of) reading everything:
		// closing unblocks the writer.
		_ = rc.c.Close()
		<-werr
		return res.StatusCode, body, true, nil
	}
	if e := <-werr; e != nil {
		_ = rc.c.Close()
		return res.StatusCode, body, true, nil
	}
	_ = rc.c.SetDeadline(time.Time{})
	return res.StatusCode, body, false, nil
}
