package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// sseEvent is one line of js/sse_stream.mjs: an event the EventSource
// dispatched, its id (the chunk's sequence number; none on the end), the
// script's performance.now() in ms when it came, and its data.
type sseEvent struct {
	Event string          `json:"event"`
	ID    string          `json:"id"`
	T     float64         `json:"t"`
	Data  json.RawMessage `json:"data"`
}

// eventSourceClient returns the node binary and js/sse_stream.mjs, after
// checking that `npm ci --prefix e2e/js` has installed the npm package
// eventsource. Without it the test fails in CI (where .ci/run installs
// it) and is skipped elsewhere, saying what to run, as the etcd tests do.
func eventSourceClient(t *testing.T) (node, script string) {
	t.Helper()
	js, err := filepath.Abs("js") // the test runs in e2e/
	if err != nil {
		t.Fatal(err)
	}
	missing := t.Fatalf
	if os.Getenv("CI") == "" {
		missing = t.Skipf
	}
	if _, err := os.Stat(filepath.Join(js, "node_modules", "eventsource", "package.json")); err != nil {
		missing("the npm package eventsource is not installed in %s (%v): run `npm ci --prefix e2e/js` at the repository's root (CI does)", js, err)
	}
	node, err = exec.LookPath("node")
	if err != nil {
		missing("node (Node.js 20 or later) is not on PATH: %v; install it, then run `npm ci --prefix e2e/js` (CI does)", err)
	}
	return node, filepath.Join(js, "sse_stream.mjs")
}

// runEventSource runs `node sse_stream.mjs url method params` (the npm
// package eventsource's EventSource, POSTing the JSON-RPC call) within
// 60 s and returns the events it printed. It fails the test unless the
// script exits 0, which it does at the end event.
func runEventSource(t *testing.T, node, script, url, method, params string) []sseEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script, url, method, params)
	cmd.Env = env()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	started := time.Now()
	err := cmd.Run()
	took := time.Since(started)
	if ctx.Err() != nil {
		t.Fatalf("node sse_stream.mjs %s %s: killed after %v (%v); stderr:\n%s", method, params, took.Round(time.Millisecond), ctx.Err(), stderr.String())
	}
	if err != nil {
		t.Fatalf("node sse_stream.mjs %s %s: %v after %v; stderr:\n%s\nstdout (%d bytes):\n%s",
			method, params, err, took.Round(time.Millisecond), stderr.String(), stdout.Len(), tail(stdout.String(), 2000))
	}
	var events []sseEvent
	sc := bufio.NewScanner(&stdout)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e sseEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("sse_stream.mjs printed %q: %v", sc.Text(), err)
		}
		events = append(events, e)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	t.Logf("node sse_stream.mjs %s %s: exit 0 after %v, %d events", method, params, took.Round(time.Millisecond), len(events))
	return events
}

// tail is the last n bytes of s.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

// checkSSEChunks checks that events are n chunk events with ids "1".."n"
// in order, each holding {"i": its id}, then one end event without an id
// whose data is the JSON-RPC response with the result {"chunks": n}.
func checkSSEChunks(t *testing.T, events []sseEvent, n int) {
	t.Helper()
	if len(events) != n+1 {
		t.Fatalf("%d events; want %d chunks and the end", len(events), n)
	}
	for k, e := range events[:n] {
		want := strconv.Itoa(k + 1)
		var d struct {
			I *int64 `json:"i"`
		}
		if e.Event != "chunk" || e.ID != want || json.Unmarshal(e.Data, &d) != nil || d.I == nil || strconv.FormatInt(*d.I, 10) != e.ID {
			t.Fatalf("event %d: %s %q %s; want chunk %s holding {\"i\":%s}", k+1, e.Event, e.ID, e.Data, want, want)
		}
	}
	end := events[n]
	var res struct {
		JSONRPC string          `json:"jsonrpc"`
		Result  json.RawMessage `json:"result"`
		Error   json.RawMessage `json:"error"`
		ID      json.RawMessage `json:"id"`
	}
	if end.Event != "end" || end.ID != "" || json.Unmarshal(end.Data, &res) != nil || res.JSONRPC != "2.0" ||
		res.Error != nil || !jsonEq(string(res.Result), `{"chunks":`+strconv.Itoa(n)+`}`) || string(res.ID) != "1" {
		t.Fatalf("last event: %s %q %s; want end holding {\"jsonrpc\":\"2.0\",\"result\":{\"chunks\":%d},\"id\":1}", end.Event, end.ID, end.Data, n)
	}
}

// TestStreamSSEEventSource: a real SSE client, the npm package eventsource
// under Node.js (e2e/js/sse_stream.mjs), reads echo.stream from meshd's
// POST /rpc as Server-Sent Events: 1,000 chunk events whose ids are the
// sequence numbers 1..1000 in order, then the end event with the
// JSON-RPC response; the script closes the EventSource there, so it does
// not reconnect (which would POST the call again). A slower stream's
// chunks reach the client as they are sent, not all at the end.
// Needs `npm ci --prefix e2e/js` (.ci/run does it); without it the test
// fails.
func TestStreamSSEEventSource(t *testing.T) {
	t.Parallel()
	node, script := eventSourceClient(t)
	h := startHub(t)
	start(t, "meshctl", "agent", "run", "echo", "--hub", h.ws)
	waitMethods(t, h.ws, "echo.stream")
	url := h.base + "/rpc"

	t.Run("1000 chunks", func(t *testing.T) {
		events := runEventSource(t, node, script, url, "echo.stream", `{"n":1000,"size":64}`)
		checkSSEChunks(t, events, 1000)
		t.Logf("1000 chunks of 64 bytes and the end over %.1f ms (first chunk to end, in the client)", events[1000].T-events[0].T)
	})
	t.Run("chunks arrive as sent", func(t *testing.T) {
		// 100 ms apart: held back until the end, the chunks would come
		// together; streamed, the last comes about 400 ms after the first.
		// The bound is half that: a loaded CI machine delayed one chunk
		// of a 20 ms cadence by a whole interval (gaps 0.7, 16.5, 20.4,
		// 19.4 ms against a bound of 60 ms in all).
		events := runEventSource(t, node, script, url, "echo.stream", `{"n":5,"intervalMs":100}`)
		checkSSEChunks(t, events, 5)
		var gaps []string
		for k := 1; k < 5; k++ {
			gaps = append(gaps, strconv.FormatFloat(events[k].T-events[k-1].T, 'f', 1, 64))
		}
		spread := events[4].T - events[0].T
		t.Logf("5 chunks 100 ms apart: the last came %.1f ms after the first (gaps %s ms)", spread, strings.Join(gaps, ", "))
		if spread < 200 {
			t.Errorf("the last of 5 chunks sent 100 ms apart came %.1f ms after the first; want at least 200 ms (the events were held back, not streamed)", spread)
		}
	})
}
