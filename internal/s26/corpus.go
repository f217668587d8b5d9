// Package s26 is the hostile input corpus and the load of RELIABILITY.md's
// S26 (hostile JSON and frames), shared by the scenario test
// (mesh/s26_test.go, scenario build tag) and the diagnostic command
// s26diag (./internal/s26/cmd/s26diag), which runs the same phases with
// knobs and per-phase machine accounting. It drives a hub only through
// its sockets and exported APIs.
//
// The pieces: Corpus (the inputs and what each must get back), Once (each
// input once on each transport), Attack (10 attacker connections at ~100
// messages/s each), Schedule (1 s loaded windows between quiet ones, on
// a clock both processes read), RunAttackers and AttackerMain (the
// attack from a separate process under SCHED_IDLE), LegitLoad (the
// legitimate calls) and NewCounter (the agent whose calls show what a
// hostile message executed).
package s26

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"

	"github.com/agentmesh/agentmesh/envelope"
)

// expect is what an input must get back.
type expect int

const (
	expCoded  expect = iota // a JSON-RPC error PARSE_ERROR or INVALID_REQUEST (HTTP 200)
	expTooBig               // HTTP 413 (INVALID_REQUEST body) / WebSocket close 1009
	expHeader               // HTTP 431 (the request line and headers are over MaxHeaderBytes)
	expID                   // a result whose id is byte-identical to wantIDs[0]
	expIDs                  // a batch reply whose ids are exactly wantIDs
	expRouted               // a result (count.hit ran once; count.other never)
)

// payload is a message the sender can send without holding it: the
// megabyte inputs are streamed from one small block, so that the
// sender's own heap (the test's, when it sends in process) does not
// inflate the hub's heap figures (nor the GC's goal).
type payload struct {
	size  int
	small []byte // the whole message, when it is small
	write func(io.Writer) error
}

func fixed(b []byte) payload {
	return payload{size: len(b), small: b, write: func(w io.Writer) error { _, err := w.Write(b); return err }}
}

// repeated is prefix, then unit count times, then suffix.
func repeated(prefix, unit string, count int, suffix string) payload {
	per := max(1, (64<<10)/len(unit))
	block := []byte(strings.Repeat(unit, per))
	return payload{size: len(prefix) + len(unit)*count + len(suffix), write: func(w io.Writer) error {
		if _, err := io.WriteString(w, prefix); err != nil {
			return err
		}
		for n := count; n > 0; n -= per {
			if _, err := w.Write(block[:min(n, per)*len(unit)]); err != nil {
				return err
			}
		}
		_, err := io.WriteString(w, suffix)
		return err
	}}
}

// Item is one input of the corpus.
type Item struct {
	Name    string
	body    payload // the JSON-RPC message (HTTP body, WebSocket message)
	chunked bool    // HTTP: chunked transfer coding; WebSocket: continuation frames
	header  bool    // the hostile part is a 16 MiB header
	expect  expect
	wantIDs []string
	native  *payload // the native frame (seq 7), if the item applies to a native link
	natExp  expect
}

// Native reports whether the item also goes over a native (agentmesh.v1)
// link.
func (it *Item) Native() bool { return it.native != nil }

// ReadLimit is the hub's default message limit
// (envelope.DefaultLimits().MaxBytes), which the oversized inputs exceed.
const ReadLimit = 1 << 20

// chunkWriter writes each Write as one HTTP/1.1 chunk.
type chunkWriter struct{ w io.Writer }

func (c chunkWriter) Write(p []byte) (int, error) {
	if _, err := fmt.Fprintf(c.w, "%x\r\n", len(p)); err != nil {
		return 0, err
	}
	if _, err := c.w.Write(p); err != nil {
		return 0, err
	}
	_, err := io.WriteString(c.w, "\r\n")
	return len(p), err
}

// httpRequest writes the raw POST /rpc (or, for header items, an upgrade
// to /ws when ws is set) for the item.
func (it *Item) httpRequest(ws bool) func(io.Writer) error {
	if it.header {
		chunk := bytes.Repeat([]byte("a"), 64<<10)
		head, tail := "POST /rpc HTTP/1.1\r\nHost: hub\r\nX-Big: ", "\r\nContent-Length: 2\r\n\r\n{}"
		if ws {
			head, tail = "GET /ws HTTP/1.1\r\nHost: hub\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nX-Big: ", "\r\n\r\n"
		}
		return func(w io.Writer) error { // a 16 MiB header value
			if _, err := io.WriteString(w, head); err != nil {
				return err
			}
			for range (16 << 20) / len(chunk) {
				if _, err := w.Write(chunk); err != nil {
					return err
				}
			}
			_, err := io.WriteString(w, tail)
			return err
		}
	}
	return func(w io.Writer) error {
		h := "POST /rpc HTTP/1.1\r\nHost: hub\r\nContent-Type: application/json\r\n"
		if !it.chunked {
			if it.body.small != nil { // one writev, no copy of the body
				bufs := net.Buffers{fmt.Appendf([]byte(h), "Content-Length: %d\r\n\r\n", it.body.size), it.body.small}
				_, err := bufs.WriteTo(w)
				return err
			}
			if _, err := fmt.Fprintf(w, "%sContent-Length: %d\r\n\r\n", h, it.body.size); err != nil {
				return err
			}
			return it.body.write(w)
		}
		if _, err := io.WriteString(w, h+"Transfer-Encoding: chunked\r\n\r\n"); err != nil {
			return err
		}
		if err := it.body.write(chunkWriter{w}); err != nil {
			return err
		}
		_, err := io.WriteString(w, "0\r\n\r\n")
		return err
	}
}

