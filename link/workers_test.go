package link_test

import (
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/agentmesh/agentmesh/link"
)

// TestWorkers: tasks given one after another run on one kept worker; a
// burst starts more; idle workers exit after WorkerIdle, and all of them
// once done is closed.
func TestWorkers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		done := make(chan struct{})
		var ran atomic.Int64
		release := make(chan struct{})
		w := link.NewWorkers(done, func(block bool) {
			ran.Add(1)
			if block {
				<-release
			}
		})
		for range 10 {
			w.Go(false)
			synctest.Wait()
		}
		if n := workerCount(); n != 1 || ran.Load() != 10 {
			t.Errorf("10 tasks one after another: %d ran on %d workers; want 10 on 1", ran.Load(), n)
		}
		for range 3 {
			w.Go(true) // each holds its worker: the next starts another
		}
		synctest.Wait()
		if n := workerCount(); n != 3 {
			t.Errorf("3 blocked tasks run on %d workers; want 3", n)
		}
		close(release)
		time.Sleep(link.WorkerIdle + time.Millisecond)
		synctest.Wait()
		if n := workerCount(); n != 0 {
			t.Errorf("%d workers left after WorkerIdle idle; want 0", n)
		}
		w.Go(false)
		synctest.Wait()
		close(done)
		w.Wait()
		if ran.Load() != 14 {
			t.Errorf("%d tasks ran; want 14", ran.Load())
		}
	})
}

// workerCount counts the goroutines running a Workers' worker (other
// goroutines of the process, which may come and go, are not counted).
func workerCount() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "link.(*Workers[...]).worker(")
}
