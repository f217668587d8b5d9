package chat

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
)

// OpenAIConfig configures the OpenAI-compatible provider.
type OpenAIConfig struct {
	// BaseURL is the API root, e.g. https://api.openai.com/v1 or
	// http://127.0.0.1:11434/v1. Default $OPENAI_BASE_URL, else
	// https://api.openai.com/v1.
	BaseURL string
	// APIKey is sent as a bearer token. Default $OPENAI_API_KEY (none is
	// sent when empty: local servers rarely need one).
	APIKey string
	// Model is required. Default $OPENAI_MODEL.
	Model string
	// MaxTokens bounds the answer (0: the server's default).
	MaxTokens int
	// HTTPClient defaults to a client without timeout (ctx bounds calls).
	HTTPClient *http.Client
	// IdleTimeout fails a stream silent for that long (default 60 s).
	IdleTimeout time.Duration
}

// OpenAI is a Provider for any server speaking the chat-completions API
// with streaming (server-sent events): OpenAI, vLLM, llama.cpp, Ollama…
type OpenAI struct{ cfg OpenAIConfig }

// NewOpenAI returns the provider; it fails without a model.
func NewOpenAI(cfg OpenAIConfig) (*OpenAI, error) {
	if cfg.BaseURL == "" {
		cfg.BaseURL = os.Getenv("OPENAI_BASE_URL")
	}
	if cfg.BaseURL == "" {
		cfg.BaseURL = "https://api.openai.com/v1"
	}
	cfg.BaseURL = strings.TrimSuffix(cfg.BaseURL, "/")
	if cfg.APIKey == "" {
		cfg.APIKey = os.Getenv("OPENAI_API_KEY")
	}
	if cfg.Model == "" {
		cfg.Model = os.Getenv("OPENAI_MODEL")
	}
	if cfg.Model == "" {
		return nil, errors.New("chat: the openai provider needs a model (--model or $OPENAI_MODEL)")
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{}
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 60 * time.Second
	}
	return &OpenAI{cfg: cfg}, nil
}

// Name implements Provider.
func (o *OpenAI) Name() string { return "openai" }

// RequestModel implements RequestModeler: the configured model.
func (o *OpenAI) RequestModel() string { return o.cfg.Model }

type oaMessage struct {
	Role       string       `json:"role"`
	Content    any          `json:"content"` // string, []oaPart or nil
	ToolCalls  []oaToolCall `json:"tool_calls,omitempty"`
	ToolCallID string       `json:"tool_call_id,omitempty"`
}

type oaPart struct {
	Type     string `json:"type"`
	Text     string `json:"text,omitempty"`
	ImageURL *struct {
		URL string `json:"url"`
	} `json:"image_url,omitempty"`
}

