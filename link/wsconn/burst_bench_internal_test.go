package wsconn

import (
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
)

// BenchmarkTextBurstWrites: 32 callers share one text connection (a plain
// JSON-RPC link) in a closed loop, each sending its next message once the
// peer has read its last: the peer reads many messages per read, so the
// callers it releases together send together. writes/msg is the writes
// to the socket per message; the writer's yield before a burst's write
// lets the callers released together share one.
func BenchmarkTextBurstWrites(b *testing.B) {
	const callers = 32
	counted := new(countingListener)
	ws, client := acceptedPair(b, func(ln net.Listener) net.Listener { counted.Listener = ln; return counted })
	c := NewConn(ws, Config{PingInterval: time.Hour})
	c.Start(func([]byte, *envelope.Error) {}, func(error) {})
	b.Cleanup(c.Close)
	read := make([]chan struct{}, callers)
	for i := range read {
		read[i] = make(chan struct{}, 1)
	}
	peerDone := make(chan struct{})
	b.Cleanup(func() { _ = client.Close(); <-peerDone })
	go func() {
		defer close(peerDone)
		for {
			_, msg, err := client.ReadMessage()
			if err != nil {
				return
			}
			i, err := strconv.Atoi(string(msg))
			if err != nil || i < 0 || i >= callers {
				b.Errorf("peer read %q", msg)
				return
			}
			read[i] <- struct{}{}
		}
	}()
	var left atomic.Int64
	left.Store(int64(b.N))
	before := counted.writes.Load()
	b.ResetTimer()
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			stuck := time.NewTimer(time.Hour)
			defer stuck.Stop()
			for left.Add(-1) >= 0 {
				m := GetBuf()
				*m = strconv.AppendInt(*m, int64(i), 10)
				if !c.Send(m) {
					b.Error("connection closed")
					return
				}
				stuck.Reset(5 * time.Second)
				select {
				case <-read[i]:
				case <-stuck.C:
					b.Error("message not read in 5 s")
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(counted.writes.Load()-before)/float64(b.N), "writes/msg")
}
