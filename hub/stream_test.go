package hub_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/registry/etcd"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
	"github.com/agentmesh/agentmesh/reliability"
	"github.com/agentmesh/agentmesh/stream"
	"github.com/agentmesh/agentmesh/telemetry"
	"github.com/gorilla/websocket"
	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/trace"
)

// TestStreamAcrossPeerHop: a stream from a client on hub B to an agent on
// hub A crosses the peer link: 5,000 chunks in order with a window of 8
// (credit relayed back through both hubs), the end intact; a cancel
// crosses it too, and stops the agent's handler.
func TestStreamAcrossPeerHop(t *testing.T) {
	srv := etcdtest.Start(t)
	newReg := func() *etcd.Registry {
		reg, err := etcd.New(etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: "/stream-hop/"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return reg
	}
	a := meshtest.StartCluster(t, hub.Config{ID: "hub-A"}, newReg())
	b := meshtest.StartCluster(t, hub.Config{ID: "hub-B"}, newReg())
	echo := agents.NewEcho(agents.WithID("echo-on-a"))
	stopped := make(chan error, 1)
	echo.HandleStream("hop.forever", func(ctx context.Context, _ json.RawMessage, s *agents.Stream) error {
		for i := 0; ; i++ {
			if err := s.Send(ctx, i); err != nil {
				stopped <- err
				return err
			}
		}
	})
	a.RunAgent(t, echo)
	meshtest.WaitFor(t, 5*time.Second, func() bool { return b.Hub.Registry().Snapshot().Instance("echo-on-a") != nil })

	c := b.Client(t)
	s, err := c.Stream(t.Context(), "echo.stream", map[string]any{"n": 5000}, mesh.Window(8))
	if err != nil {
		t.Fatal(err)
	}
	n := int64(0)
	for raw, err := range s.All() {
		if err != nil {
			t.Fatalf("after %d chunks: %v", n, err)
		}
		var ch struct{ I int64 }
		if json.Unmarshal(raw, &ch) != nil || ch.I != n+1 {
			t.Fatalf("chunk %d: %s", n+1, raw)
		}
		n++
	}
	s.Close()
	if n != 5000 || s.Result() == nil || string(s.Result().Result) != `{"chunks":5000}` {
		t.Fatalf("got %d chunks, end %+v", n, s.Result())
	}

	s, err = c.Stream(t.Context(), "hop.forever", nil, mesh.Window(4))
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		if _, err := s.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()
	select {
	case err := <-stopped:
		if envelope.CodeOf(err) != envelope.CodeCancelled {
			t.Errorf("the handler on A stopped with %v; want CANCELLED", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the cancel did not cross the peer link to the handler on hub A")
	}
}

// TestStreamOverJSONRPC: the same stream read through a plain JSON-RPC
// WebSocket (its chunks as stream.chunk notifications tied to the call's
// id, then the response) and through POST /rpc as Server-Sent Events
// (chunk events with their sequence number as id, then an end event
// holding the JSON-RPC response); a failing stream's end carries the
// error with the last sequence number.
func TestStreamOverJSONRPC(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	a := agents.NewEcho()
	a.HandleStream("echo.fail", func(ctx context.Context, _ json.RawMessage, s *agents.Stream) error {
		for i := range 3 {
			if err := s.Send(ctx, i); err != nil {
				return err
			}
		}
		return envelope.NewError(envelope.CodeUnavailable, "the model went away")
	})
	m.RunAgent(t, a)

	ws, _, err := websocket.DefaultDialer.Dial(m.WS, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	if err := ws.WriteMessage(websocket.TextMessage, []byte(`{"jsonrpc":"2.0","id":"s1","method":"echo.stream","params":{"n":500}}`)); err != nil {
		t.Fatal(err)
	}
	for n := 1; ; n++ {
		_, msg, err := ws.ReadMessage()
		if err != nil {
			t.Fatal(err)
		}
		var note struct {
			Method string
			Params struct {
				ID   string
				N    int
				Data struct{ I int }
			}
			ID     string
			Result json.RawMessage
		}
		if err := json.Unmarshal(msg, &note); err != nil {
			t.Fatalf("%s: %v", msg, err)
		}
		if n == 501 {
			if note.ID != "s1" || string(note.Result) != `{"chunks":500}` {
				t.Fatalf("after 500 chunks: %s; want the response to s1", msg)
			}
			break
		}
		if note.Method != stream.ChunkMethod || note.Params.ID != "s1" || note.Params.N != n || note.Params.Data.I != n {
			t.Fatalf("message %d: %s; want stream.chunk %d of s1", n, msg, n)
		}
	}

	// SSE: the chunks, then the end.
	events := func(body string) []string {
		req, _ := http.NewRequest(http.MethodPost, m.HTTP+"/rpc", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "text/event-stream")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		if ct := res.Header.Get("Content-Type"); res.StatusCode != 200 || ct != "text/event-stream" {
			t.Fatalf("POST /rpc with Accept: text/event-stream: %d %s", res.StatusCode, ct)
		}
		raw, _ := io.ReadAll(res.Body)
		return strings.Split(strings.TrimSuffix(string(raw), "\n\n"), "\n\n")
	}
	ev := events(`{"jsonrpc":"2.0","id":7,"method":"echo.stream","params":{"n":3}}`)
	want := []string{
		"event: chunk\nid: 1\ndata: {\"i\":1,\"pad\":\"\"}",
		"event: chunk\nid: 2\ndata: {\"i\":2,\"pad\":\"\"}",
		"event: chunk\nid: 3\ndata: {\"i\":3,\"pad\":\"\"}",
		"event: end\ndata: {\"jsonrpc\":\"2.0\",\"result\":{\"chunks\":3},\"id\":7}",
	}
	if strings.Join(ev, "|") != strings.Join(want, "|") {
		t.Fatalf("SSE events:\n%q\nwant\n%q", ev, want)
	}
	ev = events(`{"jsonrpc":"2.0","id":8,"method":"echo.fail"}`)
	if len(ev) != 4 || !strings.Contains(ev[3], `"code":"UNAVAILABLE"`) || !strings.Contains(ev[3], `"lastSeq":3`) {
		t.Fatalf("a failing stream over SSE: %q; want 3 chunks, then an end with UNAVAILABLE and lastSeq 3", ev)
	}
	// A method that does not stream: the end alone.
	if ev := events(`{"jsonrpc":"2.0","id":9,"method":"echo.echo","params":["hi"]}`); len(ev) != 1 || ev[0] != "event: end\ndata: {\"jsonrpc\":\"2.0\",\"result\":[\"hi\"],\"id\":9}" {
		t.Fatalf("a plain method over SSE: %q", ev)
	}
}

// TestStreamOverAgentickAndMultica: the same stream read through the
// agentick WebSocket (method:chunk events {requestId, method, seq, chunk},
// a method:end event, then the res) and through a Multica device (stream
// messages with the seed's StreamPayload {streamId, agentId, event}, the
// event a chunk, then an end, then the response).
func TestStreamOverAgentickAndMultica(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	m.RunAgent(t, agents.NewEcho())

	ag, _, err := testkit.DialAgentick(t, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	ag.Write(`{"type":"connect","clientId":"c1"}`)
	if f := ag.Read(); f["type"] != "connected" {
		t.Fatalf("connect: %v", f)
	}
	res := ag.Call("r1", "echo.stream", map[string]any{"n": 200})
	if res["ok"] != true || fmt.Sprint(res["payload"]) != "map[chunks:200]" {
		t.Fatalf("res: %v", res)
	}
	if len(ag.Aside) != 201 {
		t.Fatalf("%d events before the res; want 200 chunks and an end", len(ag.Aside))
	}
	for i, ev := range ag.Aside[:200] {
		d, _ := ev["data"].(map[string]any)
		chunk, _ := d["chunk"].(map[string]any)
		if ev["event"] != "method:chunk" || ev["category"] != "gateway" || d["requestId"] != "r1" || d["method"] != "echo.stream" ||
			d["seq"] != float64(i+1) || chunk["i"] != float64(i+1) {
			t.Fatalf("event %d: %v", i+1, ev)
		}
	}
	if end, _ := ag.Aside[200]["data"].(map[string]any); ag.Aside[200]["event"] != "method:end" || end["chunks"] != float64(200) || end["error"] != nil {
		t.Fatalf("end: %v", ag.Aside[200])
	}

	d := testkit.ConnectDevice(t, m, "dev-1")
	d.Write(testkit.MustJSON(t, map[string]any{"id": "m1", "uid": nil, "from": "dev-1", "to": d.Hub, "action": "request",
		"payload": map[string]any{"requestId": "q1", "method": "echo.stream", "params": map[string]any{"n": 50}}}))
	for i := 1; i <= 51; i++ {
		msg := d.Next("stream")
		p, _ := msg["payload"].(map[string]any)
		ev, _ := p["event"].(map[string]any)
		if p["streamId"] != "q1" {
			t.Fatalf("stream message %d: %v", i, msg)
		}
		if i == 51 {
			if ev["type"] != "end" || ev["chunks"] != float64(50) {
				t.Fatalf("end: %v", msg)
			}
			break
		}
		data, _ := ev["data"].(map[string]any)
		if ev["type"] != "chunk" || ev["seq"] != float64(i) || data["i"] != float64(i) {
			t.Fatalf("stream message %d: %v", i, msg)
		}
	}
	r := d.Next("response")
	if p, _ := r["payload"].(map[string]any); p["requestId"] != "q1" || p["ok"] != true {
		t.Fatalf("response: %v", r)
	}
}

// TestStreamSpanAndMetrics: a stream is one server span on the hub with
// its chunks, bytes, time to first chunk and stalls, and the hub's
// metrics count it (open while it runs, its chunks, bytes, stalls and
// time to first chunk once it ended). The client holds its 4 chunks of
// credit unread at first: the agent uses them up, a stall.
func TestStreamSpanAndMetrics(t *testing.T) {
	exp, p := testkit.Tracing(t, "hub")
	var h *hub.Hub
	metrics := telemetry.NewMetrics(telemetry.NewLabeler(func(m string) bool { return h != nil && h.KnownMethod(m) }))
	m := meshtest.Start(t, hub.Config{}, hub.WithTelemetry(telemetry.New(p, metrics)))
	h = m.Hub
	m.RunAgent(t, agents.NewEcho())
	c := m.Client(t)
	s, err := c.Stream(t.Context(), "echo.stream", map[string]any{"n": 100, "size": 100}, mesh.Window(4))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	meshtest.WaitFor(t, 5*time.Second, func() bool { return s.Received() == 4 })
	if v := gauge(t, metrics, "agentmesh_streams_open"); v != 1 {
		t.Errorf("agentmesh_streams_open = %v while the stream runs; want 1", v)
	}
	n := 0
	for _, err := range s.All() {
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 100 {
		t.Fatalf("%d chunks; want 100", n)
	}
	_ = p.ForceFlush(t.Context())
	var attrs map[string]any
	for _, sp := range exp.GetSpans() {
		if sp.SpanKind == trace.SpanKindServer && sp.Name == "echo.stream" {
			attrs = map[string]any{}
			for _, kv := range sp.Attributes {
				attrs[string(kv.Key)] = kv.Value.AsInterface()
			}
		}
	}
	if attrs == nil {
		t.Fatalf("no server span for echo.stream among %d spans", len(exp.GetSpans()))
	}
	if attrs["agentmesh.stream.chunks"] != int64(100) || attrs["agentmesh.stream.bytes"].(int64) < 100*90 ||
		attrs["agentmesh.stream.first_chunk_ms"] == nil || attrs["agentmesh.stream.stalls"].(int64) < 1 {
		t.Errorf("the stream's span: %v; want 100 chunks, their bytes, the time to the first, at least 1 stall", attrs)
	}
	meshtest.WaitFor(t, 5*time.Second, func() bool { return gauge(t, metrics, "agentmesh_streams_open") == 0 })
	if v := streamCounter(t, metrics, "agentmesh_stream_chunks_total"); v != 100 {
		t.Errorf("agentmesh_stream_chunks_total = %v; want 100", v)
	}
	if v := streamCounter(t, metrics, "agentmesh_stream_flow_control_stalls_total"); v < 1 {
		t.Errorf("agentmesh_stream_flow_control_stalls_total = %v; want at least 1", v)
	}
	if v := streamCounter(t, metrics, "agentmesh_stream_bytes_total"); v < 100*90 {
		t.Errorf("agentmesh_stream_bytes_total = %v; want the chunks' bytes", v)
	}
}

// gauge and streamCounter read the one series of a metric on the hub (method
// echo.stream).
func gauge(t *testing.T, m *telemetry.Metrics, name string) float64 {
	return metricValue(t, m, name, func(mt *dto.Metric) float64 { return mt.GetGauge().GetValue() })
}

func streamCounter(t *testing.T, m *telemetry.Metrics, name string) float64 {
	return metricValue(t, m, name, func(mt *dto.Metric) float64 { return mt.GetCounter().GetValue() })
}

func metricValue(t *testing.T, m *telemetry.Metrics, name string, v func(*dto.Metric) float64) float64 {
	t.Helper()
	fams, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			for _, mt := range f.Metric {
				for _, lp := range mt.Label {
					if lp.GetName() == "rpc_method" && lp.GetValue() == "echo.stream" {
						return v(mt)
					}
				}
			}
		}
	}
	return 0
}

// TestStreamRetriesBeforeFirstChunkOnly: before its first chunk a stream
// follows its method's retry policy (the failing instance's UNAVAILABLE
// is retried on the other, and the caller sees one clean stream); after
// a chunk it is never retried (the error reaches the caller, with the
// last sequence number, and no other instance runs it).
func TestStreamRetriesBeforeFirstChunkOnly(t *testing.T) {
	rc := reliability.DefaultConfig()
	rc.Policies["flaky.*"] = reliability.Policy{Retries: 2, Idempotent: true,
		Backoff: reliability.BackoffConfig{Initial: time.Millisecond, Max: time.Millisecond, Multiplier: 1}}
	m := meshtest.Start(t, hub.Config{Reliability: &rc})
	var runs, triedA atomic.Int64
	for _, id := range []string{"a", "b"} {
		a := agents.New("flaky", agents.WithID("flaky-"+id))
		a.HandleStream("flaky.early", func(ctx context.Context, _ json.RawMessage, s *agents.Stream) error {
			if id == "a" {
				triedA.Add(1)
				return envelope.NewError(envelope.CodeUnavailable, "a is warming up")
			}
			for i := range 3 {
				if err := s.Send(ctx, i); err != nil {
					return err
				}
			}
			return nil
		})
		a.HandleStream("flaky.late", func(ctx context.Context, _ json.RawMessage, s *agents.Stream) error {
			runs.Add(1)
			if err := s.Send(ctx, "one"); err != nil {
				return err
			}
			return envelope.NewError(envelope.CodeUnavailable, "lost the model after a chunk")
		})
		m.RunAgent(t, a)
	}
	c := m.Client(t, mesh.WithoutReliability())
	for range 20 { // the balancer picks a or b first: both orders come up
		s, err := c.Stream(t.Context(), "flaky.early", nil)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, err := range s.All() {
			if err != nil {
				t.Fatalf("flaky.early after %d chunks: %v", n, err)
			}
			n++
		}
		s.Close()
		if n != 3 {
			t.Fatalf("flaky.early: %d chunks; want 3 (retried on b before any chunk)", n)
		}
	}
	if triedA.Load() == 0 {
		t.Fatal("the balancer never tried a first: the retry went untested")
	}
	s, err := c.Stream(t.Context(), "flaky.late", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if c, err := s.Recv(); err != nil || string(c) != `"one"` {
		t.Fatalf("first chunk: %s %v", c, err)
	}
	_, err = s.Recv()
	var e *envelope.Error
	if !errors.As(err, &e) || e.Code != envelope.CodeUnavailable || !strings.Contains(string(e.Data), `"lastSeq":1`) {
		t.Fatalf("after a chunk: %v (%s); want UNAVAILABLE with lastSeq 1", err, e.Data)
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("flaky.late ran %d times; want 1 (never retried after a chunk)", n)
	}
}

// TestStreamingDeclared: a method served with HandleStream is declared
// streaming in schema, in agentick's schema (the seed's streaming
// methods, with the method:chunk and method:end events) and in
// rpc.discover, whose x-agentmesh-stream extension gives the JSON-RPC
// notification its chunks ride in; a plain method is not.
func TestStreamingDeclared(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	m.RunAgent(t, agents.NewEcho())
	c := m.Client(t)
	var s control.SchemaPayload
	if err := c.Call(t.Context(), "schema", nil, &s); err != nil {
		t.Fatal(err)
	}
	if !s.Methods["echo.stream"].Streaming || s.Methods["echo.echo"].Streaming {
		t.Errorf("schema: echo.stream streaming %v, echo.echo %v; want true, false", s.Methods["echo.stream"].Streaming, s.Methods["echo.echo"].Streaming)
	}
	var doc struct {
		Methods []struct {
			Name   string
			Stream *struct{ Notification, SSE string } `json:"x-agentmesh-stream"`
		}
	}
	if err := c.Call(t.Context(), "rpc.discover", nil, &doc); err != nil {
		t.Fatal(err)
	}
	for _, m := range doc.Methods {
		switch m.Name {
		case "echo.stream":
			if m.Stream == nil || m.Stream.Notification != "stream.chunk" || !strings.Contains(m.Stream.SSE, "text/event-stream") {
				t.Errorf("rpc.discover echo.stream: %+v; want x-agentmesh-stream with stream.chunk and SSE", m.Stream)
			}
		case "echo.echo":
			if m.Stream != nil {
				t.Errorf("rpc.discover echo.echo has x-agentmesh-stream")
			}
		}
	}
	ag, _, err := testkit.DialAgentick(t, m, nil)
	if err != nil {
		t.Fatal(err)
	}
	ag.Write(`{"type":"connect","clientId":"c1"}`)
	ag.Read()
	res := ag.Call("s", "schema", nil)
	p, _ := res["payload"].(map[string]any)
	methods, _ := p["methods"].(map[string]any)
	es, _ := methods["echo.stream"].(map[string]any)
	if es["streaming"] != true || !strings.Contains(fmt.Sprint(p["events"]), "method:chunk") || !strings.Contains(fmt.Sprint(p["events"]), "method:end") {
		t.Errorf("agentick schema: echo.stream %v, events %v; want streaming, and method:chunk/method:end events", es, p["events"])
	}
}
