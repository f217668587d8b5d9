package chat

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
)

// fakeOpenAI is an OpenAI-compatible chat-completions server: each request
// is answered by the next script, a list of SSE data payloads (a payload
// "!cut" closes the connection there, "!hang" waits for the client to go).
type fakeOpenAI struct {
	t       *testing.T
	mu      sync.Mutex
	scripts [][]string
	status  int // non-zero: answer this status with an error body
	bodies  []map[string]any
	auth    []string
}

func (f *fakeOpenAI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/chat/completions" {
		http.NotFound(w, r)
		return
	}
	var body map[string]any
	b, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(b, &body); err != nil {
		http.Error(w, "bad json", 400)
		return
	}
	f.mu.Lock()
	f.bodies = append(f.bodies, body)
	f.auth = append(f.auth, r.Header.Get("Authorization"))
	status := f.status
	var script []string
	if len(f.scripts) > 0 {
		script, f.scripts = f.scripts[0], f.scripts[1:]
	}
	f.mu.Unlock()
	if status != 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprint(w, `{"error":{"message":"slow down","type":"rate_limit"}}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	for _, d := range script {
		switch d {
		case "!cut":
			fl.Flush()
			panic(http.ErrAbortHandler) // drop the connection mid-stream
		case "!hang":
			fl.Flush()
			<-r.Context().Done()
			return
		}
		fmt.Fprintf(w, "data: %s\n\n", d)
		fl.Flush()
	}
}

func (f *fakeOpenAI) requests() []map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]map[string]any(nil), f.bodies...)
}

func startFake(t *testing.T, scripts ...[]string) (*fakeOpenAI, *OpenAI) {
	f := &fakeOpenAI{t: t, scripts: scripts}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	p, err := NewOpenAI(OpenAIConfig{BaseURL: srv.URL + "/v1/", APIKey: "sk-test", Model: "gpt-test", HTTPClient: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	return f, p
}

func delta(content string) string {
	b, _ := json.Marshal(map[string]any{"model": "gpt-test-0613", "choices": []any{map[string]any{"index": 0, "delta": map[string]any{"content": content}, "finish_reason": nil}}})
	return string(b)
}

func finish(reason string) string {
	return fmt.Sprintf(`{"choices":[{"index":0,"delta":{},"finish_reason":%q}]}`, reason)
}

const usageChunk = `{"choices":[],"usage":{"prompt_tokens":11,"completion_tokens":7,"total_tokens":18}}`

func TestOpenAIStreamsText(t *testing.T) {
	f, p := startFake(t, []string{
		`{"choices":[{"index":0,"delta":{"role":"assistant","reasoning_content":"Hmm, "}}]}`,
		`{"choices":[{"index":0,"delta":{"reasoning_content":"a greeting."}}]}`,
		delta("Hel"), delta("lo "), delta("there!"), finish("stop"), usageChunk, "[DONE]",
	})
	rt := newRT(t, Config{}, p, nil)
	a := mustCreate(t, rt, "o1", "You are terse.")
	rec := record(t, a)
	res, err := a.Send(t.Context(), "Hi", "")
	if err != nil {
		t.Fatal(err)
	}
	if res.Content != "Hello there!" {
		t.Errorf("content = %q", res.Content)
	}
	evs := rec.events()
	end := checkMessageStream(t, evs, "o1")
	if len(evs) != 2+5 {
		t.Errorf("%d events; want start, one update per content chunk (5), end", len(evs))
	}
	if end.Message.StopReason != StopEndTurn {
		t.Errorf("stopReason = %q", end.Message.StopReason)
	}
	if got := asMap(t, evs[len(evs)-2].Event)["message"]; !reflect.DeepEqual(got, map[string]any{"role": "assistant", "content": []any{
		map[string]any{"type": "thinking", "thinking": "Hmm, a greeting."}, map[string]any{"type": "text", "text": "Hello there!"}}}) {
		t.Errorf("last update's message = %v", got)
	}
	page, _ := rt.Messages("o1", 0, 10)
	as := page.Messages[1]
	if as.Model != "gpt-test-0613" || as.Provider != "openai" || !reflect.DeepEqual(as.Usage, &Usage{Input: 11, Output: 7, TotalTokens: 18}) {
		t.Errorf("assistant message = %+v (usage %+v)", as, as.Usage)
	}
	reqs := f.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests", len(reqs))
	}
	body := reqs[0]
	if body["model"] != "gpt-test" || body["stream"] != true || f.auth[0] != "Bearer sk-test" {
		t.Errorf("request = %v, auth %q", body, f.auth[0])
	}
	if got := body["messages"]; !reflect.DeepEqual(got, []any{
		map[string]any{"role": "system", "content": "You are terse."},
		map[string]any{"role": "user", "content": "Hi"},
	}) {
		t.Errorf("messages sent = %v", got)
	}
	if _, ok := body["tools"]; ok {
		t.Errorf("tools sent with no tool registered")
	}
}

func TestOpenAIToolCalls(t *testing.T) {
	// Two tool calls, their names and arguments streamed in fragments, then
	// a second completion that reads the results.
	f, p := startFake(t,
		[]string{
			delta("Let me look. "),
			`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"lookup","arguments":""}}]}}]}`,
			`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"ke"}}]}}]}`,
			`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"y\":\"cat\"}"}}]}}]}`,
			`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"lookup","arguments":"{\"key\":\"dog\"}"}}]}}]}`,
			finish("tool_calls"), "[DONE]",
		},
		[]string{delta("A cat and a dog."), finish("stop"), "[DONE]"},
	)
	rt := newRT(t, Config{}, p, NewTools(lookupTool()))
	a := mustCreate(t, rt, "o2", "")
	rec := record(t, a)
	res, err := a.Send(t.Context(), "What are cat and dog?", "r1")
	if err != nil {
		t.Fatal(err)
	}
	if res.Content != "A cat and a dog." {
		t.Errorf("content = %q", res.Content)
	}
	want := []string{"message_start", "message_update*", "message_end", "tool_execution_start", "tool_execution_end",
		"tool_execution_start", "tool_execution_end", "message_start", "message_update*", "message_end"}
	evs := rec.events()
	if got := types(evs); !reflect.DeepEqual(got, want) {
		t.Fatalf("events = %v\nwant %v", got, want)
	}
	end := checkMessageStream(t, evs[:len(evs)-7], "o2")
	calls := ToolCalls(end.Message.Content)
	if end.Message.StopReason != StopToolUse || len(calls) != 2 || calls[0].ID != "call_a" || string(calls[0].Arguments) != `{"key":"cat"}` ||
		calls[1].ID != "call_b" || string(calls[1].Arguments) != `{"key":"dog"}` {
		t.Fatalf("message_end = %+v", end.Message)
	}
	for i, id := range []string{"call_a", "call_b"} {
		s, e := evs[len(evs)-7+2*i], evs[len(evs)-6+2*i]
		if s.Event.ToolCallID != id || e.Event.ToolCallID != id || *e.Event.Result != "value-of-"+[]string{"cat", "dog"}[i] || *e.Event.IsError {
			t.Errorf("tool events %d = %+v / %+v", i, s.Event, e.Event)
		}
	}
	reqs := f.requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests, want 2", len(reqs))
	}
	tools := reqs[0]["tools"].([]any)
	if len(tools) != 1 || tools[0].(map[string]any)["function"].(map[string]any)["name"] != "lookup" {
		t.Errorf("tools sent = %v", tools)
	}
	msgs := reqs[1]["messages"].([]any)
	if len(msgs) != 4 {
		t.Fatalf("second request's messages = %v", msgs)
	}
	asst := msgs[1].(map[string]any)
	tc := asst["tool_calls"].([]any)
	if asst["content"] != "Let me look. " || len(tc) != 2 || tc[0].(map[string]any)["id"] != "call_a" ||
		tc[0].(map[string]any)["function"].(map[string]any)["arguments"] != `{"key":"cat"}` {
		t.Errorf("assistant message sent back = %v", asst)
	}
	if got := msgs[2]; !reflect.DeepEqual(got, map[string]any{"role": "tool", "tool_call_id": "call_a", "content": "value-of-cat"}) {
		t.Errorf("tool message = %v", got)
	}
}

func TestOpenAIErrorMidStream(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script []string
		code   envelope.Code
		text   string
	}{
		{"error chunk", []string{delta("Par"), delta("tial"), `{"error":{"message":"model overloaded","type":"server_error"}}`}, envelope.CodeRPCError, "model overloaded"},
		{"connection cut", []string{delta("Par"), delta("tial"), "!cut"}, envelope.CodeUnavailable, ""},
		{"ended without finishing", []string{delta("Par"), delta("tial")}, envelope.CodeUnavailable, "ended before it finished"},
		{"bad chunk", []string{delta("Par"), delta("tial"), `{not json`}, envelope.CodeRPCError, "bad chunk"},
		{"tool args not an object", []string{delta("Par"), delta("tial"),
			`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"lookup","arguments":"[1]"}}]}}]}`, finish("tool_calls"), "[DONE]"},
			envelope.CodeRPCError, "not a JSON object"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, p := startFake(t, tc.script, []string{delta("fine"), finish("stop"), "[DONE]"})
			rt := newRT(t, Config{}, p, NewTools(lookupTool()))
			a := mustCreate(t, rt, "e1", "")
			rec := record(t, a)
			_, err := a.Send(t.Context(), "go", "")
			if envelope.CodeOf(err) != tc.code || !strings.Contains(err.Error(), tc.text) {
				t.Fatalf("send error = %v; want %s containing %q", err, tc.code, tc.text)
			}
			evs := rec.events()
			end := checkMessageStream(t, evs, "e1")
			if end.Message.StopReason != StopError || TextOf(end.Message.Content) != "Partial" {
				t.Errorf("message_end = %+v; want stopReason error with the partial text", end.Message)
			}
			page, _ := rt.Messages("e1", 0, 10)
			if page.Total != 2 || page.Messages[1].StopReason != StopError || page.Messages[1].ErrorMessage == "" {
				t.Errorf("history = %+v", page.Messages)
			}
			// The agent answers the next send.
			if res, err := a.Send(t.Context(), "again", ""); err != nil || res.Content != "fine" {
				t.Errorf("next send = %+v, %v", res, err)
			}
		})
	}
}

func TestOpenAIHTTPErrorAndCancel(t *testing.T) {
	f, p := startFake(t)
	f.status = http.StatusTooManyRequests
	rt := newRT(t, Config{}, p, nil)
	a := mustCreate(t, rt, "h1", "")
	if _, err := a.Send(t.Context(), "go", ""); envelope.CodeOf(err) != envelope.CodeOverloaded || !strings.Contains(err.Error(), "slow down") {
		t.Errorf("429: %v; want OVERLOADED with the server's message", err)
	}
	f.mu.Lock()
	f.status = 0
	f.scripts = [][]string{{delta("thinking hard"), "!hang"}}
	f.mu.Unlock()
	streaming := make(chan struct{})
	var once sync.Once
	defer a.Subscribe(func(e SeqEvent) {
		if e.Event.Type == EventMessageUpdate {
			once.Do(func() { close(streaming) })
		}
	})()
	errc := make(chan error, 1)
	go func() { _, err := a.Send(context.Background(), "go", "hang-1"); errc <- err }()
	<-streaming
	start := time.Now()
	a.Cancel("hang-1")
	if err := <-errc; envelope.CodeOf(err) != envelope.CodeCancelled {
		t.Errorf("cancelled stream: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("cancel took %s", d)
	}
	page, _ := rt.Messages("h1", 0, 10)
	last := page.Messages[page.Total-1]
	if last.StopReason != StopAborted || TextOf(last.Content) != "thinking hard" {
		t.Errorf("aborted message = %+v", last)
	}
	t.Setenv("OPENAI_MODEL", "")
	if _, err := NewOpenAI(OpenAIConfig{BaseURL: "http://x"}); err == nil {
		t.Errorf("NewOpenAI without a model succeeded")
	}
}

func TestOpenAISilentStreamTimesOut(t *testing.T) {
	f := &fakeOpenAI{t: t, scripts: [][]string{{delta("Hel"), "!hang"}}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	p, err := NewOpenAI(OpenAIConfig{BaseURL: srv.URL + "/v1", Model: "m", HTTPClient: srv.Client(), IdleTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rt := newRT(t, Config{}, p, nil)
	a := mustCreate(t, rt, "idle", "")
	start := time.Now()
	_, err = a.Send(t.Context(), "hi", "")
	if envelope.CodeOf(err) != envelope.CodeTimeout || time.Since(start) > 5*time.Second {
		t.Errorf("silent stream: %v after %s; want TIMEOUT after about 200ms", err, time.Since(start))
	}
	page, _ := rt.Messages("idle", 0, 10)
	if page.Total != 2 || page.Messages[1].StopReason != StopError || TextOf(page.Messages[1].Content) != "Hel" {
		t.Errorf("history = %+v", page.Messages)
	}
}