// Corpus builds the scenario's hostile inputs. They call count.hit and
// count.other (NewCounter) or echo.echo (agents.NewEcho).
func Corpus() []*Item {
	nest := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	req := func(params, id string) payload {
		return fixed([]byte(`{"jsonrpc":"2.0","method":"count.hit","params":` + params + `,"id":` + id + `}`))
	}
	frame := func(rest string) *payload {
		p := fixed([]byte(`{"type":"req","seq":7,"id":"n1",` + rest + `,"headers":{},"version":"1.0"}`))
		return &p
	}
	big := func(n int) payload { // a valid request of n bytes
		pre, post := `{"jsonrpc":"2.0","method":"count.hit","params":["`, `"],"id":1}`
		return repeated(pre, "x", n-len(pre)-len(post), post)
	}
	bigFrame := func(n int) *payload {
		pre, post := `{"type":"req","seq":7,"id":"n1","method":"count.hit","params":["`, `"],"headers":{},"version":"1.0"}`
		p := repeated(pre, "x", n-len(pre)-len(post), post)
		return &p
	}
	var overMax bytes.Buffer // a batch one past the limit, of calls that would count
	overMax.WriteByte('[')
	for i := range envelope.DefaultMaxBatch + 1 {
		if i > 0 {
			overMax.WriteByte(',')
		}
		fmt.Fprintf(&overMax, `{"jsonrpc":"2.0","method":"count.hit","id":%d}`, i)
	}
	overMax.WriteByte(']')
	call := `{"jsonrpc":"2.0","method":"count.hit","id":1}`
	return []*Item{
		{Name: "nesting 10001", body: req(nest(10_001), "1"), expect: expCoded,
			native: frame(`"method":"count.hit","params":` + nest(10_001)), natExp: expCoded},
		{Name: "nesting 100000", body: req(nest(100_000), "1"), expect: expCoded},
		{Name: "2M numbers (4 MB)", body: repeated(`{"jsonrpc":"2.0","method":"count.hit","id":1,"params":[0`, ",7", 2_000_000-1, "]}"), expect: expTooBig},
		{Name: "id 1e400", body: fixed([]byte(`{"jsonrpc":"2.0","method":"echo.echo","params":[1],"id":1e400}`)), expect: expID, wantIDs: []string{"1e400"}},
		{Name: "id 2^53+1", body: fixed([]byte(`{"jsonrpc":"2.0","method":"echo.echo","params":[1],"id":9007199254740993}`)), expect: expID, wantIDs: []string{"9007199254740993"}},
		{Name: "ids 2^53+1 and 2^53 in one batch", body: fixed([]byte(`[{"jsonrpc":"2.0","method":"echo.echo","id":9007199254740993},{"jsonrpc":"2.0","method":"echo.echo","id":9007199254740992}]`)),
			expect: expIDs, wantIDs: []string{"9007199254740992", "9007199254740993"}},
		{Name: "duplicate method", body: fixed([]byte(`{"jsonrpc":"2.0","method":"count.hit","method":"count.other","id":1}`)), expect: expCoded,
			native: frame(`"method":"count.hit","method":"count.other"`), natExp: expCoded},
		{Name: "METHOD key only", body: fixed([]byte(`{"jsonrpc":"2.0","METHOD":"count.hit","id":1}`)), expect: expCoded,
			native: frame(`"METHOD":"count.hit"`), natExp: expCoded},
		{Name: "method and METHOD", body: fixed([]byte(`{"jsonrpc":"2.0","method":"count.hit","METHOD":"count.other","id":1}`)), expect: expRouted,
			native: frame(`"method":"count.hit","METHOD":"count.other"`), natExp: expRouted},
		{Name: "invalid UTF-8 in params", body: req(`["\xff\xfe\xc0\xaf"]`, "1"), expect: expCoded,
			native: frame(`"method":"count.hit","params":["\xff\xfe"]`), natExp: expCoded},
		{Name: "invalid UTF-8 in method", body: fixed([]byte("{\"jsonrpc\":\"2.0\",\"method\":\"count.hit\xed\xa0\x80\",\"id\":1}")), expect: expCoded},
		{Name: "invalid UTF-8 in a key", body: fixed([]byte("{\"jsonrpc\":\"2.0\",\"method\":\"count.hit\",\"\xffid\":1,\"id\":1}")), expect: expCoded},
		{Name: "frame 2x the limit", body: big(2 * ReadLimit), expect: expTooBig,
			native: bigFrame(2 * ReadLimit), natExp: expTooBig},
		{Name: "fragments past the limit", body: big(ReadLimit + 256<<10), chunked: true, expect: expTooBig,
			native: bigFrame(ReadLimit + 256<<10), natExp: expTooBig},
		{Name: "batch over the maximum", body: fixed(overMax.Bytes()), expect: expCoded},
		{Name: "batch of 100000 empty objects", body: fixed([]byte("[" + strings.Repeat("{},", 99_999) + "{}]")), expect: expCoded},
		{Name: "batch of 100000 requests (4.5 MB)", body: repeated("["+call, ","+call, 99_999, "]"), expect: expTooBig},
		{Name: "16 MiB header", header: true, expect: expHeader},
	}
}

