package hub_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
)

type rpcErr struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    struct {
		Code   string `json:"code"`
		Detail string `json:"detail"`
	} `json:"data"`
}

type rpcReply struct {
	ID     json.RawMessage `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *rpcErr         `json:"error"`
}

func postRPC(t *testing.T, url string, body []byte) (int, []byte) {
	t.Helper()
	res, err := http.Post(url+"/rpc", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("POST /rpc: %v", err)
	}
	defer res.Body.Close()
	out, _ := io.ReadAll(res.Body)
	return res.StatusCode, out
}

// keepCalling calls echo.echo in a loop until stop; it counts failures, so
// that a test can check that bad input harmed no other caller.
func keepCalling(t *testing.T, c *mesh.Client) (stop func() (ok, failed int64)) {
	var okN, failN atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for ctx.Err() == nil {
			var got string
			if err := c.Call(ctx, "echo.echo", "still here", &got); err != nil || got != "still here" {
				if ctx.Err() == nil {
					failN.Add(1)
					t.Errorf("bystander call failed: %v (got %q)", err, got)
				}
				continue
			}
			okN.Add(1)
		}
	})
	return func() (int64, int64) { cancel(); wg.Wait(); return okN.Load(), failN.Load() }
}

func badInputs() []struct {
	name string
	body string
	code envelope.Code
} {
	deep := strings.Repeat("[", 100) + strings.Repeat("]", 100)
	return []struct {
		name string
		body string
		code envelope.Code
	}{
		{"not JSON", `{"jsonrpc": "2.0", "method": "echo.echo", "id": 1`, envelope.CodeParseError},
		{"plain text", `hello`, envelope.CodeParseError},
		{"wrong jsonrpc version", `{"jsonrpc":"1.0","method":"mesh.ping","id":1}`, envelope.CodeInvalidRequest},
		{"missing jsonrpc", `{"method":"mesh.ping","id":1}`, envelope.CodeInvalidRequest},
		{"method not a string", `{"jsonrpc":"2.0","method":1,"id":1}`, envelope.CodeInvalidRequest},
		{"params a string", `{"jsonrpc":"2.0","method":"echo.echo","params":"x","id":1}`, envelope.CodeInvalidRequest},
		{"nesting past the limit", `{"jsonrpc":"2.0","method":"echo.echo","params":` + deep + `,"id":1}`, envelope.CodeInvalidRequest},
		{"duplicate keys", `{"jsonrpc":"2.0","method":"echo.echo","method":"mesh.ping","id":1}`, envelope.CodeInvalidRequest},
		{"unknown method", `{"jsonrpc":"2.0","method":"no.such","id":1}`, envelope.CodeMethodNotFound},
		{"mesh.agents with array params", `{"jsonrpc":"2.0","method":"mesh.agents","params":[1],"id":1}`, envelope.CodeInvalidParams},
		{"mesh.agents with unknown field", `{"jsonrpc":"2.0","method":"mesh.agents","params":{"x":1},"id":1}`, envelope.CodeInvalidParams},
		{"heartbeat with numeric agentId", `{"jsonrpc":"2.0","method":"agent.heartbeat","params":{"agentId":5},"id":1}`, envelope.CodeInvalidParams},
		{"register with string capabilities", `{"jsonrpc":"2.0","method":"agent.register","params":{"capabilities":"x.y"},"id":1}`, envelope.CodeInvalidParams},
		{"register over HTTP", `{"jsonrpc":"2.0","method":"agent.register","params":{"capabilities":["x.y"]},"id":1}`, envelope.CodeInvalidRequest},
		{"heartbeat for another agent", `{"jsonrpc":"2.0","method":"agent.heartbeat","params":{"agentId":"someone"},"id":1}`, envelope.CodeAgentNotFound},
		{"bad ttl", `{"jsonrpc":"2.0","method":"echo.echo","meta":{"ttl":-5},"id":1}`, envelope.CodeInvalidRequest},
		{"huge number as ttl", `{"jsonrpc":"2.0","method":"echo.echo","meta":{"ttl":1e400},"id":1}`, envelope.CodeInvalidRequest},
		{"huge integer as retryCount", `{"jsonrpc":"2.0","method":"echo.echo","meta":{"retryCount":123456789012345678901234567890},"id":1}`, envelope.CodeInvalidRequest},
		{"10,000-deep array", `{"jsonrpc":"2.0","method":"echo.echo","params":` + strings.Repeat("[", 10000) + strings.Repeat("]", 10000) + `,"id":1}`, envelope.CodeInvalidRequest},
		{"echo.sleep with a string", `{"jsonrpc":"2.0","method":"echo.sleep","params":{"ms":"soon"},"id":1}`, envelope.CodeInvalidParams},
	}
}

func checkCoded(t *testing.T, raw []byte, want envelope.Code) {
	t.Helper()
	var r rpcReply
	if err := json.Unmarshal(raw, &r); err != nil {
		t.Fatalf("reply %s is not a JSON-RPC object: %v", raw, err)
	}
	if r.Error == nil {
		t.Fatalf("reply %s has no error; want %s", raw, want)
	}
	if r.Error.Code != want.JSONRPC() || r.Error.Data.Code != want.String() || r.Error.Message == "" {
		t.Errorf("error = %+v; want code %d (%s) with a message", *r.Error, want.JSONRPC(), want)
	}
}

func TestBadInputOverHTTP(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	m.RunAgent(t, agents.NewEcho())
	stop := keepCalling(t, m.Client(t))
	for _, tc := range badInputs() {
		t.Run(tc.name, func(t *testing.T) {
			status, out := postRPC(t, m.HTTP, []byte(tc.body))
			if status != http.StatusOK {
				t.Errorf("HTTP status %d; want 200 (JSON-RPC errors travel in the body)", status)
			}
			checkCoded(t, out, tc.code)
		})
	}
	t.Run("oversized body", func(t *testing.T) {
		body := `{"jsonrpc":"2.0","method":"echo.echo","id":1,"params":["` + strings.Repeat("x", 2<<20) + `"]}`
		status, out := postRPC(t, m.HTTP, []byte(body))
		if status != http.StatusRequestEntityTooLarge {
			t.Errorf("HTTP status %d; want 413", status)
		}
		checkCoded(t, out, envelope.CodeInvalidRequest)
	})
	t.Run("100 MB body", func(t *testing.T) {
		// Streamed, never held: the hub answers 413 from the declared
		// length without reading it.
		pr, pw := io.Pipe()
		go func() {
			chunk := bytes.Repeat([]byte("x"), 1<<20)
			for range 100 {
				if _, err := pw.Write(chunk); err != nil {
					return
				}
			}
			pw.Close()
		}()
		req, _ := http.NewRequest(http.MethodPost, m.HTTP+"/rpc", pr)
		req.ContentLength = 100 << 20
		start := time.Now()
		res, err := http.DefaultClient.Do(req)
		pr.CloseWithError(io.ErrClosedPipe)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusRequestEntityTooLarge {
			t.Errorf("HTTP status %d; want 413", res.StatusCode)
		}
		checkCoded(t, out, envelope.CodeInvalidRequest)
		t.Logf("100 MB body refused in %v", time.Since(start).Round(time.Millisecond))
	})
	t.Run("GET", func(t *testing.T) {
		res, err := http.Get(m.HTTP + "/rpc")
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("HTTP status %d; want 405", res.StatusCode)
		}
		checkCoded(t, out, envelope.CodeInvalidRequest)
	})
	if ok, failed := stop(); ok == 0 || failed != 0 {
		t.Errorf("bystander: %d ok, %d failed; want it served throughout", ok, failed)
	}
}

func dialPlain(t *testing.T, m *meshtest.Mesh) *websocket.Conn {
	t.Helper()
	ws, _, err := websocket.DefaultDialer.DialContext(t.Context(), m.WS, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.Close() })
	return ws
}

func readReply(t *testing.T, ws *websocket.Conn) []byte {
	t.Helper()
	_ = ws.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, data, err := ws.ReadMessage()
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return data
}

func TestBadInputOverWebSocket(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	m.RunAgent(t, agents.NewEcho())
	stop := keepCalling(t, m.Client(t))
	ws := dialPlain(t, m)
	for _, tc := range badInputs() {
		if tc.name == "register over HTTP" {
			continue // a plain JSON-RPC socket may not register either; covered below
		}
		t.Run(tc.name, func(t *testing.T) {
			if err := ws.WriteMessage(websocket.TextMessage, []byte(tc.body)); err != nil {
				t.Fatal(err)
			}
			checkCoded(t, readReply(t, ws), tc.code)
		})
	}
	t.Run("over the size limit", func(t *testing.T) {
		body := `{"jsonrpc":"2.0","method":"echo.echo","id":1,"params":["` + strings.Repeat("x", 1<<20) + `"]}`
		if err := ws.WriteMessage(websocket.TextMessage, []byte(body)); err != nil {
			t.Fatal(err)
		}
		checkCoded(t, readReply(t, ws), envelope.CodeInvalidRequest)
	})
	// The same socket still works after all that.
	if err := ws.WriteMessage(websocket.TextMessage, []byte(`{"jsonrpc":"2.0","method":"echo.echo","params":["ok"],"id":"last"}`)); err != nil {
		t.Fatal(err)
	}
	if got := string(readReply(t, ws)); got != `{"jsonrpc":"2.0","result":["ok"],"id":"last"}` {
		t.Errorf("reply after bad input = %s", got)
	}
	t.Run("far over the size limit closes with 1009", func(t *testing.T) {
		ws2 := dialPlain(t, m)
		big := bytes.Repeat([]byte("x"), 8<<20)
		_ = ws2.WriteMessage(websocket.TextMessage, big)
		_ = ws2.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, _, err := ws2.ReadMessage()
		if !websocket.IsCloseError(err, websocket.CloseMessageTooBig) {
			t.Errorf("read after an 8 MiB message: %v; want close 1009 (message too big)", err)
		}
	})
	if ok, failed := stop(); ok == 0 || failed != 0 {
		t.Errorf("bystander: %d ok, %d failed; want it served throughout", ok, failed)
	}
}

func TestPlainJSONRPCWebSocket(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	m.RunAgent(t, agents.NewEcho())
	ws := dialPlain(t, m)
	send := func(s string) {
		if err := ws.WriteMessage(websocket.TextMessage, []byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	// A notification gets no answer; the request after it does.
	send(`{"jsonrpc":"2.0","method":"echo.echo","params":[1]}`)
	send(`{"jsonrpc":"2.0","method":"echo.echo","params":{"a":1},"id":12345678901234567890123,"meta":{"ttl":2000,"priority":"high"}}`)
	if got := string(readReply(t, ws)); got != `{"jsonrpc":"2.0","result":{"a":1},"id":12345678901234567890123}` {
		t.Errorf("reply = %s; want the result with the id byte-exact", got)
	}
	send(`[{"jsonrpc":"2.0","method":"echo.echo","params":[1],"id":1},{"jsonrpc":"2.0","method":"echo.echo","params":[2]},{"jsonrpc":"2.0","method":"no.pe","id":3}]`)
	var batch []rpcReply
	if err := json.Unmarshal(readReply(t, ws), &batch); err != nil {
		t.Fatal(err)
	}
	sort.Slice(batch, func(i, j int) bool { return string(batch[i].ID) < string(batch[j].ID) })
	if len(batch) != 2 || string(batch[0].Result) != "[1]" || batch[1].Error == nil || batch[1].Error.Code != -32601 {
		t.Errorf("batch reply = %+v; want a result for id 1 and METHOD_NOT_FOUND for id 3", batch)
	}
}

// TestSpecExamplesThroughHub replays the JSON-RPC 2.0 specification's
// examples against the hub, with an agent serving the example methods.
func TestSpecExamplesThroughHub(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	a := agents.New("spec")
	a.Handle("subtract", func(ctx context.Context, p json.RawMessage) (any, error) {
		var pos []float64
		if json.Unmarshal(p, &pos) == nil && len(pos) == 2 {
			return pos[0] - pos[1], nil
		}
		var named struct{ Minuend, Subtrahend float64 }
		if err := json.Unmarshal(p, &named); err != nil {
			return nil, envelope.NewError(envelope.CodeInvalidParams, "subtract takes two numbers")
		}
		return named.Minuend - named.Subtrahend, nil
	})
	a.Handle("sum", func(ctx context.Context, p json.RawMessage) (any, error) {
		var xs []float64
		_ = json.Unmarshal(p, &xs)
		s := 0.0
		for _, x := range xs {
			s += x
		}
		return s, nil
	})
	a.Handle("get_data", func(ctx context.Context, p json.RawMessage) (any, error) { return []any{"hello", 5}, nil })
	for _, n := range []string{"update", "notify_hello", "notify_sum"} {
		a.Handle(n, func(ctx context.Context, p json.RawMessage) (any, error) { return nil, nil })
	}
	m.RunAgent(t, a)

	cases := []struct{ name, in, want string }{
		{"positional 1", `{"jsonrpc": "2.0", "method": "subtract", "params": [42, 23], "id": 1}`, `{"jsonrpc": "2.0", "result": 19, "id": 1}`},
		{"positional 2", `{"jsonrpc": "2.0", "method": "subtract", "params": [23, 42], "id": 2}`, `{"jsonrpc": "2.0", "result": -19, "id": 2}`},
		{"named 1", `{"jsonrpc": "2.0", "method": "subtract", "params": {"subtrahend": 23, "minuend": 42}, "id": 3}`, `{"jsonrpc": "2.0", "result": 19, "id": 3}`},
		{"named 2", `{"jsonrpc": "2.0", "method": "subtract", "params": {"minuend": 42, "subtrahend": 23}, "id": 4}`, `{"jsonrpc": "2.0", "result": 19, "id": 4}`},
		{"notification", `{"jsonrpc": "2.0", "method": "update", "params": [1,2,3,4,5]}`, ``},
		{"notification unknown", `{"jsonrpc": "2.0", "method": "foobar"}`, ``},
		{"non-existent method", `{"jsonrpc": "2.0", "method": "foobar", "id": "1"}`, `{"jsonrpc": "2.0", "error": {"code": -32601, "message": "Method not found"}, "id": "1"}`},
		{"invalid JSON", `{"jsonrpc": "2.0", "method": "foobar, "params": "bar", "baz]`, `{"jsonrpc": "2.0", "error": {"code": -32700, "message": "Parse error"}, "id": null}`},
		{"invalid request object", `{"jsonrpc": "2.0", "method": 1, "params": "bar"}`, `{"jsonrpc": "2.0", "error": {"code": -32600, "message": "Invalid Request"}, "id": null}`},
		{"batch invalid JSON", `[{"jsonrpc": "2.0", "method": "sum", "params": [1,2,4], "id": "1"},{"jsonrpc": "2.0", "method"]`, `{"jsonrpc": "2.0", "error": {"code": -32700, "message": "Parse error"}, "id": null}`},
		{"empty array", `[]`, `{"jsonrpc": "2.0", "error": {"code": -32600, "message": "Invalid Request"}, "id": null}`},
		{"invalid batch of one", `[1]`, `[{"jsonrpc": "2.0", "error": {"code": -32600, "message": "Invalid Request"}, "id": null}]`},
		{"invalid batch", `[1,2,3]`, `[{"jsonrpc": "2.0", "error": {"code": -32600, "message": "Invalid Request"}, "id": null},{"jsonrpc": "2.0", "error": {"code": -32600, "message": "Invalid Request"}, "id": null},{"jsonrpc": "2.0", "error": {"code": -32600, "message": "Invalid Request"}, "id": null}]`},
		{"mixed batch", `[
			{"jsonrpc": "2.0", "method": "sum", "params": [1,2,4], "id": "1"},
			{"jsonrpc": "2.0", "method": "notify_hello", "params": [7]},
			{"jsonrpc": "2.0", "method": "subtract", "params": [42,23], "id": "2"},
			{"foo": "boo"},
			{"jsonrpc": "2.0", "method": "foo.get", "params": {"name": "myself"}, "id": "5"},
			{"jsonrpc": "2.0", "method": "get_data", "id": "9"}]`, `[
			{"jsonrpc": "2.0", "result": 7, "id": "1"},
			{"jsonrpc": "2.0", "result": 19, "id": "2"},
			{"jsonrpc": "2.0", "error": {"code": -32600, "message": "Invalid Request"}, "id": null},
			{"jsonrpc": "2.0", "error": {"code": -32601, "message": "Method not found"}, "id": "5"},
			{"jsonrpc": "2.0", "result": ["hello", 5], "id": "9"}]`},
		{"all notifications", `[{"jsonrpc": "2.0", "method": "notify_sum", "params": [1,2,4]},{"jsonrpc": "2.0", "method": "notify_hello", "params": [7]}]`, ``},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, out := postRPC(t, m.HTTP, []byte(tc.in))
			if tc.want == "" {
				if status != http.StatusNoContent || len(out) != 0 {
					t.Errorf("got HTTP %d %q; want 204 and no body for notifications", status, out)
				}
				return
			}
			if got, want := normalise(t, out), normalise(t, []byte(tc.want)); !reflect.DeepEqual(got, want) {
				t.Errorf("reply = %s\nwant  %s", out, tc.want)
			}
		})
	}
}

// normalise decodes a reply, drops error.data (the mesh's extra detail)
// and sorts batches, so that replies compare as the specification means.
func normalise(t *testing.T, b []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("bad JSON %s: %v", b, err)
	}
	strip := func(x any) any {
		if m, ok := x.(map[string]any); ok {
			if e, ok := m["error"].(map[string]any); ok {
				delete(e, "data")
			}
		}
		return x
	}
	if arr, ok := v.([]any); ok {
		for i := range arr {
			arr[i] = strip(arr[i])
		}
		sort.Slice(arr, func(i, j int) bool {
			a, _ := json.Marshal(arr[i])
			b, _ := json.Marshal(arr[j])
			return string(a) < string(b)
		})
		return arr
	}
	return strip(v)
}
