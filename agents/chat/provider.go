package chat

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Request is one completion request: the system prompt, the context's
// messages and the tools the model may call.
type Request struct {
	System   string
	Messages []Message
	Tools    []ToolSpec
}

// Provider produces an assistant message for a Request.
//
// Stream calls update with the full accumulated content after each chunk
// (never a delta; update must not keep the slice) and returns the final
// message: content, stopReason (tool_use when it holds toolCall blocks),
// usage, model and provider. It returns an error, and no message, when
// ctx ends or the provider fails; the runtime keeps the content of the
// last update as the partial answer.
type Provider interface {
	Name() string
	Stream(ctx context.Context, req *Request, update func(Content)) (*Message, error)
}

// RequestModeler is a Provider that names the model it asks for before
// its answer says which model answered: the model calls' spans and
// metrics carry it as gen_ai.request.model (else the answering model's).
type RequestModeler interface {
	RequestModel() string
}

// requestModel is p's request model, or "" when p does not say it.
func requestModel(p Provider) string {
	if m, ok := p.(RequestModeler); ok {
		return m.RequestModel()
	}
	return ""
}

// EstimateTokens estimates the tokens of s (about 4 bytes a token).
func EstimateTokens(s string) int { return (len(s) + 3) / 4 }

// messageTokens estimates the tokens of one message.
func messageTokens(m *Message) int {
	n := 4 // role and framing
	for _, b := range m.Content {
		switch b.Type {
		case BlockText:
			n += EstimateTokens(b.Text)
		case BlockThinking:
			n += EstimateTokens(b.Thinking)
		case BlockToolCall:
			n += EstimateTokens(b.Name) + EstimateTokens(string(b.Arguments))
		case BlockImage:
			n += 85
		}
	}
	return n
}

func toolTokens(specs []ToolSpec) int {
	if len(specs) == 0 {
		return 0
	}
	b, _ := json.Marshal(specs)
	return EstimateTokens(string(b))
}

// Scripted is the offline provider: deterministic, no network. It answers
// the last message of the context:
//
//   - after a toolResult: "Tool NAME returned: RESULT"
//   - "/call METHOD [PARAMS_JSON]": a mesh_call tool call
//   - "/tool NAME [ARGS_JSON]": a call to tool NAME
//   - "/think TEXT": a thinking block, then the answer to TEXT
//   - "/long N": N words, "word1 word2 …" (for watching a stream, or cancelling one)
//   - anything else: `You said: "TEXT" (N messages in context)`
//
// It streams its text in chunks of ChunkSize runes (default 8), one every
// Delay (default 0).
type Scripted struct {
	ChunkSize int
	Delay     time.Duration
	Model     string // default "scripted-1"
	// Reply, if set, is asked first: when it returns ok, its text is the
	// answer (streamed like any other), else the rules above apply. It
	// scripts the provider for a demo or a test (e.g. a protocol's
	// documented example conversation).
	Reply func(req *Request) (text string, ok bool)
}

// Name implements Provider.
func (s *Scripted) Name() string { return "scripted" }

// RequestModel implements RequestModeler.
func (s *Scripted) RequestModel() string {
	if s.Model == "" {
		return "scripted-1"
	}
	return s.Model
}

