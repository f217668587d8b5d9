package bench

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// StreamStats collect what the streams of a run carried (meshctl bench
// --stream: each call is a stream read to its end). Safe for concurrent
// use.
type StreamStats struct {
	mu     sync.Mutex
	first  *hdrhistogram.Histogram // time to first chunk, ns
	chunks int64
	bytes  int64
	start  time.Time
}

// NewStreamStats starts collecting now.
func NewStreamStats() *StreamStats {
	return &StreamStats{first: hdrhistogram.New(1, maxLatency, 3), start: time.Now()}
}

// FirstChunk records a stream's time to its first chunk.
func (s *StreamStats) FirstChunk(d time.Duration) {
	s.mu.Lock()
	_ = s.first.RecordValue(min(max(d.Nanoseconds(), 1), maxLatency))
	s.mu.Unlock()
}

// Chunk counts a chunk of n bytes.
func (s *StreamStats) Chunk(n int) {
	s.mu.Lock()
	s.chunks++
	s.bytes += int64(n)
	s.mu.Unlock()
}

// StreamReport is the streams' part of a Report.
type StreamReport struct {
	Chunks       int64     `json:"chunks"`
	Bytes        int64     `json:"bytes"`
	ChunksPerSec float64   `json:"chunksPerSec"`
	MBPerSec     float64   `json:"mbPerSec"`
	FirstChunk   Latencies `json:"timeToFirstChunk"` // milliseconds
}

// Report summarises the streams over elapsed.
func (s *StreamStats) Report(elapsed time.Duration) *StreamReport {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.first
	r := &StreamReport{Chunks: s.chunks, Bytes: s.bytes}
	if sec := elapsed.Seconds(); sec > 0 {
		r.ChunksPerSec = float64(s.chunks) / sec
		r.MBPerSec = float64(s.bytes) / sec / 1e6
	}
	if h.TotalCount() > 0 {
		r.FirstChunk = Latencies{Min: float64(h.Min()) / 1e6, Mean: h.Mean() / 1e6, P50: q(h, 50), P90: q(h, 90), P95: q(h, 95),
			P99: q(h, 99), P999: q(h, 99.9), Max: float64(h.Max()) / 1e6}
	}
	return r
}

// print writes the streams' lines of the human report.
func (r *StreamReport) print(w io.Writer) {
	fmt.Fprintf(w, "\nStreams:\n  Chunks:\t%d (%.1f chunks/s, %.2f MB/s)\n", r.Chunks, r.ChunksPerSec, r.MBPerSec)
	fmt.Fprintf(w, "  Time to first chunk:\tp50 %s, p90 %s, p99 %s, max %s\n",
		fmtMs(r.FirstChunk.P50), fmtMs(r.FirstChunk.P90), fmtMs(r.FirstChunk.P99), fmtMs(r.FirstChunk.Max))
}
