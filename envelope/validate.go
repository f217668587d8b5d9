package envelope

import (
	"encoding/binary"
	"runtime"
	"unicode/utf8"
)

// yieldEvery is how many bytes scanJSON scans between yields.
const yieldEvery = 64 << 10

// scanJSON reports whether data is exactly one JSON value (RFC 8259, with
// white space around it), whether its arrays and objects nest deeper
// than maxDepth, and whether a top-level array has more than maxElems
// elements (tooMany; no limit when maxElems is 0); on the first problem
// it stops, so a batch far over the limit (100,000 empty objects, S26) is
// refused after its first element too many, not after a scan and a
// count of all of it. It replaces two passes
// (a depth count and encoding/json.Valid's byte-at-a-time state machine)
// with one, and allocates nothing for messages nested up to 128 deep.
// Strings are checked to be UTF-8 (badUTF8), which encoding/json does not.
//
// A large message yields its P every yieldEvery bytes: scanning a
// megabyte takes about a millisecond, and a flood of them (S26) would
// otherwise hold both of a small machine's Ps for the scheduler's 10 ms
// quantum while other connections' small calls wait.
func scanJSON(data []byte, maxDepth, maxElems int) (valid, tooDeep, tooMany, badUTF8 bool) {
	var small [128]byte
	stack := small[:0]
	i := skipSpace(data, 0)
	n := len(data)
	elems := 1 // of a top-level array, counted at its commas
	yieldAt := yieldEvery
	for {
		// A value starts at i.
		if i >= yieldAt {
			runtime.Gosched()
			yieldAt = i + yieldEvery
		}
		if i >= n {
			return false, false, false, false
		}
		switch c := data[i]; {
		case c == '{' || c == '[':
			if len(stack) >= maxDepth {
				return false, true, false, false
			}
			stack = append(stack, c)
			i = skipSpace(data, i+1)
			if i < n && data[i] == c+2 { // '}' is '{'+2, ']' is '['+2
				stack = stack[:len(stack)-1]
				i++
				goto after
			}
			if c == '{' {
				if i = scanKey(data, i, &badUTF8); i < 0 {
					return false, false, false, false
				}
			}
			continue
		case c == '"':
			if i = scanString(data, i, &badUTF8); i < 0 {
				return false, false, false, false
			}
		case c == '-' || (c >= '0' && c <= '9'):
			if i = scanNumber(data, i); i < 0 {
				return false, false, false, false
			}
		case c == 't':
			if !hasLiteral(data, i, "true") {
				return false, false, false, false
			}
			i += 4
		case c == 'f':
			if !hasLiteral(data, i, "false") {
				return false, false, false, false
			}
			i += 5
		case c == 'n':
			if !hasLiteral(data, i, "null") {
				return false, false, false, false
			}
			i += 4
		default:
			return false, false, false, false
		}
	after:
		// A value ended at i: close containers, or move to the next value.
		for {
			i = skipSpace(data, i)
			if len(stack) == 0 {
				return i == n, false, false, badUTF8
			}
			if i >= n {
				return false, false, false, false
			}
			top := stack[len(stack)-1]
			switch data[i] {
			case ',':
				if len(stack) == 1 && top == '[' && maxElems > 0 {
					if elems++; elems > maxElems {
						return false, false, true, false
					}
				}
				i = skipSpace(data, i+1)
				if top == '{' {
					if i = scanKey(data, i, &badUTF8); i < 0 {
						return false, false, false, false
					}
				}
			case top + 2:
				stack = stack[:len(stack)-1]
				i++
				continue
			default:
				return false, false, false, false
			}
			break
		}
	}
}

// scanKey checks `"key" :` at i and returns the index after the colon and
// the white space that follows, or -1.
func scanKey(data []byte, i int, badUTF8 *bool) int {
	if i >= len(data) || data[i] != '"' {
		return -1
	}
	if i = scanString(data, i, badUTF8); i < 0 {
		return -1
	}
	i = skipSpace(data, i)
	if i >= len(data) || data[i] != ':' {
		return -1
	}
	return skipSpace(data, i+1)
}

// scanString checks the string starting with the quote at i and returns
// the index after its closing quote, or -1. Runs of eight plain ASCII
// bytes (no quote, backslash or control character) are skipped a word at
// a time. Non-ASCII text is checked to be UTF-8 here (JSON has it nowhere
// else), so the message needs no separate pass: badUTF8 is set, and the
// scan goes on, since a message that is also invalid JSON or too deep is
// refused for that.
func scanString(data []byte, i int, badUTF8 *bool) int {
	n := len(data)
	for i++; i < n; i++ {
		for i+8 <= n && plain8(binary.LittleEndian.Uint64(data[i:])) {
			i += 8
		}
		if i >= n {
			break
		}
		c := data[i]
		switch {
		case c == '"':
			return i + 1
		case c < 0x20:
			return -1
		case c >= utf8.RuneSelf:
			r, size := utf8.DecodeRune(data[i:])
			if r == utf8.RuneError && size == 1 {
				*badUTF8 = true
			}
			i += size - 1
		case c == '\\':
			i++
			if i >= n {
				return -1
			}
			switch data[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if i+4 >= n {
					return -1
				}
				for _, h := range data[i+1 : i+5] {
					if !isHex(h) {
						return -1
					}
				}
				i += 4
			default:
				return -1
			}
		}
	}
	return -1
}

const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// plain8 reports whether all eight bytes in x are ASCII and none is a
// quote, a backslash or a control character (below 0x20): the bit tricks of
// "Bit Twiddling Hacks" (hasless, haszero), exact for "is there one".
func plain8(x uint64) bool {
	less := (x - ones*0x20) &^ x
	q := x ^ (ones * '"')
	bs := x ^ (ones * '\\')
	quote := (q - ones) &^ q
	slash := (bs - ones) &^ bs
	return (less|quote|slash|x)&highs == 0
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// scanNumber checks the number at i and returns the index after it, or -1.
func scanNumber(data []byte, i int) int {
	n := len(data)
	if data[i] == '-' {
		i++
	}
	switch {
	case i < n && data[i] == '0':
		i++
	case i < n && data[i] >= '1' && data[i] <= '9':
		for i++; i < n && isDigit(data[i]); i++ {
		}
	default:
		return -1
	}
	if i < n && data[i] == '.' {
		i++
		if i >= n || !isDigit(data[i]) {
			return -1
		}
		for ; i < n && isDigit(data[i]); i++ {
		}
	}
	if i < n && (data[i] == 'e' || data[i] == 'E') {
		i++
		if i < n && (data[i] == '+' || data[i] == '-') {
			i++
		}
		if i >= n || !isDigit(data[i]) {
			return -1
		}
		for ; i < n && isDigit(data[i]); i++ {
		}
	}
	return i
}

func hasLiteral(data []byte, i int, lit string) bool {
	return len(data)-i >= len(lit) && string(data[i:i+len(lit)]) == lit
}
