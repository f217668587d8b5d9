package envelope

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
)

func plainByte(c byte) bool { return c >= 0x20 && c < 0x80 && c != '"' && c != '\\' }

// TestPlain8 checks the word-at-a-time test against the byte-at-a-time one:
// every byte value at every position, and random words.
func TestPlain8(t *testing.T) {
	check := func(w [8]byte) {
		want := true
		for _, c := range w {
			want = want && plainByte(c)
		}
		if got := plain8(binary.LittleEndian.Uint64(w[:])); got != want {
			t.Fatalf("plain8(%q) = %v, want %v", w, got, want)
		}
	}
	for _, fill := range []byte{'a', 0x20, 0x21, 0x7f, 0x80, 0xff, 0x1f, 0} {
		for pos := range 8 {
			for c := range 256 {
				var w [8]byte
				for i := range w {
					w[i] = fill
				}
				w[pos] = byte(c)
				check(w)
			}
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 1 << 20 {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], r.Uint64())
		check(w)
	}
}

// TestStringEnd checks the quote-to-quote jump on escape runs.
func TestStringEnd(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int
	}{
		{`"" x`, 2},
		{`"abc",`, 5},
		{`"a\"b"`, 6},
		{`"a\\"b"`, 5},
		{`"a\\\"b"`, 8},
		{`"\\\\"`, 6},
		{`"\"\""`, 6},
		{`"abc`, 4},
		{`"a\"`, 4},
	} {
		if got := stringEnd([]byte(c.in), 0); got != c.want {
			t.Errorf("stringEnd(%s) = %d, want %d", c.in, got, c.want)
		}
	}
}

// FuzzEachFrameWalk checks that a batch decoded in one walk (the decoder
// finding where each frame ends) gives what decoding each element found
// by a separate scan gives.
func FuzzEachFrameWalk(f *testing.F) {
	f.Add([]byte(`[{"type":"res","seq":5,"result":1},{"type":"goaway","seq":9}]`))
	f.Add([]byte(`[ {"type":"cancel","seq":1} , 7, {"type":"req","seq":2,"method":"m","params":{"a":"}"}}, "x", {"seq":1,"seq":2}, {"type":"req","seq":3,"method":"m"} ]`))
	f.Add([]byte(`[{"type":"req","seq":1,"method":""},{"type":"res","seq":2,"error":{"code":"TIMEOUT"}}]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		if DefaultLimits().check(data) != nil || kindOf(data) != '[' {
			return
		}
		type res struct {
			f       Frame
			e, ferr string
		}
		msg := func(e *Error) string {
			if e == nil {
				return ""
			}
			return e.Error()
		}
		mk := func(f Frame, e *Error) res {
			r := res{f, msg(e), msg(f.Err)}
			r.f.Err = nil
			return r
		}
		var walk, ref []res
		eachFrame(data, new(Frame), func(f *Frame, e *Error) { walk = append(walk, mk(*f, e)) })
		eachElement(data, func(v []byte) { ref = append(ref, mk(decodeValidFrame(v))) })
		if len(walk) != len(ref) {
			t.Fatalf("%q: %d frames in one walk, %d by element", data, len(walk), len(ref))
		}
		for i := range walk {
			if fmt.Sprint(walk[i]) != fmt.Sprint(ref[i]) {
				t.Fatalf("%q: frame %d: %+v in one walk, %+v by element", data, i, walk[i], ref[i])
			}
		}
	})
}
