package link

import (
	"sync"
	"time"
)

// Workers runs tasks on goroutines it keeps: an idle worker takes the
// next task, or a new one starts; a worker exits after WorkerIdle with
// nothing to do, or once done is closed. A new goroutine per task starts
// with a small stack that a deep call chain grows by copying, and its
// start and exit cost the scheduler a round each (a link keeps its own
// workers the same way; the hub keeps these for a plain JSON-RPC
// WebSocket's messages).
type Workers[T any] struct {
	work chan T
	run  func(T)
	done <-chan struct{}
	wg   sync.WaitGroup
}

// NewWorkers returns workers that run each task with run until done.
func NewWorkers[T any](done <-chan struct{}, run func(T)) *Workers[T] {
	return &Workers[T]{work: make(chan T), run: run, done: done}
}

// Go runs t on an idle worker, or on a new one.
func (w *Workers[T]) Go(t T) {
	select {
	case w.work <- t:
	default:
		w.wg.Add(1)
		go w.worker(t)
	}
}

// Wait waits for the workers to exit (after done is closed).
func (w *Workers[T]) Wait() { w.wg.Wait() }

func (w *Workers[T]) worker(t T) {
	defer w.wg.Done()
	idle := time.NewTimer(WorkerIdle)
	defer idle.Stop()
	var zero T
	for {
		w.run(t)
		t = zero // not kept while idle: a task may point into its message
		idle.Reset(WorkerIdle)
		select {
		case t = <-w.work:
		case <-idle.C:
			return
		case <-w.done:
			return
		}
	}
}
