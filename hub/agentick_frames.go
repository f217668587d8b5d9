package hub

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"

	"github.com/agentmesh/agentmesh/envelope"
)

// The agentick surface's frames (see agentick.go for the surface).

// ---- frames ----

// agFrame is a decoded client frame (or /invoke body).
type agFrame struct {
	Type     string // connect, req, ping
	ID       string
	Method   string
	Params   json.RawMessage // a JSON object, or nil
	ClientID string
	Stamp    json.RawMessage // ping's timestamp
}

// decodeAgentickFrame decodes one client frame within lim. invoke: an
// /invoke body, whose type is "req" unless it says otherwise and whose id
// is optional. On error the frame returned holds what could be read (its
// id, to answer with).
func decodeAgentickFrame(data []byte, lim envelope.Limits, invoke bool) (*agFrame, *agError) {
	f := &agFrame{}
	if lim.MaxBytes <= 0 {
		lim = envelope.DefaultLimits()
	}
	if len(data) > lim.MaxBytes {
		return f, agErr(agValidationType, "frame exceeds the limit of %d bytes", lim.MaxBytes)
	}
	if !json.Valid(data) {
		return f, agErr(agValidationType, "frame is not valid JSON")
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil || m == nil {
		return f, agErr(agValidationType, "frame must be a JSON object")
	}
	if d := jsonDepth(data); d > lim.MaxDepth && lim.MaxDepth > 0 {
		// Refused, but answered to its id when it has one.
		_ = json.Unmarshal(m["type"], &f.Type)
		if f.Type == "req" || (invoke && f.Type == "") {
			f.Type = "req"
			_ = json.Unmarshal(m["id"], &f.ID)
		}
		return f, agErr(agValidationType, "frame nests %d levels deep; at most %d", d, lim.MaxDepth)
	}
	str := func(k string, required bool, maxLen int) (string, *agError) {
		raw, ok := m[k]
		if !ok || string(raw) == "null" {
			if required {
				return "", agErr(agValidationReq, "%s is required", k)
			}
			return "", nil
		}
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return "", agErr(agValidationType, "%s must be a string", k)
		}
		if required && s == "" {
			return "", agErr(agValidationReq, "%s is required", k)
		}
		if len(s) > maxLen || !utf8.ValidString(s) || strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return "", agErr(agValidationType, "%s must be at most %d bytes of printable text", k, maxLen)
		}
		return s, nil
	}
	var e *agError
	if f.Type, e = str("type", !invoke, 32); e != nil {
		return f, e
	}
	if invoke && f.Type == "" {
		f.Type = "req"
	}
	switch f.Type {
	case "connect":
		f.ClientID, e = str("clientId", true, 128)
		return f, e
	case "ping":
		f.Stamp = m["timestamp"]
		return f, nil
	case "req":
	default:
		return f, agErr(agValidationType, "unknown frame type %q", f.Type)
	}
	if f.ID, e = str("id", !invoke, agentickMaxID); e != nil {
		return f, e
	}
	if invoke {
		if f.ClientID, e = str("clientId", false, 128); e != nil {
			return f, e
		}
	}
	if f.Method, e = str("method", true, 256); e != nil {
		return f, e
	}
	if p, ok := m["params"]; ok && string(p) != "null" {
		if p = bytes.TrimSpace(p); len(p) == 0 || p[0] != '{' {
			return f, agErr(agValidationType, "params must be an object")
		}
		f.Params = p
	}
	return f, nil
}

// agRes is a res frame.
type agRes struct {
	Type    string          `json:"type"`
	ID      string          `json:"id"`
	OK      bool            `json:"ok"`
	Payload json.RawMessage `json:"payload,omitempty"`
	Error   *agError        `json:"error,omitempty"`
}

func agentickRes(id string, payload json.RawMessage, e *agError) []byte {
	b, err := json.Marshal(agRes{Type: "res", ID: id, OK: e == nil, Payload: payload, Error: e})
	if err != nil {
		b, _ = json.Marshal(agRes{Type: "res", ID: id, Error: agErr(agInternalError, "cannot encode the answer")})
	}
	return b
}

func agentickErrorFrame(e *agError) []byte {
	b, _ := json.Marshal(struct {
		Type    string `json:"type"`
		Code    string `json:"code"`
		Message string `json:"message"`
	}{"error", e.Code, e.Message})
	return b
}

func agentickEventFrame(event, session string, data any) []byte {
	b, err := json.Marshal(struct {
		Type      string `json:"type"`
		Event     string `json:"event"`
		Category  string `json:"category"`
		SessionID string `json:"sessionId"`
		Data      any    `json:"data"`
	}{"event", event, agentickCategory(event), session, data})
	if err != nil {
		return nil
	}
	return b
}
