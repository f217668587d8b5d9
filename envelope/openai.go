package envelope

import (
	"encoding/json"
	"strconv"
	"strings"
)

// OpenAIRequest is the part of an OpenAI chat-completions request body the
// mesh's OpenAI surface reads. Members it does not know (temperature,
// max_tokens, user…) are ignored: the chat agent's provider settings
// apply.
type OpenAIRequest struct {
	Model         string               `json:"model"`
	Messages      []OpenAIMessage      `json:"messages"`
	Stream        bool                 `json:"stream"`
	StreamOptions *OpenAIStreamOptions `json:"stream_options"`
	N             *int                 `json:"n"`
	Tools         json.RawMessage      `json:"tools"`
}

// OpenAIStreamOptions is a request's stream_options.
type OpenAIStreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// OpenAIMessage is one message of a request; Text is its content's text
// (a string, or the text parts of an array), filled by DecodeOpenAIRequest.
type OpenAIMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	Text    string          `json:"-"`
}

// DecodeOpenAIRequest decodes and checks a chat-completions request body
// within lim, in one pass: a model, at least one message, the last one the
// user's, only text content, n 1 at most, no tools (the chat agent runs
// its own). Keys are matched exactly, and null reads as absent, as OpenAI
// reads them.
//
// Refusals are INVALID_REQUEST (over a limit, not JSON, not UTF-8, not a
// JSON object, a key given twice in an object it reads: the body is
// refused as a whole, as OpenAI answers a body it cannot parse) or
// INVALID_PARAMS (a member of the wrong type or value).
func DecodeOpenAIRequest(data []byte, lim Limits) (*OpenAIRequest, *Error) {
	if err := lim.check(data); err != nil {
		if err.Code == CodeParseError {
			err.Code = CodeInvalidRequest
		}
		return nil, err
	}
	if kindOf(trimValue(data)) != '{' {
		return nil, NewError(CodeInvalidRequest, "the body is not a JSON object")
	}
	var req OpenAIRequest
	var messages, n, tools []byte
	err := eachMember(data, func(key string, v []byte) *Error {
		var e *Error
		switch key {
		case "model":
			req.Model, e = openAIString("model", v)
		case "messages":
			messages = v
		case "stream":
			req.Stream, e = openAIBool("stream", v)
		case "stream_options":
			switch kindOf(v) {
			case 'n':
			case '{':
				req.StreamOptions = &OpenAIStreamOptions{}
				e = eachMember(v, func(key string, v []byte) *Error {
					var e *Error
					if key == "include_usage" {
						req.StreamOptions.IncludeUsage, e = openAIBool("stream_options.include_usage", v)
					}
					return e
				})
			default:
				e = NewError(CodeInvalidParams, "stream_options must be an object")
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
		return nil, NewError(CodeInvalidParams, "you must provide a model parameter")
	}
	switch kindOf(messages) {
	case 0, 'n':
	case '[':
		var merr *Error
		eachElement(messages, func(v []byte) {
			if merr != nil {
				return
			}
			var m OpenAIMessage
			m, merr = decodeOpenAIMessage(len(req.Messages), v)
			req.Messages = append(req.Messages, m)
		})
		if merr != nil {
			return nil, merr
		}
	default:
		return nil, NewError(CodeInvalidParams, "messages must be an array")
	}
	if len(req.Messages) == 0 {
		return nil, NewError(CodeInvalidParams, "messages must hold at least one message")
	}
	if kindOf(n) != 0 && kindOf(n) != 'n' {
		v, err := intField("n", n, 1, 1)
		if err != nil || v != 1 {
			return nil, NewError(CodeInvalidParams, "n must be 1: a chat agent gives one answer")
		}
		one := 1
		req.N = &one
	}
	switch kindOf(tools) {
	case 0, 'n':
	case '[':
		if i := skipSpace(tools, 1); tools[i] != ']' {
			return nil, NewError(CodeInvalidParams, "tools are not supported: the chat agent runs its own tools")
		}
		req.Tools = tools
	default:
		return nil, NewError(CodeInvalidParams, "tools are not supported: the chat agent runs its own tools")
	}
	if last := req.Messages[len(req.Messages)-1]; last.Role != "user" {
		return nil, Errorf(CodeInvalidParams, "the last message must be the user's, not %q", last.Role)
	}
	return &req, nil
}

// decodeOpenAIMessage decodes messages[i]: {role, content}.
func decodeOpenAIMessage(i int, v []byte) (OpenAIMessage, *Error) {
	var m OpenAIMessage
	at := func(field string) string { return "messages[" + strconv.Itoa(i) + "]." + field }
	if kindOf(v) != '{' {
		return m, Errorf(CodeInvalidParams, "messages[%d] must be an object", i)
	}
	err := eachMember(v, func(key string, v []byte) *Error {
		var e *Error
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
		return m, Errorf(CodeInvalidParams, "%s: %q is not one of system, developer, user, assistant, tool", at("role"), m.Role)
	}
	text, err := openAIText(m.Content)
	if err != nil {
		return m, Errorf(err.Code, "%s: %s", at("content"), err.Message)
	}
	m.Text = text
	return m, nil
}

// openAIText is the text of a message's content: a string, null, or an
// array of {type:"text", text} parts.
func openAIText(v []byte) (string, *Error) {
	switch kindOf(v) {
	case 0, 'n':
		return "", nil
	case '"':
		s, ok := unquote(v)
		if !ok {
			return "", NewError(CodeInvalidParams, "not a string")
		}
		return s, nil
	case '[':
		var b strings.Builder
		var err *Error
		eachElement(v, func(p []byte) {
			if err != nil {
				return
			}
			if kindOf(p) != '{' {
				err = NewError(CodeInvalidParams, "not an array of content parts")
				return
			}
			var typ string
			var text []byte
			if err = eachMember(p, func(key string, v []byte) *Error {
				var e *Error
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
			if typ != "text" || kindOf(text) != '"' {
				if typ == "text" && kindOf(text) != 0 && kindOf(text) != 'n' {
					err = NewError(CodeInvalidParams, "a text part's text must be a string")
					return
				}
				err = Errorf(CodeInvalidParams, "content part of type %q: only text is supported", typ)
				return
			}
			s, ok := unquote(text)
			if !ok {
				err = NewError(CodeInvalidParams, "a text part's text must be a string")
				return
			}
			b.WriteString(s)
		})
		if err != nil {
			return "", err
		}
		return b.String(), nil
	}
	return "", NewError(CodeInvalidParams, "want a string or an array of content parts")
}

// openAIString reads a string member; null is "".
func openAIString(name string, v []byte) (string, *Error) {
	switch kindOf(v) {
	case 'n':
		return "", nil
	case '"':
		if s, ok := internToken(v); ok {
			return s, nil
		}
	}
	return "", Errorf(CodeInvalidParams, "%s must be a string", name)
}

// openAIBool reads a boolean member; null is false.
func openAIBool(name string, v []byte) (bool, *Error) {
	switch kindOf(v) {
	case 'n', 'f':
		return false, nil
	case 't':
		return true, nil
	}
	return false, Errorf(CodeInvalidParams, "%s must be a boolean", name)
}
