package hub_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/rawhttp"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
)

// s29Call is a JSON-RPC request as a POST /rpc with a Content-Length.
func s29Call(method, id string) string {
	body := fmt.Sprintf(`{"jsonrpc":"2.0","method":%q,"id":%q}`, method, id)
	return fmt.Sprintf("POST /rpc HTTP/1.1\r\nHost: hub\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}

// readAll reads every response the hub sends on rc until it closes the
// connection or stays silent for quiet; it returns the statuses and
// bodies, and whether the connection was closed.
func readAll(rc *rawhttp.Conn, quiet time.Duration) (statuses []int, bodies []string, closed bool) {
	for {
		_ = rc.Net().SetReadDeadline(time.Now().Add(quiet))
		res, err := http.ReadResponse(rc.Reader(), nil)
		if err != nil {
			return statuses, bodies, !testkit.IsTimeout(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		statuses = append(statuses, res.StatusCode)
		bodies = append(bodies, string(b))
		if res.Close {
			return statuses, bodies, true
		}
	}
}

// TestS29FramingProbes is S29: raw requests to /rpc that different HTTP/1.1
// parsers frame differently. The hub (Go's net/http) answers 400 / 501 /
// 400 / 431 / 413 / 400-or-close, and for Content-Length + chunked with a
// pipelined request it executes exactly what the chunked framing defines:
// never the request a Content-Length parser would see, never one twice.
func TestS29FramingProbes(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	m.RunAgent(t, agents.NewEcho())
	var hit, smuggled, third atomic.Int64
	a := agents.New("count")
	a.Handle("count.hit", func(context.Context, json.RawMessage) (any, error) { hit.Add(1); return "hit", nil })
	a.Handle("count.other", func(context.Context, json.RawMessage) (any, error) { smuggled.Add(1); return "other", nil })
	a.Handle("count.third", func(context.Context, json.RawMessage) (any, error) { third.Add(1); return "third", nil })
	m.RunAgent(t, a)
	ping := `{"jsonrpc":"2.0","method":"mesh.ping","id":1}`
	summary := map[string]any{"scenario": "S29"}

	probe := func(name string, req func(io.Writer) error, want ...int) {
		t.Helper()
		rc, err := rawhttp.Dial(t.Context(), m.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		start := time.Now()
		status, body, closed, err := rc.ExchangeFunc(req, 10*time.Second)
		d := time.Since(start)
		got := fmt.Sprint(status)
		if err != nil {
			got = "closed without an answer"
			if closed && len(want) > 0 && want[len(want)-1] == 0 {
				got = "closed"
			}
		}
		summary[name] = map[string]any{"status": got, "ms": ms(d)}
		ok := false
		for _, w := range want {
			ok = ok || (w == status && err == nil) || (w == 0 && got == "closed")
		}
		if !ok {
			t.Errorf("%s: got %s %.200q (%v); want %v", name, got, body, err, want)
		}
		if d > 2*time.Second {
			t.Errorf("%s: answered after %v; want no hang", name, d)
		}
	}
	str := func(s string) func(io.Writer) error {
		return func(w io.Writer) error { _, err := io.WriteString(w, s); return err }
	}

	probe("conflicting Content-Length", str(fmt.Sprintf(
		"POST /rpc HTTP/1.1\r\nHost: hub\r\nContent-Length: %d\r\nContent-Length: %d\r\n\r\n%s", len(ping), len(ping)+5, ping)), 400)
	probe("Transfer-Encoding xchunked", str(fmt.Sprintf(
		"POST /rpc HTTP/1.1\r\nHost: hub\r\nTransfer-Encoding: xchunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(ping), ping)), 501)
	probe("space before colon", str(fmt.Sprintf(
		"POST /rpc HTTP/1.1\r\nHost: hub\r\nContent-Length : %d\r\n\r\n%s", len(ping), ping)), 400)
	probe("2 MiB header", str("POST /rpc HTTP/1.1\r\nHost: hub\r\nX-Big: "+strings.Repeat("b", 2<<20)+"\r\nContent-Length: 2\r\n\r\n{}"), 431)
	big := `{"jsonrpc":"2.0","method":"count.hit","params":["` + strings.Repeat("x", 2<<20) + `"],"id":1}`
	probe("body over the limit", str(fmt.Sprintf("POST /rpc HTTP/1.1\r\nHost: hub\r\nContent-Length: %d\r\n\r\n%s", len(big), big)), 413)
	var chunked bytes.Buffer
	for p := big; len(p) > 0; p = p[min(len(p), 64<<10):] {
		fmt.Fprintf(&chunked, "%x\r\n%s\r\n", min(len(p), 64<<10), p[:min(len(p), 64<<10)])
	}
	probe("chunked body over the limit", str("POST /rpc HTTP/1.1\r\nHost: hub\r\nTransfer-Encoding: chunked\r\n\r\n"+chunked.String()+"0\r\n\r\n"), 413)
	probe("chunk extension of 1 MiB", str(fmt.Sprintf(
		"POST /rpc HTTP/1.1\r\nHost: hub\r\nTransfer-Encoding: chunked\r\n\r\n%x;ext=%s\r\n%s\r\n0\r\n\r\n", len(ping), strings.Repeat("e", 1<<20), ping)), 400, 0)
	if hit.Load() != 0 {
		t.Errorf("count.hit ran %d times from refused requests; want 0", hit.Load())
	}

	// TE.CL: Content-Length 4 and chunked. Chunked framing: one request
	// whose body is the text of an HTTP request (not JSON: PARSE_ERROR),
	// then the pipelined count.hit. A Content-Length parser would instead
	// see the body "5c\r\n" and then a smuggled count.other.
	hidden := s29Call("count.other", "smuggled")
	teCL := fmt.Sprintf("POST /rpc HTTP/1.1\r\nHost: hub\r\nContent-Type: application/json\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", len(hidden), hidden) +
		s29Call("count.hit", "pipelined")
	// CL.TE: chunked framing ends the first body at once ("0\r\n\r\n"),
	// then a second request, count.third; a Content-Length parser would
	// take that request as part of the first body.
	second := s29Call("count.third", "second")
	zero := "0\r\n\r\n"
	clTE := fmt.Sprintf("POST /rpc HTTP/1.1\r\nHost: hub\r\nContent-Type: application/json\r\nContent-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n%s%s", len(zero)+len(second), zero, second)
	for _, c := range []struct{ name, raw, method string }{
		{"CL+TE (TE.CL smuggle)", teCL, "count.hit"},
		{"CL+TE (CL.TE smuggle)", clTE, "count.third"},
	} {
		hit0, third0 := hit.Load(), third.Load()
		rc, err := rawhttp.Dial(t.Context(), m.Addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(rc.Net(), c.raw); err != nil {
			t.Fatal(err)
		}
		statuses, bodies, closed := readAll(rc, time.Second)
		rc.Close()
		time.Sleep(100 * time.Millisecond) // let a wrongly smuggled call land before counting
		ran := hit.Load() - hit0
		if c.method == "count.third" {
			ran = third.Load() - third0
		}
		answered := 0
		for _, b := range bodies {
			if strings.Contains(b, `"result"`) {
				answered++
			}
		}
		summary[c.name] = map[string]any{"statuses": statuses, "closed": closed, "executed": ran, "results": answered, "smuggled_executed": smuggled.Load()}
		t.Logf("%s: statuses %v, closed %v, %s ran %d times, bodies %q", c.name, statuses, closed, c.method, ran, bodies)
		// What the chunked framing defines runs at most once, and only if
		// answered; what only a Content-Length parser would see never runs.
		if ran > 1 || ran != int64(answered) {
			t.Errorf("%s: %s ran %d times with %d results answered; want once per answer, at most once", c.name, c.method, ran, answered)
		}
		if smuggled.Load() != 0 {
			t.Errorf("%s: the request hidden from the chunked framing ran %d times", c.name, smuggled.Load())
		}
		if len(statuses) == 0 {
			t.Errorf("%s: no answer at all", c.name)
		}
	}
	testkit.PrintSummary(t, summary)
}
