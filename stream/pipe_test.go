package stream_test

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/stream"
)

// TestPipeCredit: a pipe grants its window, refuses a chunk beyond it,
// and grants half the window again once half of it was read (not per
// chunk); a grant made while nothing is attached is handed over at the
// next Attach.
func TestPipeCredit(t *testing.T) {
	p := stream.NewPipe(stream.Window{Chunks: 4})
	var grants []stream.Credit
	if c := p.Attach(func(n stream.Credit) { grants = append(grants, n) }); c != (stream.Credit{Chunks: 4, Bytes: stream.DefaultWindowBytes}) {
		t.Fatalf("initial credit %+v; want 4 chunks and the default byte window", c)
	}
	for i := range 4 {
		if err := p.Chunk([]byte{'0' + byte(i)}); err != nil {
			t.Fatalf("chunk %d within the credit: %v", i+1, err)
		}
	}
	if err := p.Chunk([]byte("5")); err == nil || err.Code != envelope.CodeInternal {
		t.Fatalf("a chunk beyond the credit: %v; want INTERNAL", err)
	}
	ctx := context.Background()
	if c, _ := p.Next(ctx); string(c) != "0" || len(grants) != 0 {
		t.Fatalf("first read: %s, grants %v; want 0 and no grant yet", c, grants)
	}
	if c, _ := p.Next(ctx); string(c) != "1" || len(grants) != 1 || grants[0] != (stream.Credit{Chunks: 2, Bytes: 2}) {
		t.Fatalf("second read: %s, grants %v; want 1 and a grant of 2 chunks of 2 bytes", c, grants)
	}
	p.Attach(nil)
	p.Next(ctx)
	p.Next(ctx) // a grant of 2 with nothing attached
	if c := p.Attach(func(stream.Credit) {}); c.Chunks != 4 {
		t.Fatalf("credit at a new attach: %+v; want 4 chunks (all read, none received since)", c)
	}
}

// TestPipeByteWindow: a pipe with a byte window refuses a chunk once the
// bytes received reach it (a chunk may overshoot it by its own size), and
// grants bytes back once half the window was read.
func TestPipeByteWindow(t *testing.T) {
	p := stream.NewPipe(stream.Window{Chunks: 100, Bytes: 10})
	var grants []stream.Credit
	p.Attach(func(n stream.Credit) { grants = append(grants, n) })
	if err := p.Chunk([]byte("123456")); err != nil {
		t.Fatal(err)
	}
	if err := p.Chunk([]byte("123456")); err != nil {
		t.Fatalf("a chunk that overshoots the byte window: %v; want it taken (6 of 10 bytes used before it)", err)
	}
	if err := p.Chunk([]byte("1")); err == nil {
		t.Fatal("a chunk past the byte window (12 of 10 bytes used) was taken")
	}
	p.Next(context.Background())
	if len(grants) != 1 || grants[0] != (stream.Credit{Chunks: 1, Bytes: 6}) {
		t.Fatalf("after reading 6 of 10 bytes: grants %v; want 1 chunk, 6 bytes", grants)
	}
}

// TestPipeEnd: the chunks received before the end are read first, then
// io.EOF (a clean end, with its result) or the stream's error; a reader
// whose context ends stops waiting; a chunk after the end is refused.
func TestPipeEnd(t *testing.T) {
	ctx := context.Background()
	p := stream.NewPipe(stream.Window{})
	_ = p.Chunk([]byte("a"))
	p.Finish(&envelope.Response{Result: []byte(`{"chunks":1}`)}, nil)
	if c, err := p.Next(ctx); string(c) != "a" || err != nil {
		t.Fatalf("%s %v; want the chunk before the end", c, err)
	}
	if _, err := p.Next(ctx); err != io.EOF || string(p.Result().Result) != `{"chunks":1}` {
		t.Fatalf("%v, %v; want io.EOF and the result", err, p.Result())
	}
	if err := p.Chunk([]byte("b")); err == nil {
		t.Fatal("a chunk after the end was taken")
	}

	p = stream.NewPipe(stream.Window{})
	_ = p.Chunk([]byte("a"))
	p.Finish(nil, envelope.NewError(envelope.CodeUnavailable, "lost"))
	p.Next(ctx)
	if _, err := p.Next(ctx); envelope.CodeOf(err) != envelope.CodeUnavailable {
		t.Fatalf("%v; want the stream's error after its chunk", err)
	}

	p = stream.NewPipe(stream.Window{})
	cctx, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if _, err := p.Next(cctx); envelope.CodeOf(err) != envelope.CodeTimeout {
		t.Fatalf("%v; want TIMEOUT from the reader's context", err)
	}
}

// TestCounter: a Counter counts what goes through to its sink, the
// credit passed to its producer, and a stall each time the producer uses
// it up (after its first chunk).
func TestCounter(t *testing.T) {
	p := stream.NewPipe(stream.Window{Chunks: 2})
	ctx, c := stream.Count(stream.With(context.Background(), p))
	sink := stream.From(ctx)
	var granted uint64
	granted += sink.Attach(func(n stream.Credit) { granted += n.Chunks }).Chunks
	_ = sink.Chunk([]byte("ab"))
	_ = sink.Chunk([]byte("cde")) // uses up the credit of 2: a stall
	p.Next(ctx)                   // grants 1
	_ = sink.Chunk([]byte("f"))   // uses it up: another
	chunks, bytes, first, stalls := c.Stats()
	if chunks != 3 || bytes != 6 || first <= 0 || stalls != 2 || granted != 3 {
		t.Fatalf("chunks %d bytes %d first %v stalls %d granted %d; want 3, 6, >0, 2, 3", chunks, bytes, first, stalls, granted)
	}
	if _, none := stream.Count(context.Background()); none != nil {
		t.Fatal("Count made a counter without a sink")
	}
}
