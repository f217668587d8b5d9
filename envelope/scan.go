package envelope

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"
	"unsafe"
)

// Limits bound what a decoder accepts.
type Limits struct {
	// MaxBytes is the largest message accepted. Zero means the default, 1 MiB.
	MaxBytes int
	// MaxDepth is the deepest nesting of arrays and objects accepted,
	// counting the message itself. Zero means the default, 64.
	MaxDepth int
}

// DefaultLimits returns 1 MiB and depth 64: room for any sane RPC payload,
// far below what would let one message pin a hub's memory or stack.
func DefaultLimits() Limits { return Limits{MaxBytes: 1 << 20, MaxDepth: 64} }

func (l Limits) norm() Limits {
	d := DefaultLimits()
	if l.MaxBytes <= 0 {
		l.MaxBytes = d.MaxBytes
	}
	if l.MaxDepth <= 0 {
		l.MaxDepth = d.MaxDepth
	}
	return l
}

// check applies the limits and JSON validity to a whole message.
func (l Limits) check(data []byte) *Error { return l.checkBatch(data, 0) }

// checkBatch is check that also refuses a top-level array of more than
// maxBatch elements (no limit when 0), as soon as the scan reaches the
// first one too many.
func (l Limits) checkBatch(data []byte, maxBatch int) *Error {
	l = l.norm()
	if len(data) > l.MaxBytes {
		return Errorf(CodeInvalidRequest, "message of %d bytes exceeds the limit of %d bytes", len(data), l.MaxBytes)
	}
	valid, tooDeep, tooMany, badUTF8 := scanJSON(data, l.MaxDepth, maxBatch)
	if tooDeep {
		return Errorf(CodeInvalidRequest, "JSON nesting exceeds the limit of %d levels", l.MaxDepth)
	}
	if tooMany {
		return Errorf(CodeInvalidRequest, "batch exceeds the limit of %d requests", maxBatch)
	}
	if !valid {
		return NewError(CodeParseError, "message is not valid JSON")
	}
	// JSON text is UTF-8 (RFC 8259 §8.1). encoding/json would turn invalid
	// bytes into U+FFFD, other decoders refuse them or pass them on: the
	// hub reads a message exactly one way, so it refuses them (S26).
	// scanJSON checked the strings, the only place non-ASCII can be.
	if badUTF8 {
		return NewError(CodeParseError, "message is not valid UTF-8")
	}
	return nil
}

// stringEnd returns the index just past the string that starts with the
// quote at data[i] (len(data) if it is unterminated). It jumps from quote
// to quote (bytes.IndexByte is vectorised); a quote preceded by an odd run
// of backslashes is escaped.
func stringEnd(data []byte, i int) int {
	for i++; i < len(data); {
		j := bytes.IndexByte(data[i:], '"')
		if j < 0 {
			break
		}
		q := i + j
		k := q - 1
		for k >= i && data[k] == '\\' {
			k--
		}
		if (q-1-k)%2 == 0 {
			return q + 1
		}
		i = q + 1
	}
	return len(data)
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(data []byte, i int) int {
	for i < len(data) && isSpace(data[i]) {
		i++
	}
	return i
}

// valueEnd returns the index just past the JSON value starting at data[i].
// data must be valid JSON.
func valueEnd(data []byte, i int) int {
	switch data[i] {
	case '"':
		return stringEnd(data, i)
	case '{', '[':
		depth := 0
		for ; i < len(data); i++ {
			switch data[i] {
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			case '"':
				i = stringEnd(data, i) - 1
			}
		}
		return len(data)
	}
	for ; i < len(data); i++ {
		switch data[i] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			return i
		}
	}
	return i
}

// trimValue returns data without surrounding white space.
func trimValue(data []byte) []byte {
	return bytes.TrimFunc(data, func(r rune) bool { return r < 0x80 && isSpace(byte(r)) })
}

// eachMember calls fn for each member of the JSON object obj, which must be
// valid JSON. Keys are compared exactly (no case folding, unlike
// encoding/json) and a key that appears twice is an error, since decoders
// disagree on which one wins.
func eachMember(obj []byte, fn func(key string, val []byte) *Error) *Error {
	_, err := eachMemberEnd(obj, fn)
	return err
}

