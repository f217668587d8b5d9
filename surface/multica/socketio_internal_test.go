package multica

import (
	"strconv"
	"strings"
	"testing"
)

// FuzzParseSIO feeds the Socket.IO packet reader arbitrary packets: it
// never panics; what it accepts is a text packet of type 0 to 4 whose
// namespace, ack id and payload are the packet's own.
func FuzzParseSIO(f *testing.F) {
	for _, s := range []string{"0", `0{"token":"t"}`, `0/admin,{}`, `2["send",{}]`, `27["ping",{}]`, `2/x,12["a"]`, "1", "3", `451-["a",{"_placeholder":true,"num":0}]`, "9", "", "2999999999999999999999[]", "0/"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := parseSIO(b)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an error without a message")
			}
			return
		}
		if p.typ < '0' || p.typ > '4' {
			t.Fatalf("accepted packet type %q", p.typ)
		}
		if !strings.HasSuffix(string(b), string(p.data)) || (p.nsp != "/" && !strings.HasPrefix(string(b[1:]), p.nsp)) {
			t.Fatalf("parsed %q as %+v: the payload or namespace is not the packet's", b, p)
		}
		if p.ack >= 0 && !strings.Contains(string(b), strconv.FormatInt(p.ack, 10)) {
			t.Fatalf("parsed %q as %+v: the ack id is not the packet's", b, p)
		}
	})
}
