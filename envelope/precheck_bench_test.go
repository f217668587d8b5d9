package envelope_test

import (
	"strings"
	"testing"

	"github.com/agentmesh/agentmesh/envelope"
)

// BenchmarkPrecheckJSONRPC is what a reader spends on a message in its
// read buffer before deciding to decode it: a 128-byte call, a batch of
// the maximum (1,000 calls), and the S26 inputs refused as batches (one
// over the maximum; 100,000 empty objects).
func BenchmarkPrecheckJSONRPC(b *testing.B) {
	call := `{"jsonrpc":"2.0","id":1,"method":"echo.echo","params":{"data":"` + strings.Repeat("x", 58) + `"}}`
	batch := func(n int, elem string) []byte { return []byte("[" + strings.Repeat(elem+",", n-1) + elem + "]") }
	for _, bc := range []struct {
		name   string
		msg    []byte
		refuse bool
	}{
		{"call", []byte(call), false},
		{"batch-1000", batch(envelope.DefaultMaxBatch, call), false},
		{"batch-1001", batch(envelope.DefaultMaxBatch+1, call), true},
		{"batch-100000-empty", batch(100_000, "{}"), true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(bc.msg)))
			for b.Loop() {
				if err := envelope.PrecheckJSONRPC(bc.msg, envelope.Limits{}); (err != nil) != bc.refuse {
					b.Fatal(err)
				}
			}
		})
	}
}
