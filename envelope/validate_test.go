package envelope

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestScanJSONAgreesWithEncodingJSON(t *testing.T) {
	cases := []string{
		`{}`, `[]`, `1`, `-0`, `-0.5e+10`, `0.1E-2`, `"a\"b\\c\/\b\f\n\r\t\u00e9"`, `true`, `false`, `null`,
		` { "a" : [ 1 , { "b" : null } ] , "c" : "d" } `, `[[[[]]]]`, `{"a":{}}`, `[1,[2,[3]]]`,
		``, ` `, `{`, `}`, `[`, `]`, `{"a"}`, `{"a":}`, `{"a":1,}`, `[1,]`, `[,1]`, `{,}`, `{1:2}`,
		`01`, `-`, `1.`, `.1`, `1e`, `1e+`, `+1`, `0x1`, `tru`, `nul`, `True`, `"abc`, `"a` + "\n" + `b"`,
		`"\x"`, `"\u12"`, `"\u12G4"`, `[1 2]`, `{"a":1 "b":2}`, `1 2`, `[]]`, `{}}`, `"\ud83d\ude00"`, `"é€😀"`, "\"\xe2\x82\"", "[\"a\xc0\xafb\", 1]", "{\"\xed\xa0\x80\":1}",
		"\"\xff\xfe\"", `[1]x`, `[` + strings.Repeat(`"x",`, 100) + `1]`,
	}
	for _, c := range cases {
		valid, deep, _, bad := scanJSON([]byte(c), 64, 0)
		if want := json.Valid([]byte(c)); valid != want || deep {
			t.Errorf("scanJSON(%q) = %v (deep %v); encoding/json says %v", c, valid, deep, want)
		}
		if valid && bad == utf8.ValidString(c) {
			t.Errorf("scanJSON(%q): bad UTF-8 %v", c, bad)
		}
	}
	if _, deep, _, _ := scanJSON([]byte(strings.Repeat("[", 65)+strings.Repeat("]", 65)), 64, 0); !deep {
		t.Error("65 levels not reported too deep at a 64 limit")
	}
	if v, deep, _, _ := scanJSON([]byte(strings.Repeat("[", 64)+strings.Repeat("]", 64)), 64, 0); !v || deep {
		t.Error("64 levels refused at a 64 limit")
	}
	if n := testing.AllocsPerRun(100, func() { scanJSON([]byte(`{"a":[1,2,{"b":"c"}]}`), 64, 0) }); n != 0 {
		t.Errorf("scanJSON allocates %v times", n)
	}
}

func FuzzScanJSON(f *testing.F) {
	for _, s := range []string{`{"a":[1,"b",null]}`, `[1,2`, `"\u00e9"`, `-1.5e3`, `{"a" 1}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		valid, deep, _, bad := scanJSON(data, 10000, 0)
		if deep {
			return
		}
		if want := json.Valid(data); valid != want {
			t.Fatalf("scanJSON(%q) = %v; encoding/json.Valid = %v", data, valid, want)
		}
		// The strings' UTF-8 check stands for the whole message's.
		if valid && bad == utf8.Valid(data) {
			t.Fatalf("scanJSON(%q): bad UTF-8 %v, utf8.Valid %v", data, bad, utf8.Valid(data))
		}
	})
}
