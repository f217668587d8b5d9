// The race detector's instrumentation doubles every stack frame: the
// figure this test bounds is the production build's. The README's test
// command runs it without -race.

//go:build !race

package envelope_test

import (
	"encoding/json"
	"runtime"
	"sync"
	"testing"

	"github.com/agentmesh/agentmesh/envelope"
)

// TestDecodeStackSmall: checking and decoding a message of native frames
// (what a link's reader does with each one) fits in a 4 KiB goroutine
// stack. Every idle link keeps its reader's stack at the size its last
// message grew it to (a collection shrinks it, every heartbeat regrows
// it): with frames decoded by value it was 8 KiB, a third of an idle
// link's memory in the hub. Measured as the stack in use of 1,000
// goroutines parked after decoding, against 1,000 parked at once.
func TestDecodeStackSmall(t *testing.T) {
	hb := &envelope.Request{ID: "0197a2b0-1234-7abc-8def-0123456789ab", Method: "agent.heartbeat",
		Params: json.RawMessage(`{"agentId":"echo-0197a2b0-1234-7abc-8def-0123456789ab","load":0}`)}
	hb.Headers.TTL = 5000
	hb.Headers.Traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	res := &envelope.Response{ID: "r", Result: json.RawMessage(`{"ok":true}`)}
	msg := []byte{'['}
	msg = envelope.AppendRequestFrame(msg, 7, hb)
	msg = append(msg, ',')
	msg = envelope.AppendResponseFrame(msg, 8, res, nil)
	msg = append(msg, ']')
	lim := envelope.DefaultLimits()
	decode := func() {
		var f envelope.Frame
		if err := envelope.PrecheckFrames(msg, lim); err != nil {
			t.Error(err)
			return
		}
		n := 0
		envelope.EachCheckedFrame(msg, &f, func(f *envelope.Frame, err *envelope.Error) {
			if err != nil {
				t.Error(err)
			}
			n++
		})
		if n != 2 {
			t.Errorf("%d frames decoded; want 2", n)
		}
	}
	base, used := perGoroutineStack(func() {}), perGoroutineStack(decode)
	t.Logf("stack per goroutine: %d B parked at once, %d B after decoding", base, used)
	if used > 4<<10 {
		t.Errorf("decoding a message grew a goroutine's stack to %d B; want at most 4 KiB", used)
	}
}

// perGoroutineStack is the stack in use per goroutine of 1,000 that ran
// f and parked.
func perGoroutineStack(f func()) uint64 {
	const n = 1000
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	stop := make(chan struct{})
	var ran, exited sync.WaitGroup
	for range n {
		ran.Add(1)
		exited.Go(func() {
			f()
			ran.Done()
			<-stop
		})
	}
	ran.Wait()
	runtime.ReadMemStats(&m1)
	close(stop)
	exited.Wait()
	return (m1.StackInuse - m0.StackInuse) / n
}
