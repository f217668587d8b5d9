package openai_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/agents/chat"
	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/surface/openai"
	"github.com/agentmesh/agentmesh/telemetry"
)

// oaiCompletion is a chat.completion object.
type oaiCompletion struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int `json:"index"`
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
}

func completion(t *testing.T, what string, status int, b []byte) oaiCompletion {
	t.Helper()
	if status != http.StatusOK {
		t.Fatalf("%s: HTTP %d %s", what, status, b)
	}
	var c oaiCompletion
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("%s: %v: %s", what, err, b)
	}
	if c.Object != "chat.completion" || !strings.HasPrefix(c.ID, "chatcmpl-") || c.Created == 0 || len(c.Choices) != 1 ||
		c.Choices[0].Message.Role != "assistant" || c.Choices[0].FinishReason != "stop" || c.Usage == nil ||
		c.Usage.TotalTokens != c.Usage.PromptTokens+c.Usage.CompletionTokens || c.Usage.CompletionTokens == 0 {
		t.Fatalf("%s: not a chat.completion with one assistant choice and usage: %s", what, b)
	}
	return c
}

// oaiError decodes OpenAI's error object.
func oaiError(t *testing.T, b []byte) (msg, typ, code string) {
	t.Helper()
	var e struct {
		Error *struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    string  `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &e); err != nil || e.Error == nil || e.Error.Message == "" || e.Error.Type == "" {
		t.Fatalf("not an OpenAI error object: %s", b)
	}
	return e.Error.Message, e.Error.Type, e.Error.Code
}

func chatAgents(t *testing.T, c *mesh.Client) []string {
	t.Helper()
	var list struct {
		Agents []struct {
			AgentID string `json:"agent_id"`
		} `json:"agents"`
	}
	if err := c.Call(t.Context(), "chat.list", nil, &list); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range list.Agents {
		out = append(out, a.AgentID)
	}
	return out
}

// TestOpenAICompletion: a non-streamed completion of the transient model
// answers the chat agent's reply to the last user message (system prompt
// and earlier turns given to the agent, which is destroyed afterwards);
// one addressed to an existing agent by chat/ID goes on that agent's own
// conversation.
func TestOpenAICompletion(t *testing.T) {
	m := testkit.StartNexus3(t, nil)
	c := m.Client(t)
	status, _, b := testkit.OpenAIPost(t, m.HTTP, "", `{"model":"agentmesh-chat","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello"}]}`)
	got := completion(t, "transient", status, b)
	if want := `You said: "Hello" (1 messages in context)`; got.Choices[0].Message.Content != want || got.Model != "agentmesh-chat" {
		t.Errorf("transient: content %q model %q; want %q, agentmesh-chat", got.Choices[0].Message.Content, got.Model, want)
	}
	t.Logf("transient: %s", b)
	// Earlier turns and content parts.
	status, _, b = testkit.OpenAIPost(t, m.HTTP, "", `{"model":"agentmesh-chat","messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello!"},{"role":"user","content":[{"type":"text","text":"How "},{"type":"text","text":"are you?"}]}]}`)
	if got := completion(t, "with history", status, b); got.Choices[0].Message.Content != `You said: "How are you?" (1 messages in context)` {
		t.Errorf("with history: %q", got.Choices[0].Message.Content)
	}
	if a := chatAgents(t, c); len(a) != 0 {
		t.Errorf("chat agents after transient completions: %v; want none (destroyed)", a)
	}

	if err := c.Call(t.Context(), "chat.create", map[string]any{"agent_id": "pal"}, nil); err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{`You said: "one" (1 messages in context)`, `You said: "two" (3 messages in context)`} {
		word := []string{"one", "two"}[i]
		status, _, b := testkit.OpenAIPost(t, m.HTTP, "", `{"model":"chat/pal","messages":[{"role":"user","content":"`+word+`"}]}`)
		if got := completion(t, "chat/pal", status, b); got.Choices[0].Message.Content != want || got.Model != "chat/pal" {
			t.Errorf("chat/pal turn %d: %q (model %q); want %q", i+1, got.Choices[0].Message.Content, got.Model, want)
		}
	}
	var page struct {
		Total int `json:"total"`
	}
	if err := c.Call(t.Context(), "chat.getAgentMessages", map[string]any{"agentId": "pal"}, &page); err != nil || page.Total != 4 {
		t.Errorf("pal's history: %d messages, %v; want 4 (two turns)", page.Total, err)
	}
}

// sseChunk is one chat.completion.chunk.
type sseChunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Delta struct {
			Role             string `json:"role"`
			Content          string `json:"content"`
			ReasoningContent string `json:"reasoning_content"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		TotalTokens int `json:"total_tokens"`
	} `json:"usage"`
}

