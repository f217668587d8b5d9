package openai

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/agentmesh/agentmesh/envelope"
)

// Request is the part of an OpenAI chat-completions request body the
// mesh's OpenAI surface reads. Members it does not know (temperature,
// max_tokens, user…) are ignored: the chat agent's provider settings
// apply.
type Request struct {
	Model         string          `json:"model"`
	Messages      []Message       `json:"messages"`
	Stream        bool            `json:"stream"`
	StreamOptions *StreamOptions  `json:"stream_options"`
	N             *int            `json:"n"`
	Tools         json.RawMessage `json:"tools"`
}

// StreamOptions is a request's stream_options.
type StreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// Message is one message of a request; Text is its content's text
// (a string, or the text parts of an array), filled by DecodeRequest.
type Message struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	Text    string          `json:"-"`
}

// DecodeRequest decodes and checks a chat-completions request body
// within lim, in one pass: a model, at least one message, the last one the
// user's, only text content, n 1 at most, no tools (the chat agent runs
// its own). Keys are matched exactly, and null reads as absent, as OpenAI
// reads them.
//
// Refusals are INVALID_REQUEST (over a limit, not JSON, not UTF-8, not a
// JSON object, a key given twice in an object it reads: the body is
// refused as a whole, as OpenAI answers a body it cannot parse) or
// INVALID_PARAMS (a member of the wrong type or value).
func DecodeRequest(data []byte, lim envelope.Limits) (*Request, *envelope.Error) {
	if err := lim.Check(data); err != nil {
		if err.Code == envelope.CodeParseError {
			err.Code = envelope.CodeInvalidRequest
		}
		return nil, err
	}
	if envelope.KindOf(envelope.TrimValue(data)) != '{' {
		return nil, envelope.NewError(envelope.CodeInvalidRequest, "the body is not a JSON object")
	}
	var req Request
	var messages, n, tools []byte
	err := members(data, func(key string, v []byte) *envelope.Error {
		var e *envelope.Error
		switch key {
		case "model":
			req.Model, e = openAIString("model", v)
		case "messages":
			messages = v
		case "stream":
			req.Stream, e = openAIBool("stream", v)
		case "stream_options":
			switch envelope.KindOf(v) {
			case 'n':
			case '{':
				req.StreamOptions = &StreamOptions{}
				e = members(v, func(key string, v []byte) *envelope.Error {
					var e *envelope.Error
					if key == "include_usage" {
						req.StreamOptions.IncludeUsage, e = openAIBool("stream_options.include_usage", v)
					}
					return e
				})
			default:
				e = envelope.NewError(envelope.CodeInvalidParams, "stream_options must be an object")
			}
		case "n":
			n = v
		case "tools":
			tools = v
		}
		return e
	})
	if err != nil {
		return nil, err
	}
	if req.Model == "" {
		return nil, envelope.NewError(envelope.CodeInvalidParams, "you must provide a model parameter")
	}
	switch envelope.KindOf(messages) {
	case 0, 'n':
	case '[':
		var merr *envelope.Error
		envelope.EachElement(messages, func(v []byte) {
			if merr != nil {
				return
			}
			var m Message
			m, merr = decodeMessage(len(req.Messages), v)
			req.Messages = append(req.Messages, m)
		})
		if merr != nil {
			return nil, merr
		}
	default:
		return nil, envelope.NewError(envelope.CodeInvalidParams, "messages must be an array")
	}
	if len(req.Messages) == 0 {
		return nil, envelope.NewError(envelope.CodeInvalidParams, "messages must hold at least one message")
	}
	if envelope.KindOf(n) != 0 && envelope.KindOf(n) != 'n' {
		v, err := envelope.IntField("n", n, 1, 1)
		if err != nil || v != 1 {
			return nil, envelope.NewError(envelope.CodeInvalidParams, "n must be 1: a chat agent gives one answer")
		}
		one := 1
		req.N = &one
	}
	switch envelope.KindOf(tools) {
	case 0, 'n':
	case '[':
		if i := envelope.SkipSpace(tools, 1); tools[i] != ']' {
			return nil, envelope.NewError(envelope.CodeInvalidParams, "tools are not supported: the chat agent runs its own tools")
		}
		req.Tools = tools
	default:
		return nil, envelope.NewError(envelope.CodeInvalidParams, "tools are not supported: the chat agent runs its own tools")
	}
	if last := req.Messages[len(req.Messages)-1]; last.Role != "user" {
		return nil, envelope.Errorf(envelope.CodeInvalidParams, "the last message must be the user's, not %q", last.Role)
	}
	return &req, nil
}