// Stream implements Provider.
func (s *Scripted) Stream(ctx context.Context, req *Request, update func(Content)) (*Message, error) {
	chunk := s.ChunkSize
	if chunk <= 0 {
		chunk = 8
	}
	model := s.RequestModel()
	var thinking, text string
	var calls []ContentBlock
	scripted := false
	if s.Reply != nil {
		text, scripted = s.Reply(req)
	}
	if len(req.Messages) > 0 && !scripted {
		last := req.Messages[len(req.Messages)-1]
		in := strings.TrimSpace(TextOf(last.Content))
		switch {
		case last.Role == RoleToolResult:
			text = fmt.Sprintf("Tool %s returned: %s", last.ToolName, in)
		case strings.HasPrefix(in, "/call "):
			method, params, _ := strings.Cut(strings.TrimSpace(strings.TrimPrefix(in, "/call ")), " ")
			args := map[string]any{"method": method}
			if p := strings.TrimSpace(params); p != "" {
				if !json.Valid([]byte(p)) {
					text = "The params of /call must be JSON."
					break
				}
				args["params"] = json.RawMessage(p)
			}
			raw, _ := json.Marshal(args)
			text = "Calling " + method + "."
			calls = append(calls, ContentBlock{Type: BlockToolCall, ID: toolCallID(req), Name: MeshCallToolName, Arguments: raw})
		case strings.HasPrefix(in, "/tool "):
			name, args, _ := strings.Cut(strings.TrimSpace(strings.TrimPrefix(in, "/tool ")), " ")
			args = strings.TrimSpace(args)
			if args == "" {
				args = "{}"
			}
			if !json.Valid([]byte(args)) || !strings.HasPrefix(args, "{") {
				text = "The arguments of /tool must be a JSON object."
				break
			}
			text = "Using " + name + "."
			calls = append(calls, ContentBlock{Type: BlockToolCall, ID: toolCallID(req), Name: name, Arguments: json.RawMessage(args)})
		case strings.HasPrefix(in, "/long "):
			n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(in, "/long ")))
			if err != nil || n < 1 || n > 100000 {
				text = "/long wants a count of words within 1..100000."
				break
			}
			var b strings.Builder
			for i := 1; i <= n; i++ {
				if i > 1 {
					b.WriteByte(' ')
				}
				fmt.Fprintf(&b, "word%d", i)
			}
			text = b.String()
		case strings.HasPrefix(in, "/think "):
			q := strings.TrimSpace(strings.TrimPrefix(in, "/think "))
			thinking = "The user asks: " + q
			text = fmt.Sprintf("You said: %q (%d messages in context)", q, len(req.Messages))
		default:
			text = fmt.Sprintf("You said: %q (%d messages in context)", in, len(req.Messages))
		}
	}
	var content Content
	if thinking != "" {
		content = append(content, ContentBlock{Type: BlockThinking})
	}
	content = append(content, Text(""))
	ti := len(content) - 1
	emit := func() error {
		if err := ctx.Err(); err != nil {
			return err
		}
		update(content)
		if s.Delay > 0 {
			t := time.NewTimer(s.Delay)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	for _, part := range chunks(thinking, chunk) {
		content[0].Thinking += part
		if err := emit(); err != nil {
			return nil, err
		}
	}
	for _, part := range chunks(text, chunk) {
		content[ti].Text += part
		if err := emit(); err != nil {
			return nil, err
		}
	}
	stop := StopEndTurn
	if len(calls) > 0 {
		content = append(content, calls...)
		if err := emit(); err != nil {
			return nil, err
		}
		stop = StopToolUse
	}
	in := 0
	for i := range req.Messages {
		in += messageTokens(&req.Messages[i])
	}
	out := EstimateTokens(thinking) + EstimateTokens(text)
	return &Message{
		Role: RoleAssistant, Content: content, Model: model, Provider: s.Name(), StopReason: stop,
		Usage: &Usage{Input: in, Output: out, TotalTokens: in + out}, Timestamp: nowMs(),
	}, nil
}

// toolCallID is a deterministic id for the scripted provider's calls.
func toolCallID(req *Request) string { return fmt.Sprintf("call_%d", len(req.Messages)) }

// chunks splits s in pieces of n runes.
func chunks(s string, n int) []string {
	var out []string
	for len(s) > 0 {
		i, k := 0, 0
		for i < len(s) && k < n {
			_, sz := utf8.DecodeRuneInString(s[i:])
			i += sz
			k++
		}
		out = append(out, s[:i])
		s = s[i:]
	}
	return out
}