// readSSE reads a stream's data lines until [DONE] (done true) or EOF.
func readSSE(t *testing.T, r io.Reader, each func(sseChunk)) (done bool) {
	t.Helper()
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			for sc.Scan() {
				if sc.Text() != "" {
					t.Errorf("data after [DONE]: %q", sc.Text())
				}
			}
			return true
		}
		var c sseChunk
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("bad chunk %q: %v", data, err)
		}
		each(c)
	}
	return false
}

// TestOpenAIStream: a streamed completion is text/event-stream: a first
// chunk with the assistant role, content deltas that add up to the
// non-streamed answer (many of them: the agent streams in chunks of 8
// runes), thinking as reasoning_content, a last chunk with finish_reason
// stop, the usage chunk asked for, then data: [DONE].
func TestOpenAIStream(t *testing.T) {
	m := testkit.StartNexus3(t, nil)
	body := `{"model":"agentmesh-chat","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"/think say it in many words please"}]}`
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, m.HTTP+"/v1/chat/completions", strings.NewReader(body))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("HTTP %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
	var (
		chunks, deltas int
		text, think    strings.Builder
		role, finish   string
		usage, ids     = 0, map[string]bool{}
		afterFinish    int
	)
	done := readSSE(t, res.Body, func(c sseChunk) {
		chunks++
		ids[c.ID] = true
		if c.Object != "chat.completion.chunk" || c.Model != "agentmesh-chat" {
			t.Errorf("chunk %d: object %q model %q", chunks, c.Object, c.Model)
		}
		if c.Usage != nil {
			usage = c.Usage.TotalTokens
			if len(c.Choices) != 0 || finish == "" {
				t.Errorf("usage chunk with choices %d, before the finish chunk %q", len(c.Choices), finish)
			}
			return
		}
		if len(c.Choices) != 1 {
			t.Fatalf("chunk %d: %d choices", chunks, len(c.Choices))
		}
		ch := c.Choices[0]
		if finish != "" {
			afterFinish++
		}
		if chunks == 1 {
			role = ch.Delta.Role
		}
		if ch.Delta.Content != "" {
			deltas++
			text.WriteString(ch.Delta.Content)
		}
		think.WriteString(ch.Delta.ReasoningContent)
		if ch.FinishReason != nil {
			finish = *ch.FinishReason
		}
	})
	want := `You said: "say it in many words please" (1 messages in context)`
	t.Logf("stream: %d chunks, %d content deltas, text %q, reasoning %q, finish %q, usage %d", chunks, deltas, text.String(), think.String(), finish, usage)
	if !done || role != "assistant" || text.String() != want || think.String() != "The user asks: say it in many words please" ||
		finish != "stop" || usage == 0 || afterFinish != 0 || len(ids) != 1 || deltas < len(want)/8 {
		t.Errorf("stream: done %v role %q text %q reasoning %q finish %q usage %d chunks after finish %d ids %d deltas %d; want [DONE], assistant, %q, stop, usage, one id, ≥ %d deltas",
			done, role, text.String(), think.String(), finish, usage, afterFinish, len(ids), deltas, want, len(want)/8)
	}
}