// decodeMessage decodes messages[i]: {role, content}.
func decodeMessage(i int, v []byte) (Message, *envelope.Error) {
	var m Message
	at := func(field string) string { return "messages[" + strconv.Itoa(i) + "]." + field }
	if envelope.KindOf(v) != '{' {
		return m, envelope.Errorf(envelope.CodeInvalidParams, "messages[%d] must be an object", i)
	}
	err := members(v, func(key string, v []byte) *envelope.Error {
		var e *envelope.Error
		switch key {
		case "role":
			m.Role, e = openAIString(at("role"), v)
		case "content":
			m.Content = v
		}
		return e
	})
	if err != nil {
		return m, err
	}
	switch m.Role {
	case "system", "developer", "user", "assistant", "tool":
	default:
		return m, envelope.Errorf(envelope.CodeInvalidParams, "%s: %q is not one of system, developer, user, assistant, tool", at("role"), m.Role)
	}
	text, err := openAIText(m.Content)
	if err != nil {
		return m, envelope.Errorf(err.Code, "%s: %s", at("content"), err.Message)
	}
	m.Text = text
	return m, nil
}

// openAIText is the text of a message's content: a string, null, or an
// array of {type:"text", text} parts.
func openAIText(v []byte) (string, *envelope.Error) {
	switch envelope.KindOf(v) {
	case 0, 'n':
		return "", nil
	case '"':
		s, ok := envelope.Unquote(v)
		if !ok {
			return "", envelope.NewError(envelope.CodeInvalidParams, "not a string")
		}
		return s, nil
	case '[':
		var b strings.Builder
		var err *envelope.Error
		envelope.EachElement(v, func(p []byte) {
			if err != nil {
				return
			}
			if envelope.KindOf(p) != '{' {
				err = envelope.NewError(envelope.CodeInvalidParams, "not an array of content parts")
				return
			}
			var typ string
			var text []byte
			if err = members(p, func(key string, v []byte) *envelope.Error {
				var e *envelope.Error
				switch key {
				case "type":
					typ, e = openAIString("type", v)
				case "text":
					text = v
				}
				return e
			}); err != nil {
				return
			}
			if typ != "text" || envelope.KindOf(text) != '"' {
				if typ == "text" && envelope.KindOf(text) != 0 && envelope.KindOf(text) != 'n' {
					err = envelope.NewError(envelope.CodeInvalidParams, "a text part's text must be a string")
					return
				}
				err = envelope.Errorf(envelope.CodeInvalidParams, "content part of type %q: only text is supported", typ)
				return
			}
			s, ok := envelope.Unquote(text)
			if !ok {
				err = envelope.NewError(envelope.CodeInvalidParams, "a text part's text must be a string")
				return
			}
			b.WriteString(s)
		})
		if err != nil {
			return "", err
		}
		return b.String(), nil
	}
	return "", envelope.NewError(envelope.CodeInvalidParams, "want a string or an array of content parts")
}

// openAIString reads a string member; null is "".
func openAIString(name string, v []byte) (string, *envelope.Error) {
	switch envelope.KindOf(v) {
	case 'n':
		return "", nil
	case '"':
		if s, ok := envelope.InternToken(v); ok {
			return s, nil
		}
	}
	return "", envelope.Errorf(envelope.CodeInvalidParams, "%s must be a string", name)
}

// openAIBool reads a boolean member; null is false.
func openAIBool(name string, v []byte) (bool, *envelope.Error) {
	switch envelope.KindOf(v) {
	case 'n', 'f':
		return false, nil
	case 't':
		return true, nil
	}
	return false, envelope.Errorf(envelope.CodeInvalidParams, "%s must be a boolean", name)
}

// members is envelope.EachMember walking the whole object before it
// answers a member fn refused: a key given twice anywhere in the object
// refuses the body as a whole (INVALID_REQUEST), whatever member before it
// had the wrong type.
func members(obj []byte, fn func(key string, v []byte) *envelope.Error) *envelope.Error {
	var first *envelope.Error
	if err := envelope.EachMember(obj, func(key string, v []byte) *envelope.Error {
		if first == nil {
			first = fn(key, v)
		}
		return nil
	}); err != nil {
		return err
	}
	return first
}
