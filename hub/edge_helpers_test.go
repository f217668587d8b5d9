// Helpers shared by the edge scenarios (S26, S27: scenario build tag)
// and S29 (always).

package hub_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/telemetry"
)

func ms(d time.Duration) float64 { return testkit.Ms(d) }

// openFDs counts this process's open file descriptors (the hub runs in
// process, so this is the hub's count plus the test's own).
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("read /proc/self/fd: %v", err)
	}
	return len(ents)
}

// refusedTotal reads agentmesh_security_refused_total{reason}.
func refusedTotal(t *testing.T, m *telemetry.Metrics, reason string) float64 {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "agentmesh_security_refused_total" {
			continue
		}
		for _, s := range f.Metric {
			for _, lp := range s.Label {
				if lp.GetName() == "reason" && lp.GetValue() == reason {
					return s.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// rawConn is an HTTP/1.1 connection driven by hand, for requests a
// well-behaved client would never send.
type rawConn struct {
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(ctx context.Context, addr string) (*rawConn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	return &rawConn{c: c, br: bufio.NewReader(c)}, nil
}

// exchange writes req (on its own goroutine: the server may answer and
// stop reading before the request is fully sent) and reads one response.
// closed reports that the connection is no longer usable (the server
// closed it, or the write did not finish); the conn is then closed.
func (rc *rawConn) exchange(req []byte, timeout time.Duration) (status int, body []byte, closed bool, err error) {
	return rc.exchangeFunc(func(w io.Writer) error { _, err := w.Write(req); return err }, timeout)
}

// exchangeFunc is exchange with the request written by write.
func (rc *rawConn) exchangeFunc(write func(io.Writer) error, timeout time.Duration) (status int, body []byte, closed bool, err error) {
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

// ---- S26: hostile JSON and frames ----