// TestOpenAIStreamToolTurn: a turn that calls a tool streams both of its
// assistant messages, separated by a blank line, and ends once, after the
// last; the non-streamed answer of the same turn is the last message.
func TestOpenAIStreamToolTurn(t *testing.T) {
	m := testkit.StartNexus3(t, nil)
	body := `{"model":"agentmesh-chat","stream":true,"messages":[{"role":"user","content":"/tool nosuch {}"}]}`
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, m.HTTP+"/v1/chat/completions", strings.NewReader(body))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var text strings.Builder
	finishes := 0
	done := readSSE(t, res.Body, func(c sseChunk) {
		for _, ch := range c.Choices {
			text.WriteString(ch.Delta.Content)
			if ch.FinishReason != nil {
				finishes++
			}
		}
	})
	last := `Tool nosuch returned: unknown tool "nosuch"`
	t.Logf("streamed tool turn: %q", text.String())
	if want := "Using nosuch.\n\n" + last; !done || text.String() != want || finishes != 1 {
		t.Errorf("streamed tool turn: %q, %d finish chunks, done %v; want %q, one finish, [DONE]", text.String(), finishes, done, want)
	}
	status, _, b := testkit.OpenAIPost(t, m.HTTP, "", `{"model":"agentmesh-chat","messages":[{"role":"user","content":"/tool nosuch {}"}]}`)
	if got := completion(t, "tool turn", status, b); got.Choices[0].Message.Content != last {
		t.Errorf("non-streamed tool turn: %q; want %q", got.Choices[0].Message.Content, last)
	}
}

