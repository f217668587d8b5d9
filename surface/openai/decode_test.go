package openai_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/surface/openai"
)

func TestOpenAIRequestStrict(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	for _, tc := range []struct {
		name, data string
		code       envelope.Code
	}{
		{"request", `{"model":"m",` + msgs + `}`, envelope.CodeOK},
		{"duplicate model", `{"model":"m","model":"n",` + msgs + `}`, envelope.CodeInvalidRequest},
		{"duplicate messages", `{"model":"m",` + msgs + `,` + msgs + `}`, envelope.CodeInvalidRequest},
		{"duplicate role", `{"model":"m","messages":[{"role":"user","role":"assistant","content":"hi"}]}`, envelope.CodeInvalidRequest},
		{"duplicate content", `{"model":"m","messages":[{"role":"user","content":"a","content":"b"}]}`, envelope.CodeInvalidRequest},
		{"duplicate text", `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a","text":"b"}]}]}`, envelope.CodeInvalidRequest},
		{"duplicate include_usage", `{"model":"m","stream_options":{"include_usage":true,"include_usage":false},` + msgs + `}`, envelope.CodeInvalidRequest},
		{"duplicate in an unread member: not read", `{"model":"m","metadata":{"a":1,"a":2},` + msgs + `}`, envelope.CodeOK},
		{"keys are exact", `{"Model":"m",` + msgs + `}`, envelope.CodeInvalidParams},
		{"depth at the limit", `{"model":"m","metadata":` + testkit.Nest(7) + `,` + msgs + `}`, envelope.CodeOK},
		{"depth past the limit", `{"model":"m","metadata":` + testkit.Nest(8) + `,` + msgs + `}`, envelope.CodeInvalidRequest},
		{"not JSON", `{"model":`, envelope.CodeInvalidRequest},
		{"invalid UTF-8", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}", envelope.CodeInvalidRequest},
		{"not an object", `[]`, envelope.CodeInvalidRequest},
		{"model a number", `{"model":1,` + msgs + `}`, envelope.CodeInvalidParams},
		{"n 2", `{"model":"m","n":2,` + msgs + `}`, envelope.CodeInvalidParams},
		{"n 1.0", `{"model":"m","n":1.0,` + msgs + `}`, envelope.CodeInvalidParams},
		{"tools", `{"model":"m","tools":[{}],` + msgs + `}`, envelope.CodeInvalidParams},
		{"no tools", `{"model":"m","tools":[ ],"n":1,"stream":null,` + msgs + `}`, envelope.CodeOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := openai.DecodeRequest([]byte(tc.data), testkit.DialectLimits)
			if tc.code == envelope.CodeOK {
				if err != nil || req.Model != "m" || len(req.Messages) != 1 || req.Messages[0].Text != "hi" {
					t.Fatalf("%+v, %v; want accepted", req, err)
				}
				return
			}
			if err == nil || err.Code != tc.code || err.Message == "" || req != nil {
				t.Fatalf("%+v, %v; want %s", req, err, tc.code)
			}
		})
	}
}

