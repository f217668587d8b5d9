package chat

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
)

var fuzzSeeds = []string{
	`{"type":"session","agentId":"a1","createdAt":1700000000000,"systemPrompt":"Be brief."}`,
	`{"type":"message","message":{"role":"user","content":"Hello","timestamp":1700000000000}}`,
	`{"type":"message","message":{"role":"assistant","content":[{"type":"text","text":"Hi! How can I help?"},{"type":"thinking","thinking":"hm"},{"type":"toolCall","id":"t1","name":"Bash","arguments":{"command":"ls"}}],"model":"m","provider":"p","usage":{"input":10,"output":15,"totalTokens":25},"stopReason":"end_turn","timestamp":1700000001000}}`,
	`{"type":"message","message":{"role":"toolResult","toolCallId":"t1","toolName":"Bash","content":[{"type":"text","text":"a\nb"}],"isError":false,"timestamp":1}}`,
	`{"type":"message","message":{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBO"}}],"timestamp":2}}`,
	`{"type":"compaction","firstKept":4,"summary":"user: hi","reason":"summary"}`,
	`{"type":"message","message":{"role":"assistant","content":[{"type":"text","text":"Hi`,
	`{"type":"message"}`,
	`{"type":"message","message":{"role":"toolResult","content":[]}}`,
	`{"type":"compaction","firstKept":-1}`,
	`{} {}`,
	`null`,
}

// FuzzDecodeLine: decodeLine never panics, and what it accepts survives
// an encode/decode round trip unchanged.
func FuzzDecodeLine(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		e, err := decodeLine(line)
		if err != nil {
			return
		}
		enc, err := encodeLine(e)
		if err != nil {
			t.Fatalf("accepted entry does not encode: %v (%q)", err, line)
		}
		if bytes.Count(enc, []byte("\n")) != 1 || enc[len(enc)-1] != '\n' {
			t.Fatalf("encoded entry is not one line: %q", enc)
		}
		e2, err := decodeLine(enc[:len(enc)-1])
		if err != nil {
			t.Fatalf("re-decoding %q: %v", enc, err)
		}
		a, _ := json.Marshal(e)
		b, _ := json.Marshal(e2)
		if !bytes.Equal(a, b) {
			t.Fatalf("round trip changed the entry:\n%s\n%s", a, b)
		}
	})
}

// FuzzParseSession: any file content loads without panicking; cutting a
// valid file anywhere loads exactly the messages whose lines are whole.
func FuzzParseSession(f *testing.F) {
	var file []byte
	for _, s := range fuzzSeeds[:6] {
		file = append(file, s...)
		file = append(file, '\n')
	}
	full := parse(file)
	f.Add(file, uint16(len(file)/2))
	f.Add([]byte("garbage\n"+fuzzSeeds[1]+"\n"), uint16(3))
	f.Fuzz(func(t *testing.T, data []byte, cut uint16) {
		st := parse(data) // must not panic
		if st.goodEnd > int64(len(data)) || st.firstKept > len(st.history) {
			t.Fatalf("inconsistent state: goodEnd %d of %d, firstKept %d of %d", st.goodEnd, len(data), st.firstKept, len(st.history))
		}
		n := int(cut) % (len(file) + 1)
		part := parse(file[:n])
		whole := 0
		for _, s := range fuzzSeeds[:6] {
			end := bytes.Index(file, []byte(s)) + len(s)
			if end <= n {
				if e, _ := decodeLine([]byte(s)); e.Type == entryMessage {
					whole++
				}
			}
		}
		if len(part.history) != whole || (whole > 0 && !reflect.DeepEqual(part.history, full.history[:whole])) {
			t.Fatalf("cut at %d: %d messages loaded, want the %d whole ones", n, len(part.history), whole)
		}
	})
}