// TestOpenAIProviderRoundTrip: the chat runtime's own OpenAI provider,
// a real OpenAI-protocol client, pointed at the hub's /v1: its stream
// (SSE, usage, [DONE]) is read as any OpenAI server's, and the answer is
// the chat agent's.
func TestOpenAIProviderRoundTrip(t *testing.T) {
	m := testkit.StartNexus3(t, nil)
	p, err := chat.NewOpenAI(chat.OpenAIConfig{BaseURL: m.HTTP + "/v1", Model: openai.Model, APIKey: "unused", IdleTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	updates := 0
	msg, err := p.Stream(ctx, &chat.Request{System: "You are terse.", Messages: []chat.Message{
		{Role: chat.RoleUser, Content: chat.Content{chat.Text("earlier question")}},
		{Role: chat.RoleAssistant, Content: chat.Content{chat.Text("earlier answer")}},
		{Role: chat.RoleUser, Content: chat.Content{chat.Text("/think round trip")}},
	}}, func(chat.Content) { updates++ })
	if err != nil {
		t.Fatal(err)
	}
	var thinking string
	for _, b := range msg.Content {
		if b.Type == chat.BlockThinking {
			thinking = b.Thinking
		}
	}
	t.Logf("provider: %d updates, text %q, thinking %q, model %s, stop %s, usage %+v", updates, chat.TextOf(msg.Content), thinking, msg.Model, msg.StopReason, msg.Usage)
	if want := `You said: "round trip" (1 messages in context)`; chat.TextOf(msg.Content) != want || thinking != "The user asks: round trip" ||
		msg.StopReason != chat.StopEndTurn || msg.Model != openai.Model || msg.Usage == nil || msg.Usage.TotalTokens == 0 || updates < 3 {
		t.Errorf("provider's message %+v after %d updates; want %q with its thinking, end_turn, usage", msg, updates, want)
	}
	// Its error path: an unknown model is the provider's coded error.
	bad, _ := chat.NewOpenAI(chat.OpenAIConfig{BaseURL: m.HTTP + "/v1", Model: "chat/nobody"})
	if _, err := bad.Stream(ctx, &chat.Request{Messages: []chat.Message{{Role: chat.RoleUser, Content: chat.Content{chat.Text("hi")}}}}, func(chat.Content) {}); err == nil ||
		!strings.Contains(err.Error(), "404") {
		t.Errorf("provider against an unknown model: %v; want the 404", err)
	}
}

// TestOpenAIModels: /v1/models lists agentmesh-chat and a chat/ID per
// chat agent in OpenAI's list format; one model can be read by id; a hub
// with no chat agent lists none.
func TestOpenAIModels(t *testing.T) {
	m := testkit.StartNexus3(t, nil)
	if err := m.Client(t).Call(t.Context(), "chat.create", map[string]any{"agent_id": "m1"}, nil); err != nil {
		t.Fatal(err)
	}
	get := func(base, path string) (int, []byte) {
		res, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, b
	}
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	var list struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}
	status, b := get(m.HTTP, "/v1/models")
	if err := json.Unmarshal(b, &list); status != 200 || err != nil || list.Object != "list" {
		t.Fatalf("/v1/models: HTTP %d %s", status, b)
	}
	var ids []string
	for _, d := range list.Data {
		if d.Object != "model" || d.Created == 0 || d.OwnedBy == "" {
			t.Errorf("model %+v: want object model, created, owned_by", d)
		}
		ids = append(ids, d.ID)
	}
	if fmt.Sprint(ids) != "[agentmesh-chat chat/m1]" {
		t.Errorf("/v1/models ids %v; want [agentmesh-chat chat/m1]", ids)
	}
	var one model
	if status, b := get(m.HTTP, "/v1/models/chat/m1"); status != 200 || json.Unmarshal(b, &one) != nil || one.ID != "chat/m1" {
		t.Errorf("/v1/models/chat/m1: HTTP %d %s", status, b)
	}
	status, b = get(m.HTTP, "/v1/models/gpt-4o")
	if _, typ, code := oaiError(t, b); status != 404 || code != "model_not_found" || typ != "invalid_request_error" {
		t.Errorf("/v1/models/gpt-4o: HTTP %d %s; want 404 model_not_found", status, b)
	}
	for _, u := range []string{"/v1/embeddings", "/v1/chat/completions"} {
		if status, b := get(m.HTTP, u); status != 404 {
			t.Errorf("GET %s: HTTP %d %s; want 404", u, status, b)
		} else if _, typ, code := oaiError(t, b); typ != "invalid_request_error" || code != "unknown_url" {
			t.Errorf("GET %s: %s; want an invalid_request_error unknown_url", u, b)
		}
	}
	bare := meshtest.Start(t, hub.Config{})
	if status, b := get(bare.HTTP, "/v1/models"); status != 200 || string(b) != `{"object":"list","data":[]}` {
		t.Errorf("/v1/models without a chat agent: HTTP %d %s; want an empty list", status, b)
	}
}

// TestOpenAIErrors: failures are OpenAI error objects with the statuses
// mapped from the mesh codes: 400 for bad requests, 404 for an unknown
// model, 401 without a token (and WWW-Authenticate), 403 for a role the
// method needs, 429 with Retry-After past a token's rate, 503 for an
// agent shutting down, 504 for a turn past its deadline.
func TestOpenAIErrors(t *testing.T) {
	m := testkit.StartNexus3(t, nil)
	check := func(what, body string, wantStatus int, wantType, wantCode string) {
		t.Helper()
		status, _, b := testkit.OpenAIPost(t, m.HTTP, "", body)
		msg, typ, code := oaiError(t, b)
		t.Logf("%s: HTTP %d %s/%s: %s", what, status, typ, code, msg)
		if status != wantStatus || typ != wantType || code != wantCode {
			t.Errorf("%s: HTTP %d %s; want %d %s %s", what, status, b, wantStatus, wantType, wantCode)
		}
	}
	check("not JSON", `{"model":`, 400, "invalid_request_error", "invalid_request")
	check("no model", `{"messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error", "invalid_params")
	check("no messages", `{"model":"agentmesh-chat","messages":[]}`, 400, "invalid_request_error", "invalid_params")
	check("last not user", `{"model":"agentmesh-chat","messages":[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"}]}`, 400, "invalid_request_error", "invalid_params")
	check("image part", `{"model":"agentmesh-chat","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:,"}}]}]}`, 400, "invalid_request_error", "invalid_params")
	check("bad role", `{"model":"agentmesh-chat","messages":[{"role":"wizard","content":"hi"}]}`, 400, "invalid_request_error", "invalid_params")
	check("messages not array", `{"model":"agentmesh-chat","messages":"hi"}`, 400, "invalid_request_error", "invalid_params")
	check("n 2", `{"model":"agentmesh-chat","n":2,"messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error", "invalid_params")
	check("tools", `{"model":"agentmesh-chat","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_request_error", "invalid_params")
	check("unknown model", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`, 404, "invalid_request_error", "model_not_found")
	check("unknown agent", `{"model":"chat/nobody","messages":[{"role":"user","content":"hi"}]}`, 404, "invalid_request_error", "model_not_found")
	check("unknown agent, streamed", `{"model":"chat/nobody","stream":true,"messages":[{"role":"user","content":"hi"}]}`, 404, "invalid_request_error", "model_not_found")

	huge := `{"model":"agentmesh-chat","messages":[{"role":"user","content":"` + strings.Repeat("x", 2<<20) + `"}]}`
	if status, _, b := testkit.OpenAIPost(t, m.HTTP, "", huge); status != http.StatusRequestEntityTooLarge {
		t.Errorf("a body over the limit: HTTP %d %.200s; want 413", status, b)
	} else if _, typ, _ := oaiError(t, b); typ != "invalid_request_error" {
		t.Errorf("a body over the limit: %s", b)
	}

	c := m.Client(t)
	if err := c.Call(t.Context(), "chat.create", map[string]any{"agent_id": "leaving"}, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Call(t.Context(), "chat.shutdown", map[string]any{"agentId": "leaving"}, nil); err != nil {
		t.Fatal(err)
	}
	check("agent shutting down", `{"model":"chat/leaving","messages":[{"role":"user","content":"hi"}]}`, 503, "server_error", "unavailable")
	check("agent shutting down, streamed", `{"model":"chat/leaving","stream":true,"messages":[{"role":"user","content":"hi"}]}`, 503, "server_error", "unavailable")

	// 504: a turn past the hub's deadline for calls without one, with a
	// chat agent that answers late (the runtime's own answers CANCELLED
	// when its deadline passes, which may come first).
	slow := meshtest.Start(t, hub.Config{DefaultTimeout: 300 * time.Millisecond})
	late := agents.New("chat")
	late.Handle("chat.create", func(ctx context.Context, p json.RawMessage) (any, error) {
		return map[string]string{"agent_id": "late"}, nil
	})
	late.Handle("chat.destroy", func(ctx context.Context, p json.RawMessage) (any, error) {
		return map[string]bool{"success": true}, nil
	})
	late.Handle("chat.send", func(ctx context.Context, p json.RawMessage) (any, error) {
		<-ctx.Done()
		time.Sleep(300 * time.Millisecond)
		return map[string]string{"content": "too late"}, nil
	})
	slow.RunAgent(t, late)
	status, _, b := testkit.OpenAIPost(t, slow.HTTP, "", `{"model":"agentmesh-chat","messages":[{"role":"user","content":"Write a long essay"}]}`)
	t.Logf("turn past its deadline: HTTP %d %s", status, b)
	if _, typ, code := oaiError(t, b); status != 504 || typ != "server_error" || code != "timeout" {
		t.Errorf("turn past its deadline: HTTP %d %s; want 504 timeout", status, b)
	}

	// Security: 401, 403, 429 with Retry-After.
	sec := testkit.SecuredHub(t, hub.Security{Roles: map[string][]string{"chat.send": {"writer"}}, RatePerToken: 0.5, BurstPerToken: 2})
	srt := chat.NewRuntime(chat.Config{DataDir: t.TempDir()}, &chat.Scripted{}, nil)
	t.Cleanup(func() { srt.Close(context.Background()) })
	sec.RunAgent(t, chat.NewService(srt, agents.WithToken(testkit.Token(t, auth.Claims{Subject: "chat", Serve: []string{"chat.*"}}, time.Hour))))
	body := `{"model":"agentmesh-chat","messages":[{"role":"user","content":"hi"}]}`
	status, hdr, b := testkit.OpenAIPost(t, sec.HTTP, "", body)
	if _, typ, code := oaiError(t, b); status != 401 || typ != "authentication_error" || code != "unauthenticated" || hdr.Get("WWW-Authenticate") == "" {
		t.Errorf("no token: HTTP %d %v %s; want 401 authentication_error with WWW-Authenticate", status, hdr, b)
	}
	if status, _, b := testkit.OpenAIPost(t, sec.HTTP, "not-a-token", body); status != 401 {
		t.Errorf("bad token: HTTP %d %s; want 401", status, b)
	}
	reader := testkit.Token(t, auth.Claims{Subject: "r", Roles: []string{"reader"}}, time.Hour)
	status, _, b = testkit.OpenAIPost(t, sec.HTTP, reader, `{"model":"chat/x","messages":[{"role":"user","content":"hi"}]}`)
	if _, typ, code := oaiError(t, b); status != 403 || typ != "permission_error" || code != "permission_denied" {
		t.Errorf("reader's send: HTTP %d %s; want 403 permission_error", status, b)
	}
	writer := testkit.Token(t, auth.Claims{Subject: "w", Roles: []string{"writer"}}, time.Hour)
	// Each transient completion is three calls (create, send, destroy);
	// a burst of 2 at 0.5/s runs out within the first.
	var got429 bool
	for i := 0; i < 3 && !got429; i++ {
		status, hdr, b := testkit.OpenAIPost(t, sec.HTTP, writer, body)
		if status == 429 {
			got429 = true
			_, typ, code := oaiError(t, b)
			t.Logf("rate limited: Retry-After %q, %s", hdr.Get("Retry-After"), b)
			if typ != "rate_limit_error" || code != "overloaded" || hdr.Get("Retry-After") == "" || hdr.Get("Retry-After") == "0" {
				t.Errorf("rate limited: HTTP 429 %v %s; want rate_limit_error overloaded with Retry-After ≥ 1", hdr, b)
			}
		}
	}
	if !got429 {
		t.Error("no 429 past the token's rate")
	}
}

// TestOpenAIDisconnectCancels: a client that goes away in the middle of a
// streamed answer cancels the turn: the surface calls chat.cancel with
// the send's request id, the agent records the answer as aborted and is
// free again, the send ends CANCELLED, and no call of the surface is left
// in flight (the event follower stopped). A transient agent is destroyed.
func TestOpenAIDisconnectCancels(t *testing.T) {
	var hb *hub.Hub
	metrics := telemetry.NewMetrics(telemetry.NewLabeler(func(m string) bool { return hb.KnownMethod(m) }))
	m := testkit.StartNexus3(t, &hb, hub.WithTelemetry(telemetry.New(nil, metrics)))
	c := m.Client(t)
	if err := c.Call(t.Context(), "chat.create", map[string]any{"agent_id": "essayist"}, nil); err != nil {
		t.Fatalf("%v (cause: %v)", err, errors.Unwrap(err))
	}
	count := func(method, status string) uint64 {
		return testkit.HistCount(t, metrics, "rpc_server_call_duration_seconds", map[string]string{"rpc_method": method, "rpc_response_status_code": status})
	}
	for _, model := range []string{"chat/essayist", "agentmesh-chat"} {
		cancelsBefore, cancelledBefore := count("chat.cancel", ""), count("chat.send", "-32006")
		ctx, cancel := context.WithCancel(t.Context())
		body := `{"model":"` + model + `","stream":true,"messages":[{"role":"user","content":"Write a long essay"}]}`
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, m.HTTP+"/v1/chat/completions", strings.NewReader(body))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		first := ""
		sc := bufio.NewScanner(res.Body)
		for first == "" && sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				var ch sseChunk
				if json.Unmarshal([]byte(data), &ch) == nil && len(ch.Choices) == 1 {
					first = ch.Choices[0].Delta.Content
				}
			}
		}
		if first != "Once upon a time" {
			t.Fatalf("%s: first content delta %q; want the essay's start", model, first)
		}
		start := time.Now()
		cancel() // the client goes away mid-stream
		res.Body.Close()
		var freed time.Duration
		meshtest.WaitFor(t, 10*time.Second, func() bool {
			return count("chat.cancel", "") > cancelsBefore && count("chat.send", "-32006") > cancelledBefore &&
				testkit.GaugeValue(t, metrics, "agentmesh_rpc_inflight_requests", map[string]string{"side": "server"}) == 0
		})
		freed = time.Since(start)
		t.Logf("%s: disconnected; chat.cancel +%d, chat.send CANCELLED +%d, no call in flight after %v", model,
			count("chat.cancel", "")-cancelsBefore, count("chat.send", "-32006")-cancelledBefore, freed)
		if model == "agentmesh-chat" {
			meshtest.WaitFor(t, 5*time.Second, func() bool { return len(chatAgents(t, c)) == 1 })
			continue
		}
		var ctxInfo struct {
			Busy bool `json:"busy"`
		}
		if err := c.Call(t.Context(), "chat.get_context", map[string]any{"agentId": "essayist"}, &ctxInfo); err != nil || ctxInfo.Busy {
			t.Errorf("essayist after the disconnect: busy %v, %v; want free", ctxInfo.Busy, err)
		}
		var page struct {
			Messages []struct {
				Role       string `json:"role"`
				StopReason string `json:"stopReason"`
			} `json:"messages"`
		}
		if err := c.Call(t.Context(), "chat.getAgentMessages", map[string]any{"agentId": "essayist"}, &page); err != nil || len(page.Messages) != 2 ||
			page.Messages[1].StopReason != "aborted" {
			t.Errorf("essayist's history %+v, %v; want the user's message and an aborted answer", page.Messages, err)
		}
	}
	// Not streamed: the same, the client leaving while the turn runs.
	cancelsBefore, cancelledBefore := count("chat.cancel", ""), count("chat.send", "-32006")
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, m.HTTP+"/v1/chat/completions",
			strings.NewReader(`{"model":"chat/essayist","messages":[{"role":"user","content":"Write a long essay"}]}`))
		res, err := http.DefaultClient.Do(req)
		if err == nil {
			res.Body.Close()
		}
		errc <- err
	}()
	busy := func() bool {
		var ci struct {
			Busy bool `json:"busy"`
		}
		_ = c.Call(t.Context(), "chat.get_context", map[string]any{"agentId": "essayist"}, &ci)
		return ci.Busy
	}
	meshtest.WaitFor(t, 10*time.Second, busy)
	start := time.Now()
	cancel()
	if err := <-errc; err == nil {
		t.Error("the cancelled request got an answer")
	}
	meshtest.WaitFor(t, 10*time.Second, func() bool {
		return count("chat.cancel", "") > cancelsBefore && count("chat.send", "-32006") > cancelledBefore && !busy() &&
			testkit.GaugeValue(t, metrics, "agentmesh_rpc_inflight_requests", map[string]string{"side": "server"}) == 0
	})
	t.Logf("not streamed: disconnected; turn cancelled and nothing in flight after %v", time.Since(start))
	if a := chatAgents(t, c); fmt.Sprint(a) != "[essayist]" {
		t.Errorf("chat agents %v; want only essayist (the transient one destroyed)", a)
	}
}

// FuzzDecodeOpenAIRequest: the request decoder never panics, and what it
// accepts has a model, messages of known roles and a user's last message;
// what it refuses is a coded 400.
func FuzzDecodeOpenAIRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"agentmesh-chat","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"chat/a","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"x"}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":null}],"n":1,"tools":[]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]}`,
		`{"model":1}`, `[]`, `null`, `{"messages":{}}`, "",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := openai.DecodeRequest(data, envelope.DefaultLimits())
		if err != nil {
			if req != nil || (err.Code != envelope.CodeInvalidRequest && err.Code != envelope.CodeInvalidParams) || err.Code.HTTPStatus() != 400 {
				t.Fatalf("refusal %v with request %v; want a 400 code and no request", err, req)
			}
			return
		}
		if req.Model == "" || len(req.Messages) == 0 || req.Messages[len(req.Messages)-1].Role != "user" {
			t.Fatalf("accepted %q as %+v", data, req)
		}
		for _, m := range req.Messages {
			switch m.Role {
			case "system", "developer", "user", "assistant", "tool":
			default:
				t.Fatalf("accepted role %q", m.Role)
			}
		}
	})
}
