package envelope

import (
	"bytes"
	"errors"
	"fmt"
)

// The dialect codecs of the edge surfaces (agentick frames, Multica
// messages, OpenAI chat-completions bodies) decode with the scanner of the
// native frames and JSON-RPC: the message is checked once against the
// Limits (size, nesting, JSON, UTF-8), then walked once, keys matched
// exactly, a key given twice in an object the decoder reads refused as
// INVALID_REQUEST (decoders disagree on which one wins). Raw members
// (params, payloads) are passed on as sent, like a native frame's params.

// ErrMissing is the cause (errors.Is) of a dialect decoder's refusal for a
// required member that is absent, null or empty, so that a dialect with a
// code of its own for that (agentick's VALIDATION_REQUIRED) can tell it
// from a member of the wrong type.
var ErrMissing = errors.New("required member missing")

// missingf is a refusal for a required member that is absent.
func missingf(c Code, format string, args ...any) *Error {
	return WrapError(c, fmt.Sprintf(format, args...), ErrMissing)
}

// recoverStrings finds, in the head of a message refused as a whole (not
// JSON, nested too deep, a key given twice), the string values of the
// top-level members named keys, so that the refusal can be answered to
// the request it belongs to. Like RecoverFrameSeq it is lenient but
// cautious: it reads at most RecoverHeadLen bytes, the members of one
// object in order as far as they can be read; a key with an escape (which
// could spell one of keys) makes it give up on all of them, and a key
// given twice, or with a value that is not a plain string, yields "" for
// that key. found[i] reports whether keys[i] was seen (once) with a
// string value.
func recoverStrings(head []byte, keys ...string) (vals []string, found []bool) {
	vals, found = make([]string, len(keys)), make([]bool, len(keys))
	seen := make([]int, len(keys))
	if len(head) > RecoverHeadLen {
		head = head[:RecoverHeadLen]
	}
	done := func() ([]string, []bool) {
		for i := range keys {
			if seen[i] != 1 {
				vals[i], found[i] = "", false
			}
		}
		return vals, found
	}
	i := skipSpace(head, 0)
	if i >= len(head) || head[i] != '{' {
		return vals, found
	}
	i++
	for {
		i = skipSpace(head, i)
		if i >= len(head) || head[i] != '"' {
			return done()
		}
		ke := closedStringEnd(head, i)
		if ke < 0 {
			return done()
		}
		key := head[i+1 : ke-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			clear(vals)
			clear(found)
			return vals, found
		}
		i = skipSpace(head, ke)
		if i >= len(head) || head[i] != ':' {
			return done()
		}
		i = skipSpace(head, i+1)
		ve := -1
		if i < len(head) {
			ve = lenientValueEnd(head, i)
		}
		for k, name := range keys {
			if string(key) != name {
				continue
			}
			seen[k]++
			if ve < 0 || head[i] != '"' {
				continue
			}
			if s, ok := unquote(head[i:ve]); ok {
				vals[k], found[k] = s, true
			}
		}
		if ve < 0 {
			return done()
		}
		i = skipSpace(head, ve)
		if i >= len(head) || head[i] != ',' {
			return done()
		}
		i++
	}
}

// SetCheckedMember returns the JSON object obj with its member key set to
// val: the members of obj as sent, but for key's, then "key":val. obj
// comes from a message already checked against its limits (the params of
// a decoded request): valid JSON, walked once, not scanned again; empty
// obj is {}. val must be valid JSON. A dialect that adds a member to the
// params it forwards (NEXUS3's agentId from the path) uses it instead of
// decoding and re-encoding them, which would silently keep one of the
// values of a key given twice. obj not an object, or with a key given
// twice, is INVALID_PARAMS.
func SetCheckedMember(obj []byte, key string, val []byte) ([]byte, *Error) {
	out := make([]byte, 0, len(obj)+len(key)+len(val)+8)
	out = append(out, '{')
	if len(trimValue(obj)) > 0 {
		if kindOf(trimValue(obj)) != '{' {
			return nil, NewError(CodeInvalidParams, "params must be an object")
		}
		err := eachMember(obj, func(k string, v []byte) *Error {
			if k == key {
				return nil
			}
			if len(out) > 1 {
				out = append(out, ',')
			}
			out = appendString(out, k)
			out = append(out, ':')
			out = append(out, v...)
			return nil
		})
		if err != nil {
			return nil, &Error{Code: CodeInvalidParams, Message: err.Message}
		}
	}
	if len(out) > 1 {
		out = append(out, ',')
	}
	out = appendString(out, key)
	out = append(out, ':')
	out = append(out, val...)
	return append(out, '}'), nil
}