// eachMemberEnd is eachMember for an object that may be followed by more
// JSON (the next element of a batch): it returns the index just past the
// object's closing brace, or -1 with an error.
func eachMemberEnd(obj []byte, fn func(key string, val []byte) *Error) (int, *Error) {
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return -1, NewError(CodeInvalidRequest, "expected a JSON object")
	}
	i = skipSpace(obj, i+1)
	if i < len(obj) && obj[i] == '}' {
		return i + 1, nil
	}
	// Small objects (every envelope) check duplicates in a stack array; big
	// ones switch to a map so that a hostile object stays linear.
	var small [16]string
	nsmall := 0
	var big map[string]struct{}
	for i < len(obj) {
		ke := stringEnd(obj, i)
		key, ok := keyString(obj[i:ke])
		if !ok {
			return -1, NewError(CodeParseError, "bad object key")
		}
		dup := false
		if big != nil {
			_, dup = big[key]
			big[key] = struct{}{}
		} else {
			for _, s := range small[:nsmall] {
				if s == key {
					dup = true
				}
			}
			if nsmall < len(small) {
				small[nsmall] = key
				nsmall++
			} else {
				big = make(map[string]struct{}, 2*len(small)) // keys alias obj, which outlives the map
				for _, s := range small {
					big[s] = struct{}{}
				}
				big[key] = struct{}{}
			}
		}
		if dup {
			return -1, Errorf(CodeInvalidRequest, "duplicate key %q", key)
		}
		i = skipSpace(obj, ke)
		i = skipSpace(obj, i+1) // ':'
		ve := valueEnd(obj, i)
		if err := fn(key, obj[i:ve]); err != nil {
			return -1, err
		}
		i = skipSpace(obj, ve)
		if i < len(obj) && obj[i] == '}' {
			return i + 1, nil
		}
		i = skipSpace(obj, i+1) // ','
	}
	return len(obj), nil
}

// eachElementEnd calls fn for each element of the JSON array arr (valid
// JSON) with the rest of the array from that element on; fn returns the
// length of the element when it found it while decoding it, or -1 to have
// it scanned. A batch of frames is then walked once, not twice.
func eachElementEnd(arr []byte, fn func(rest []byte) int) {
	i := skipSpace(arr, 0)
	i = skipSpace(arr, i+1) // '['
	if i < len(arr) && arr[i] == ']' {
		return
	}
	for i < len(arr) {
		n := fn(arr[i:])
		ve := i + n
		if n < 0 {
			ve = valueEnd(arr, i)
		}
		i = skipSpace(arr, ve)
		if i < len(arr) && arr[i] == ']' {
			return
		}
		i = skipSpace(arr, i+1)
	}
}

// eachElement calls fn for each element of the JSON array arr (valid JSON).
func eachElement(arr []byte, fn func(val []byte)) {
	eachElementEnd(arr, func(rest []byte) int {
		n := valueEnd(rest, 0)
		fn(rest[:n])
		return n
	})
}

// keyString returns an object key for comparison during eachMember. A key
// without escapes aliases the message's bytes instead of being copied:
// keys are compared and dropped, never kept, and the message is not
// modified while it is decoded. Escaped keys are decoded (and copied).
func keyString(tok []byte) (string, bool) {
	if len(tok) < 2 || tok[0] != '"' || tok[len(tok)-1] != '"' {
		return "", false
	}
	inner := tok[1 : len(tok)-1]
	if len(inner) == 0 {
		return "", true
	}
	if bytes.IndexByte(inner, '\\') < 0 {
		return unsafe.String(&inner[0], len(inner)), true
	}
	return unquote(tok)
}

// unquote decodes a JSON string token. Strings without escapes (the usual
// case) cost one allocation.
func unquote(tok []byte) (string, bool) {
	if len(tok) < 2 || tok[0] != '"' || tok[len(tok)-1] != '"' {
		return "", false
	}
	inner := tok[1 : len(tok)-1]
	if bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		return string(inner), true
	}
	var s string
	if err := json.Unmarshal(tok, &s); err != nil {
		return "", false
	}
	return s, true
}

func kindOf(v []byte) byte {
	if len(v) == 0 {
		return 0
	}
	switch c := v[0]; c {
	case '"', '{', '[', 't', 'f', 'n':
		return c
	}
	return '0'
}

func stringField(name string, v []byte) (string, *Error) {
	if kindOf(v) != '"' {
		return "", Errorf(CodeInvalidRequest, "%s must be a string", name)
	}
	s, ok := unquote(v)
	if !ok {
		return "", Errorf(CodeInvalidRequest, "%s is not a valid string", name)
	}
	return s, nil
}

func intField(name string, v []byte, min, max int64) (int64, *Error) {
	if kindOf(v) != '0' {
		return 0, Errorf(CodeInvalidRequest, "%s must be a number", name)
	}
	n, err := strconv.ParseInt(string(v), 10, 64)
	if err != nil || n < min || n > max {
		return 0, Errorf(CodeInvalidRequest, "%s must be an integer in [%d, %d]", name, min, max)
	}
	return n, nil
}

func floatField(name string, v []byte) (float64, *Error) {
	if kindOf(v) != '0' {
		return 0, Errorf(CodeInvalidRequest, "%s must be a number", name)
	}
	f, err := strconv.ParseFloat(string(v), 64)
	if err != nil {
		return 0, Errorf(CodeInvalidRequest, "%s is out of range", name)
	}
	return f, nil
}

// appendString appends s as a JSON string. Invalid UTF-8 becomes U+FFFD.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexdigits[c>>4], hexdigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexdigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
