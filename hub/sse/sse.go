// Package sse answers one JSON-RPC call as Server-Sent Events: the hub's
// POST /rpc with Accept: text/event-stream (README, "Streams").
package sse

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/stream"
)

// Accepts reports a request that asks for an event stream.
func Accepts(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "text/event-stream")
}

// Serve answers c on w as Server-Sent Events: a streaming method's
// (streaming) chunks, each an event "chunk" whose id is its sequence
// number and whose data is the chunk, then one event "end" whose data is
// the call's JSON-RPC response (its result, or its error with the last
// sequence number in data.details.lastSeq). A method that does not
// stream answers with the end alone. invoke runs the call (the hub's
// ingress); each write waits at most writeTimeout. A slow reader holds
// the stream back (each write waits for the client), and a client that
// goes away cancels it.
func Serve(w http.ResponseWriter, ctx context.Context, c *envelope.RPCCall, streaming bool, invoke envelope.Invoker, writeTimeout time.Duration) {
	hdr := w.Header()
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("X-Accel-Buffering", "no") // a proxy in front must not hold the events back
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	var buf []byte
	event := func(name string, id uint64, data []byte) error {
		buf = append(buf[:0], "event: "...)
		buf = append(buf, name...)
		if id > 0 {
			buf = append(buf, "\nid: "...)
			buf = strconv.AppendUint(buf, id, 10)
		}
		buf = append(buf, "\ndata: "...)
		buf = append(buf, data...) // one line: compactLine
		buf = append(buf, "\n\n"...)
		_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
		if _, err := w.Write(buf); err != nil {
			return envelope.NewError(envelope.CodeCancelled, "the event stream's client is gone")
		}
		return rc.Flush()
	}
	var res *envelope.Response
	var err error
	if c.Err != nil {
		err = c.Err
	} else {
		req := &c.Request
		if req.Timestamp == 0 {
			req.Timestamp = time.Now().UnixMilli()
		}
		if streaming {
			res, err = stream.Relay(ctx, invoke, req, stream.RelayWindow, func(n uint64, data json.RawMessage) error {
				return event("chunk", n, compactLine(data))
			})
		} else {
			res, err = invoke(ctx, req)
		}
	}
	var end []byte
	if err != nil {
		end = envelope.AppendJSONRPCError(nil, c.ID, envelope.AsError(err))
	} else {
		end = envelope.AppendJSONRPCResult(nil, c.ID, res.Result)
	}
	_ = event("end", 0, compactLine(end))
}

// compactLine returns data on one line: an agent's chunk is raw JSON as
// it sent it, which may hold newlines between tokens (never inside a
// string), and a data line ends at a newline.
func compactLine(data []byte) []byte {
	if !bytes.ContainsAny(data, "\r\n") {
		return data
	}
	return bytes.Map(func(r rune) rune {
		if r == '\n' || r == '\r' {
			return -1
		}
		return r
	}, data)
}