// Benign is the control's corpus: a well-formed call of the legitimate
// load's method (echo.echo), on each transport.
func Benign() []*Item {
	native := fixed([]byte(`{"type":"req","seq":7,"id":"n1","method":"echo.echo","params":[1],"headers":{},"version":"1.0"}`))
	return []*Item{{Name: "well-formed call", body: fixed([]byte(`{"jsonrpc":"2.0","method":"echo.echo","params":[1],"id":1}`)),
		expect: expID, wantIDs: []string{"1"}, native: &native, natExp: expRouted}}
}

// rpcReply is a JSON-RPC response object.
type rpcReply struct {
	ID     json.RawMessage `json:"id"`
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// checkReply checks a JSON-RPC reply against the item's expectation.
func (it *Item) checkReply(reply []byte) error {
	switch it.expect {
	case expCoded, expTooBig:
		var r rpcReply
		if err := json.Unmarshal(reply, &r); err != nil {
			return fmt.Errorf("reply %.200q is not a JSON-RPC object: %v", reply, err)
		}
		if r.Error == nil {
			return fmt.Errorf("reply %.200q is not an error", reply)
		}
		if c := r.Error.Code; c != envelope.CodeParseError.JSONRPC() && c != envelope.CodeInvalidRequest.JSONRPC() {
			return fmt.Errorf("error %+v; want PARSE_ERROR or INVALID_REQUEST", *r.Error)
		}
	case expID, expRouted:
		var r rpcReply
		if err := json.Unmarshal(reply, &r); err != nil || r.Error != nil || r.Result == nil {
			return fmt.Errorf("reply %.200q; want a result (%v)", reply, err)
		}
		if it.expect == expID && string(r.ID) != it.wantIDs[0] {
			return fmt.Errorf("id came back as %s; sent %s", r.ID, it.wantIDs[0])
		}
	case expIDs:
		var rs []rpcReply
		if err := json.Unmarshal(reply, &rs); err != nil {
			return fmt.Errorf("reply %.200q is not a batch reply: %v", reply, err)
		}
		var ids []string
		for _, r := range rs {
			if r.Error != nil {
				return fmt.Errorf("batch element failed: %+v", *r.Error)
			}
			ids = append(ids, string(r.ID))
		}
		slices.Sort(ids)
		if !slices.Equal(ids, it.wantIDs) {
			return fmt.Errorf("ids came back as %v; sent %v", ids, it.wantIDs)
		}
	default:
		return fmt.Errorf("a reply %.200q where none was expected", reply)
	}
	return nil
}

// checkNative checks a native reply (to seq 7) against expect.
func checkNative(reply []byte, expect expect) error {
	var f struct {
		Type   string
		Seq    uint64
		Result json.RawMessage
		Error  *struct{ Code string }
	}
	if err := json.Unmarshal(reply, &f); err != nil || f.Type != "res" || f.Seq != 7 {
		return fmt.Errorf("native reply %.200q; want a response to seq 7", reply)
	}
	switch expect {
	case expCoded:
		if f.Error == nil || (f.Error.Code != envelope.CodeParseError.String() && f.Error.Code != envelope.CodeInvalidRequest.String()) {
			return fmt.Errorf("native reply %.200q; want PARSE_ERROR or INVALID_REQUEST", reply)
		}
	case expRouted:
		if f.Error != nil {
			return fmt.Errorf("native reply %.200q; want a result", reply)
		}
	}
	return nil
}
