package envelope

import (
	"bytes"
	"math"
)

// Checks a reader can apply to a message while it is still in its scratch
// buffer, before it copies it out: a message refused as a whole then costs
// no allocation (S26: under a flood of hostile input the hub's garbage,
// and so the collector's work on everyone's calls, stays small).

// Check applies the limits (size, nesting), JSON validity and UTF-8 to a
// whole message: the message-level checks every decoder here starts with.
func (l Limits) Check(data []byte) *Error { return l.check(data) }

// PrecheckJSONRPC reports the refusal DecodeJSONRPC would make of data as
// a whole (size, nesting, JSON, UTF-8, an empty or oversized batch), or
// nil when DecodeJSONRPC will decode it into calls.
func PrecheckJSONRPC(data []byte, lim Limits) *Error {
	if err := lim.checkBatch(data, DefaultMaxBatch); err != nil {
		return err
	}
	data = trimValue(data)
	if data[0] == '[' && data[skipSpace(data, 1)] == ']' {
		return NewError(CodeInvalidRequest, "empty batch")
	}
	return nil
}

// PrecheckFrames reports the refusal EachFrame would make of data as a
// whole (a batch array may nest one level deeper than its frames), or nil.
func PrecheckFrames(data []byte, lim Limits) *Error {
	i := skipSpace(data, 0)
	if i < len(data) && data[i] == '[' {
		lim = lim.norm()
		lim.MaxDepth++
	}
	return lim.check(data)
}

// RecoverHeadLen is how much of a refused message RecoverFrameSeq looks
// at: the members a frame starts with (AppendRequestFrame and
// AppendResponseFrame write "type" and "seq" first).
const RecoverHeadLen = 4 << 10

// RecoverFrameSeq finds, in the head of a native frame refused by its
// message-level checks (invalid JSON or UTF-8, nesting too deep), the
// frame's type and seq, so that the receiver can answer the error to the
// request (or fail the call) it belongs to instead of leaving its caller
// to time out. The scan is lenient, for input known to be broken, but
// bounded and cautious: it looks at no more than RecoverHeadLen bytes, at
// the top-level members of one object only, in order, as far as they can
// be read, and gives up (ok false) on anything that would make the answer
// a guess: a key with an escape (which could spell "seq"), a "type" or
// "seq" given twice, a type other than "req" or "res", a seq that is not
// a positive integer. A frame that is a batch (an array) is not
// recovered.
func RecoverFrameSeq(head []byte) (typ FrameType, seq uint64, ok bool) {
	if len(head) > RecoverHeadLen {
		head = head[:RecoverHeadLen]
	}
	i := skipSpace(head, 0)
	if i >= len(head) || head[i] != '{' {
		return 0, 0, false
	}
	i++
	var haveType, haveSeq bool
	found := func() (FrameType, uint64, bool) {
		if haveType && haveSeq {
			return typ, seq, true
		}
		return 0, 0, false
	}
	// Each member in turn, as far as the head can be read: the scan stops
	// (keeping what it found) at a value that does not end within the
	// head, and gives up on a key it cannot compare or on a second "type"
	// or "seq".
	for {
		i = skipSpace(head, i)
		if i >= len(head) || head[i] != '"' {
			return found()
		}
		ke := closedStringEnd(head, i)
		if ke < 0 {
			return found()
		}
		key := head[i+1 : ke-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			return 0, 0, false
		}
		i = skipSpace(head, ke)
		if i >= len(head) || head[i] != ':' {
			return found()
		}
		i = skipSpace(head, i+1)
		ve := -1
		if i < len(head) {
			ve = lenientValueEnd(head, i)
		}
		switch string(key) {
		case "type":
			if haveType || ve < 0 {
				return 0, 0, false
			}
			haveType = true
			switch string(head[i:ve]) {
			case `"req"`:
				typ = FrameRequest
			case `"res"`:
				typ = FrameResponse
			default:
				return 0, 0, false
			}
		case "seq":
			if haveSeq || ve < 0 {
				return 0, 0, false
			}
			haveSeq = true
			n, e := intField("seq", head[i:ve], 1, math.MaxInt64)
			if e != nil {
				return 0, 0, false
			}
			seq = uint64(n)
		}
		if ve < 0 {
			return found()
		}
		i = skipSpace(head, ve)
		if i >= len(head) || head[i] != ',' {
			return found()
		}
		i++
	}
}

// lenientValueEnd returns the index just past the value at data[i] in
// possibly broken JSON (strings may hold any bytes; containers are
// matched by their brackets, at any depth), or -1 if it does not end
// within data.
func lenientValueEnd(data []byte, i int) int {
	switch data[i] {
	case '"':
		return closedStringEnd(data, i)
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
				e := closedStringEnd(data, i)
				if e < 0 {
					return -1
				}
				i = e - 1
			}
		}
		return -1
	}
	j := i
	for ; j < len(data); j++ {
		switch data[j] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			if j == i {
				return -1
			}
			return j
		}
	}
	return -1
}

// closedStringEnd returns the index just past the string whose opening
// quote is at data[i], or -1 if it is not closed within data.
func closedStringEnd(data []byte, i int) int {
	for i++; i < len(data); i++ {
		switch data[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return -1
}
