package testkit

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentmesh/agentmesh/envelope"
)

// Helpers of the dialect decoders' fuzz tests: they judge an input
// against encoding/json, the decoder each replaced.

// TopKeys returns the keys of the top-level object of data (valid JSON)
// in order, decoded by encoding/json, or ok false if it is not an object.
func TopKeys(data []byte) (keys []string, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(data))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, false
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, false
		}
		keys = append(keys, tok.(string))
		var skip json.RawMessage
		if dec.Decode(&skip) != nil {
			return nil, false
		}
	}
	return keys, true
}

// AnyDup reports whether any object anywhere in data (valid JSON) has a
// key twice, or a key that equals one of fold but for case.
func AnyDup(data []byte, fold ...string) bool {
	dec := json.NewDecoder(bytes.NewReader(data))
	var stack []map[string]bool // one per open container; nil for arrays
	expectKey := func() bool {
		return len(stack) > 0 && stack[len(stack)-1] != nil
	}
	keyNext := true
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		switch v := tok.(type) {
		case json.Delim:
			switch v {
			case '{':
				stack = append(stack, map[string]bool{})
				keyNext = true
				continue
			case '[':
				stack = append(stack, nil)
			case '}', ']':
				stack = stack[:len(stack)-1]
			}
		case string:
			if expectKey() && keyNext {
				m := stack[len(stack)-1]
				if m[v] {
					return true
				}
				m[v] = true
				for _, f := range fold {
					if v != f && strings.EqualFold(v, f) {
						return true
					}
				}
				keyNext = false
				continue
			}
		}
		keyNext = true
	}
}

func HasDup(keys []string) bool {
	seen := map[string]bool{}
	for _, k := range keys {
		if seen[k] {
			return true
		}
		seen[k] = true
	}
	return false
}

// FuzzLimits bound the inputs the fuzz tests judge as clean.
var FuzzLimits = envelope.Limits{MaxBytes: 4096, MaxDepth: 16}

// CleanInput: valid JSON, valid UTF-8, within FuzzLimits.
func CleanInput(data []byte) bool {
	return json.Valid(data) && bytes.Equal(bytes.ToValidUTF8(data, nil), data) &&
		len(data) <= FuzzLimits.MaxBytes && !Deeper(data, FuzzLimits.MaxDepth)
}

// EqualJSON reports whether a and b encode alike.

func EqualJSON(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}

// Deeper is an independent depth count (the decoder has its own).
func Deeper(data []byte, max int) bool {
	depth, inStr, esc := 0, false, false
	for _, c := range data {
		switch {
		case esc:
			esc = false
		case inStr && c == '\\':
			esc = true
		case c == '"':
			inStr = !inStr
		case inStr:
		case c == '[' || c == '{':
			depth++
			if depth > max {
				return true
			}
		case c == ']' || c == '}':
			depth--
		}
	}
	return false
}

// CheckLimits is the property shared by every decoder: input over a limit
// or not JSON is refused with the right code.
func CheckLimits(t *testing.T, data []byte, err *envelope.Error) {
	t.Helper()
	switch {
	case len(data) > FuzzLimits.MaxBytes:
		if err == nil || err.Code != envelope.CodeInvalidRequest {
			t.Fatalf("%d bytes over the limit: err = %v", len(data), err)
		}
	case !json.Valid(data) && !Deeper(data, FuzzLimits.MaxDepth):
		// A JSON-RPC batch is refused at its first element past the
		// limit, before the scan reaches what is broken after it.
		if err != nil && err.Code == envelope.CodeInvalidRequest && strings.HasPrefix(err.Message, "batch exceeds") {
			break
		}
		if err == nil || err.Code != envelope.CodeParseError {
			t.Fatalf("invalid JSON %q: err = %v; want PARSE_ERROR", data, err)
		}
	}
}

// DialectLimits bound the dialect decoders in their strict tests.
var DialectLimits = envelope.Limits{MaxBytes: 1024, MaxDepth: 8}

// Nest is n nested empty JSON arrays: a value n levels deep.
func Nest(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