type oaToolCall struct {
	Index    *int   `json:"index,omitempty"`
	ID       string `json:"id,omitempty"`
	Type     string `json:"type,omitempty"`
	Function struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type oaTool struct {
	Type     string   `json:"type"`
	Function ToolSpec `json:"function"`
}

// toOpenAI converts the context to chat-completions messages. Tool calls
// without a result (a cancelled turn's) are left out, as the API refuses
// them; thinking blocks are not sent back.
func toOpenAI(req *Request) []oaMessage {
	answered := map[string]bool{}
	for _, m := range req.Messages {
		if m.Role == RoleToolResult {
			answered[m.ToolCallID] = true
		}
	}
	var out []oaMessage
	if req.System != "" {
		out = append(out, oaMessage{Role: "system", Content: req.System})
	}
	for _, m := range req.Messages {
		switch m.Role {
		case RoleUser:
			var parts []oaPart
			images := false
			for _, b := range m.Content {
				switch b.Type {
				case BlockText:
					parts = append(parts, oaPart{Type: "text", Text: b.Text})
				case BlockImage:
					p := oaPart{Type: "image_url", ImageURL: &struct {
						URL string `json:"url"`
					}{"data:" + b.Source.MediaType + ";base64," + b.Source.Data}}
					parts = append(parts, p)
					images = true
				}
			}
			if images {
				out = append(out, oaMessage{Role: "user", Content: parts})
			} else {
				out = append(out, oaMessage{Role: "user", Content: TextOf(m.Content)})
			}
		case RoleAssistant:
			om := oaMessage{Role: "assistant"}
			for _, c := range ToolCalls(m.Content) {
				if !answered[c.ID] {
					continue
				}
				tc := oaToolCall{ID: c.ID, Type: "function"}
				tc.Function.Name, tc.Function.Arguments = c.Name, string(c.Arguments)
				om.ToolCalls = append(om.ToolCalls, tc)
			}
			if t := TextOf(m.Content); t != "" {
				om.Content = t
			}
			if om.Content == nil && len(om.ToolCalls) == 0 {
				continue // an aborted answer with nothing in it
			}
			out = append(out, om)
		case RoleToolResult:
			out = append(out, oaMessage{Role: "tool", ToolCallID: m.ToolCallID, Content: TextOf(m.Content)})
		}
	}
	return out
}

type oaChunk struct {
	Model   string `json:"model"`
	Choices []struct {
		Delta struct {
			Content          string       `json:"content"`
			ReasoningContent string       `json:"reasoning_content"`
			ToolCalls        []oaToolCall `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
		Type    string `json:"type"`
	} `json:"error"`
}

// httpCode maps an upstream HTTP status to a mesh code.
func httpCode(status int) envelope.Code {
	switch {
	case status == http.StatusTooManyRequests:
		return envelope.CodeOverloaded
	case status == http.StatusRequestTimeout || status == http.StatusGatewayTimeout:
		return envelope.CodeTimeout
	case status >= 500:
		return envelope.CodeUnavailable
	}
	return envelope.CodeRPCError
}

// Stream implements Provider: one POST {base}/chat/completions with
// stream true, read as server-sent events until data: [DONE].
func (o *OpenAI) Stream(pctx context.Context, req *Request, update func(Content)) (*Message, error) {
	body := map[string]any{
		"model": o.cfg.Model, "messages": toOpenAI(req), "stream": true,
		"stream_options": map[string]bool{"include_usage": true},
	}
	if len(req.Tools) > 0 {
		tools := make([]oaTool, len(req.Tools))
		for i, t := range req.Tools {
			tools[i] = oaTool{Type: "function", Function: t}
		}
		body["tools"] = tools
	}
	if o.cfg.MaxTokens > 0 {
		body["max_tokens"] = o.cfg.MaxTokens
	}
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(pctx)
	defer cancel()
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, o.cfg.BaseURL+"/chat/completions", bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "text/event-stream")
	if o.cfg.APIKey != "" {
		hreq.Header.Set("Authorization", "Bearer "+o.cfg.APIKey)
	}
	res, err := o.cfg.HTTPClient.Do(hreq)
	if err != nil {
		if pctx.Err() != nil {
			return nil, pctx.Err()
		}
		return nil, envelope.Errorf(envelope.CodeUnavailable, "provider unreachable: %v", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
		msg := strings.TrimSpace(string(b))
		var e oaChunk
		if json.Unmarshal(b, &e) == nil && e.Error != nil {
			msg = e.Error.Message
		}
		return nil, envelope.Errorf(httpCode(res.StatusCode), "provider answered %d: %s", res.StatusCode, msg)
	}

	// The idle timer cancels a stream that goes silent.
	idle := time.AfterFunc(o.cfg.IdleTimeout, cancel)
	defer idle.Stop()

	var (
		thinking, text strings.Builder
		calls          = map[int]*oaToolCall{}
		finish         string
		model          = o.cfg.Model
		usage          *Usage
		done           bool
	)
	snapshot := func() Content {
		var c Content
		if thinking.Len() > 0 {
			c = append(c, ContentBlock{Type: BlockThinking, Thinking: thinking.String()})
		}
		if text.Len() > 0 || len(calls) == 0 {
			c = append(c, Text(text.String()))
		}
		idx := make([]int, 0, len(calls))
		for i := range calls {
			idx = append(idx, i)
		}
		sort.Ints(idx)
		for _, i := range idx {
			tc := calls[i]
			args := json.RawMessage(tc.Function.Arguments)
			if !json.Valid(args) || !bytes.HasPrefix(bytes.TrimSpace(args), []byte("{")) {
				args = json.RawMessage("{}") // still streaming, or not an object
			}
			c = append(c, ContentBlock{Type: BlockToolCall, ID: tc.ID, Name: tc.Function.Name, Arguments: args})
		}
		return c
	}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 64<<10), 8<<20)
	for sc.Scan() {
		idle.Reset(o.cfg.IdleTimeout)
		line := sc.Text()
		if !strings.HasPrefix(line, "data:") {
			continue // comments, event: and id: lines, blank separators
		}
		data := strings.TrimSpace(strings.TrimPrefix(line, "data:"))
		if data == "[DONE]" {
			done = true
			break
		}
		var ch oaChunk
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			return nil, envelope.Errorf(envelope.CodeRPCError, "provider sent a bad chunk: %v", err)
		}
		if ch.Error != nil {
			return nil, envelope.Errorf(envelope.CodeRPCError, "provider error mid-stream: %s", ch.Error.Message)
		}
		if ch.Model != "" {
			model = ch.Model
		}
		if ch.Usage != nil {
			usage = &Usage{Input: ch.Usage.PromptTokens, Output: ch.Usage.CompletionTokens, TotalTokens: ch.Usage.TotalTokens}
		}
		changed := false
		for _, c := range ch.Choices {
			if c.Delta.ReasoningContent != "" {
				thinking.WriteString(c.Delta.ReasoningContent)
				changed = true
			}
			if c.Delta.Content != "" {
				text.WriteString(c.Delta.Content)
				changed = true
			}
			for _, d := range c.Delta.ToolCalls {
				i := len(calls)
				if d.Index != nil {
					i = *d.Index
				}
				tc := calls[i]
				if tc == nil {
					tc = &oaToolCall{}
					calls[i] = tc
				}
				if d.ID != "" {
					tc.ID = d.ID
				}
				if d.Function.Name != "" {
					tc.Function.Name += d.Function.Name
				}
				tc.Function.Arguments += d.Function.Arguments
				changed = true
			}
			if c.FinishReason != nil && *c.FinishReason != "" {
				finish = *c.FinishReason
			}
		}
		if changed {
			update(snapshot())
		}
	}
	if pctx.Err() != nil {
		return nil, pctx.Err()
	}
	if ctx.Err() != nil {
		return nil, envelope.Errorf(envelope.CodeTimeout, "provider stream silent for %s", o.cfg.IdleTimeout)
	}
	if err := sc.Err(); err != nil {
		return nil, envelope.Errorf(envelope.CodeUnavailable, "provider stream broken: %v", err)
	}
	if !done && finish == "" {
		return nil, envelope.NewError(envelope.CodeUnavailable, "provider stream ended before it finished")
	}
	for i, tc := range calls {
		if tc.ID == "" {
			tc.ID = fmt.Sprintf("call_%d", i)
		}
		if tc.Function.Name == "" {
			return nil, envelope.NewError(envelope.CodeRPCError, "provider sent a tool call without a name")
		}
		args := strings.TrimSpace(tc.Function.Arguments)
		if args != "" && (!json.Valid([]byte(args)) || !strings.HasPrefix(args, "{")) {
			return nil, envelope.Errorf(envelope.CodeRPCError, "provider sent tool call %s with arguments that are not a JSON object", tc.Function.Name)
		}
	}
	content := snapshot()
	stop := StopEndTurn
	switch finish {
	case "tool_calls", "function_call":
		stop = StopToolUse
	case "length":
		stop = StopMaxTokens
	}
	if len(calls) > 0 {
		stop = StopToolUse
	}
	return &Message{Role: RoleAssistant, Content: content, Model: model, Provider: o.Name(), Usage: usage, StopReason: stop, Timestamp: nowMs()}, nil
}