// FuzzDecodeRequest: DecodeRequest never panics, refuses with
// INVALID_REQUEST or INVALID_PARAMS (a 400, as OpenAI answers), refuses a
// top-level key given twice, and on every other clean input whose keys
// are each given once (anywhere) and spelt as the fields it reads (the
// encoding/json decoder it replaced folded case) decides as that decoder
// and reads the same request.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"agentmesh-chat","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"chat/a","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"x"}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":null}],"n":1,"tools":[]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]}`,
		`{"model":"m","model":"n","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[null,{"role":"user"}],"n":1e0}`,
		`{"model":"m","n":2,"messages":[{"role":"user","content":null}]}`, `{"model":"m","n":0,"stream":null,"messages":[{"role":"user","content":""}]}`,
		`{"model":1}`, `[]`, `null`, `{"messages":{}}`, "", `{"MODEL":"m","messages":[{"role":"user","content":"hi"}]}`,
	} {
		f.Add([]byte(s))
	}
	fields := []string{"model", "messages", "stream", "stream_options", "include_usage", "n", "tools", "role", "content", "type", "text"}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, err := openai.DecodeRequest(data, testkit.FuzzLimits)
		if err != nil {
			if req != nil || (err.Code != envelope.CodeInvalidRequest && err.Code != envelope.CodeInvalidParams) || err.Code.HTTPStatus() != 400 {
				t.Fatalf("refusal %v with request %v; want a 400 code and no request", err, req)
			}
			if len(data) > testkit.FuzzLimits.MaxBytes || (!json.Valid(data) && !testkit.Deeper(data, testkit.FuzzLimits.MaxDepth)) {
				if err.Code != envelope.CodeInvalidRequest {
					t.Fatalf("%q: %v; want INVALID_REQUEST", data, err)
				}
			}
		} else if req.Model == "" || len(req.Messages) == 0 || req.Messages[len(req.Messages)-1].Role != "user" {
			t.Fatalf("accepted %q as %+v", data, req)
		}
		if !testkit.CleanInput(data) {
			return
		}
		if keys, isObj := testkit.TopKeys(data); isObj && testkit.HasDup(keys) {
			if err == nil || err.Code != envelope.CodeInvalidRequest {
				t.Fatalf("%q: a key given twice: err = %v; want INVALID_REQUEST", data, err)
			}
			return
		}
		if testkit.AnyDup(data, fields...) {
			return
		}
		want, ok := refOpenAIRequest(data)
		if ok != (err == nil) {
			t.Fatalf("%q: err = %v; the reference accepts: %v", data, err, ok)
		}
		if !ok {
			return
		}
		if req.Model != want.Model || req.Stream != want.Stream || (req.StreamOptions == nil) != (want.StreamOptions == nil) ||
			(req.StreamOptions != nil && req.StreamOptions.IncludeUsage != want.StreamOptions.IncludeUsage) ||
			(req.N == nil) != (want.N == nil) || len(req.Messages) != len(want.Messages) {
			t.Fatalf("%q: %+v; the reference read %+v", data, req, want)
		}
		for i, m := range req.Messages {
			w := want.Messages[i]
			if m.Role != w.Role || m.Text != w.Text || !bytes.Equal(m.Content, w.Content) {
				t.Fatalf("%q: message %d %+v; the reference read %+v", data, i, m, w)
			}
		}
	})
}

// refOpenAIRequest is the encoding/json decoder of chat-completions
// bodies that DecodeOpenAIRequest replaced, for clean input; with one
// deliberate change: tools is compared compacted ("[ ]" is no tools).
func refOpenAIRequest(data []byte) (openai.Request, bool) {
	var req openai.Request
	if json.Unmarshal(data, &req) != nil {
		return req, false
	}
	if req.Model == "" || len(req.Messages) == 0 || (req.N != nil && *req.N != 1) {
		return req, false
	}
	var tools bytes.Buffer
	_ = json.Compact(&tools, req.Tools)
	if t := tools.String(); t != "" && t != "null" && t != "[]" {
		return req, false
	}
	for i := range req.Messages {
		m := &req.Messages[i]
		switch m.Role {
		case "system", "developer", "user", "assistant", "tool":
		default:
			return req, false
		}
		c := strings.TrimSpace(string(m.Content))
		switch {
		case c == "" || c == "null":
		case c[0] == '"':
			if json.Unmarshal(m.Content, &m.Text) != nil {
				return req, false
			}
		case c[0] == '[':
			var parts []struct {
				Type string  `json:"type"`
				Text *string `json:"text"`
			}
			if json.Unmarshal(m.Content, &parts) != nil {
				return req, false
			}
			for _, p := range parts {
				if p.Type != "text" || p.Text == nil {
					return req, false
				}
				m.Text += *p.Text
			}
		default:
			return req, false
		}
	}
	return req, req.Messages[len(req.Messages)-1].Role == "user"
}
