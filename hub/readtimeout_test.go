package hub_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
)

// TestReadTimeoutCutsPartialRequests: the hub's HTTP server bounds the
// time to read a request (ReadHeaderTimeout for its headers, ReadTimeout
// for the whole of it; 5 s and 30 s, shortened here to 1 s and 2 s). A
// connection that sends half a header, a header and half a body, or a
// body trickled a byte at a time is closed by the hub, and its call never
// reaches an agent; meanwhile other callers go on, including a /rpc call
// whose body was read in time and which then runs longer than
// ReadTimeout, and a WebSocket link idle for longer than it.
func TestReadTimeoutCutsPartialRequests(t *testing.T) {
	const header, whole = time.Second, 2 * time.Second
	m := meshtest.Start(t, hub.Config{}, hub.WithReadTimeouts(header, whole))
	m.RunAgent(t, agents.NewEcho())
	link := m.Client(t, mesh.WithoutReliability())
	if err := link.Call(t.Context(), "echo.echo", map[string]int{"n": 1}, nil); err != nil {
		t.Fatalf("link call: %v", err)
	}

	const body = `{"jsonrpc":"2.0","id":1,"method":"echo.sleep","params":{"ms":1}}`
	head := "POST /rpc HTTP/1.1\r\nHost: hub\r\nContent-Type: application/json\r\n"
	cases := []struct {
		name  string
		first string        // written at once
		drip  string        // then written a byte per drip interval
		bound time.Duration // the timeout that must cut it
	}{
		{name: "half a header", first: head + "X-Slow: abc", bound: header},
		{name: "header dripped", first: "POST /rpc HTTP/1.1\r\n", drip: "Host: hub\r\nX-Slow: " + strings.Repeat("z", 200), bound: header},
		{name: "half a body", first: head + "Content-Length: 64\r\n\r\n" + body[:20], bound: whole},
		{name: "body dripped", first: head + "Content-Length: 64\r\n\r\n", drip: body[:63], bound: whole},
		{name: "chunked body unfinished", first: head + "Transfer-Encoding: chunked\r\n\r\n10\r\n" + body[:16] + "\r\n", bound: whole},
	}

	// A legitimate /rpc call, body sent at once, that runs 2.5 × ReadTimeout:
	// the request was read in time, so the read deadline no longer applies
	// to it (net/http clears it once the body is read; a handler that
	// kept it would see its context cancelled when it passed).
	var wg sync.WaitGroup
	var slowErr error
	var slowBody string
	wg.Go(func() {
		res, err := http.Post(m.HTTP+"/rpc", "application/json",
			strings.NewReader(`{"jsonrpc":"2.0","id":7,"method":"echo.sleep","params":{"ms":5000}}`))
		if err != nil {
			slowErr = err
			return
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		slowBody = string(b)
	})

	type outcome struct {
		name     string
		after    time.Duration
		answered string
		err      error
	}
	results := make([]outcome, len(cases))
	for i, tc := range cases {
		wg.Go(func() {
			results[i] = outcome{name: tc.name}
			c, err := net.Dial("tcp", m.Addr)
			if err != nil {
				results[i].err = err
				return
			}
			defer c.Close()
			start := time.Now()
			if _, err := io.WriteString(c, tc.first); err != nil {
				results[i].err = err
				return
			}
			// Drip the rest a byte every 100 ms in the background; the
			// reader below sees the hub's answer or close.
			stop := make(chan struct{})
			defer close(stop)
			if tc.drip != "" {
				go func() {
					for k := 0; k < len(tc.drip); k++ {
						select {
						case <-stop:
							return
						case <-time.After(100 * time.Millisecond):
						}
						if _, err := c.Write([]byte{tc.drip[k]}); err != nil {
							return
						}
					}
				}()
			}
			_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
			b, err := io.ReadAll(c) // until the hub closes (or resets) the connection
			results[i].after = time.Since(start)
			results[i].answered = firstLine(string(b))
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				results[i].err = errors.New("still open after 20 s")
			}
		})
	}

	// Other callers meanwhile: a call per 100 ms on the link.
	stopLegit := make(chan struct{})
	var legitOK, legitFailed int
	var legitWG sync.WaitGroup
	legitWG.Go(func() {
		for {
			select {
			case <-stopLegit:
				return
			case <-time.After(100 * time.Millisecond):
			}
			if err := link.Call(t.Context(), "echo.echo", map[string]int{"n": 2}, nil); err != nil {
				legitFailed++
				t.Logf("legitimate call: %v", err)
			} else {
				legitOK++
			}
		}
	})
	wg.Wait()
	close(stopLegit)
	legitWG.Wait()

	for i, r := range results {
		tc := cases[i]
		t.Logf("%s: closed after %v, answered %q", r.name, r.after.Round(time.Millisecond), r.answered)
		if r.err != nil {
			t.Errorf("%s: %v", r.name, r.err)
			continue
		}
		// Timers never fire early: a cut before the bound is some other
		// refusal, not the timeout under test. The upper bound is generous
		// for a loaded machine.
		if r.after < tc.bound-50*time.Millisecond || r.after > tc.bound+8*time.Second {
			t.Errorf("%s: closed after %v; want at its %v bound (+ slack)", r.name, r.after, tc.bound)
		}
		if r.answered != "" && !strings.HasPrefix(r.answered, "HTTP/1.1 4") {
			t.Errorf("%s: answered %q before closing; want nothing or a 4xx", r.name, r.answered)
		}
	}
	if slowErr != nil || !strings.Contains(slowBody, `"result":{"slept":5000}`) {
		t.Errorf("a /rpc call running longer than ReadTimeout: %v %s; want its result", slowErr, slowBody)
	}
	if legitFailed != 0 || legitOK == 0 {
		t.Errorf("legitimate calls during the slow requests: %d ok, %d failed", legitOK, legitFailed)
	}
	// The link stayed open through it all (a hijacked connection has no
	// read deadline of the HTTP server's).
	if err := link.Call(t.Context(), "echo.echo", map[string]int{"n": 3}, nil); err != nil {
		t.Errorf("link after %v: %v", 3*whole, err)
	}
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\r\n")
	return l
}
