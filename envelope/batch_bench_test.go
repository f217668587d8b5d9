package envelope_test

import (
	"testing"

	"github.com/agentmesh/agentmesh/envelope"
)

// BenchmarkReadBatch is what a link's reader does with one message under
// load: a batch of 16 request frames (benchFrame's), checked in the read
// buffer (PrecheckFrames) and then decoded frame by frame.
//
//	go test -run '^$' -bench 'ReadBatch|DecodeFrame' -benchmem -count 6 ./envelope
func BenchmarkReadBatch(b *testing.B) {
	batch := []byte{'['}
	for i := range 16 {
		if i > 0 {
			batch = append(batch, ',')
		}
		batch = append(batch, benchFrame...)
	}
	batch = append(batch, ']')
	lim := envelope.DefaultLimits()
	var scratch envelope.Frame
	b.ReportAllocs()
	b.SetBytes(int64(len(batch)))
	for b.Loop() {
		if err := envelope.PrecheckFrames(batch, lim); err != nil {
			b.Fatal(err)
		}
		n := 0
		envelope.EachCheckedFrame(batch, &scratch, func(f *envelope.Frame, err *envelope.Error) {
			if err != nil || f.Type != envelope.FrameRequest {
				b.Fatal(err)
			}
			n++
		})
		if n != 16 {
			b.Fatal(n)
		}
	}
}
