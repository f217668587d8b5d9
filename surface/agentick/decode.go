package agentick

import (
	"encoding/json"
	"strings"
	"unicode/utf8"

	"github.com/agentmesh/agentmesh/envelope"
)

// Frame is a decoded client frame of the agentick gateway
// protocol (seed agentick-gateway-protocol), or the body of its POST
// /invoke.
type Frame struct {
	Type     string          // connect, req, ping
	ID       string          // a req's id
	Method   string          // a req's method
	Params   json.RawMessage // a req's params: a JSON object, or nil
	ClientID string          // connect's (and /invoke's) clientId
	Stamp    json.RawMessage // ping's timestamp, as sent (any JSON), or nil
}

// The bounds of an agentick frame's strings, in bytes.
const (
	agentickMaxType     = 32
	agentickMaxID       = 256
	agentickMaxMethod   = 256
	agentickMaxClientID = 128
)

// DecodeFrame decodes one agentick client frame within lim, in one
// pass: type (connect, req or ping), then what that type needs (connect: a
// clientId; req: an id, a method, params an object or absent; ping: an
// optional timestamp). invoke: an /invoke body, whose type is "req" unless
// it says otherwise and whose id and clientId are optional.
//
// Refusals are INVALID_REQUEST (over a limit, not an object, a key given
// twice, a member of the wrong type; envelope.ErrMissing is their cause for a
// required member absent, null or empty) or PARSE_ERROR (not JSON, not
// UTF-8). On a refusal the frame still holds what could be read: a req's
// id, also from a frame refused as a whole (too deep, broken JSON, a key
// twice) when its head shows it unambiguously, so that the refusal is
// answered to the request.
func DecodeFrame(data []byte, lim envelope.Limits, invoke bool) (Frame, *envelope.Error) {
	var f Frame
	if err := lim.Check(data); err != nil {
		if len(data) <= lim.Normalized().MaxBytes {
			f.recoverHead(data, invoke)
		}
		return f, err
	}
	if envelope.KindOf(envelope.TrimValue(data)) != '{' {
		return f, envelope.NewError(envelope.CodeInvalidRequest, "frame must be a JSON object")
	}
	var typ, id, method, params, clientID, stamp []byte
	err := envelope.EachMember(data, func(key string, v []byte) *envelope.Error {
		switch key {
		case "type":
			typ = v
		case "id":
			id = v
		case "method":
			method = v
		case "params":
			params = v
		case "clientId":
			clientID = v
		case "timestamp":
			stamp = v
		}
		return nil
	})
	if err != nil {
		f.recoverHead(data, invoke)
		return f, err
	}
	if f.Type, err = agentickString("type", typ, !invoke, agentickMaxType); err != nil {
		return f, err
	}
	if invoke && f.Type == "" {
		f.Type = "req"
	}
	switch f.Type {
	case "connect":
		f.ClientID, err = agentickString("clientId", clientID, true, agentickMaxClientID)
		return f, err
	case "ping":
		f.Stamp = stamp
		return f, nil
	case "req":
	default:
		return f, envelope.Errorf(envelope.CodeInvalidRequest, "unknown frame type %q", f.Type)
	}
	if f.ID, err = agentickString("id", id, !invoke, agentickMaxID); err != nil {
		return f, err
	}
	if invoke {
		if f.ClientID, err = agentickString("clientId", clientID, false, agentickMaxClientID); err != nil {
			return f, err
		}
	}
	if f.Method, err = agentickString("method", method, true, agentickMaxMethod); err != nil {
		return f, err
	}
	if params != nil && envelope.KindOf(params) != 'n' {
		if envelope.KindOf(params) != '{' {
			return f, envelope.NewError(envelope.CodeInvalidRequest, "params must be an object")
		}
		f.Params = params
	}
	return f, nil
}

// recoverHead fills in a req's id from the head of a frame refused as a
// whole (see recoverStrings).
func (f *Frame) recoverHead(data []byte, invoke bool) {
	v, found := envelope.RecoverStrings(data, "type", "id")
	if (found[0] && v[0] == "req") || (invoke && !found[0]) {
		f.Type = "req"
		if found[1] && printable(v[1], agentickMaxID) {
			f.ID = v[1]
		}
	}
}

// agentickString reads a string member: absent or null is "" (refused
// when required, as is ""), else a JSON string of at most maxLen bytes of
// printable text.
func agentickString(name string, v []byte, required bool, maxLen int) (string, *envelope.Error) {
	if v == nil || envelope.KindOf(v) == 'n' {
		if required {
			return "", envelope.Missingf(envelope.CodeInvalidRequest, "%s is required", name)
		}
		return "", nil
	}
	s, err := envelope.StringField(name, v)
	if err != nil {
		return "", err
	}
	if required && s == "" {
		return "", envelope.Missingf(envelope.CodeInvalidRequest, "%s is required", name)
	}
	if !printable(s, maxLen) {
		return "", envelope.Errorf(envelope.CodeInvalidRequest, "%s must be at most %d bytes of printable text", name, maxLen)
	}
	return s, nil
}

// printable: at most maxLen bytes of UTF-8 without control characters.
func printable(s string, maxLen int) bool {
	return len(s) <= maxLen && utf8.ValidString(s) &&
		!strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f })
}
