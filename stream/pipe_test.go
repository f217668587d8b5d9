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
	p := stream.NewPipe(4)
	var grants []uint64
	if c := p.Attach(func(n uint64) { grants = append(grants, n) }); c != 4 {
		t.Fatalf("initial credit %d; want 4", c)
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
	if c, _ := p.Next(ctx); string(c) != "1" || len(grants) != 1 || grants[0] != 2 {
		t.Fatalf("second read: %s, grants %v; want 1 and a grant of 2", c, grants)
	}
	p.Attach(nil)
	p.Next(ctx)
	p.Next(ctx) // a grant of 2 with nothing attached
	if c := p.Attach(func(uint64) {}); c != 4 {
		t.Fatalf("credit at a new attach: %d; want 4 (all read, none received since)", c)
	}
}

// TestPipeEnd: the chunks received before the end are read first, then
// io.EOF (a clean end, with its result) or the stream's error; a reader
// whose context ends stops waiting; a chunk after the end is refused.
func TestPipeEnd(t *testing.T) {
	ctx := context.Background()
	p := stream.NewPipe(0)
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

	p = stream.NewPipe(0)
	_ = p.Chunk([]byte("a"))
	p.Finish(nil, envelope.NewError(envelope.CodeUnavailable, "lost"))
	p.Next(ctx)
	if _, err := p.Next(ctx); envelope.CodeOf(err) != envelope.CodeUnavailable {
		t.Fatalf("%v; want the stream's error after its chunk", err)
	}

	p = stream.NewPipe(0)
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
	p := stream.NewPipe(2)
	ctx, c := stream.Count(stream.With(context.Background(), p))
	sink := stream.From(ctx)
	var granted uint64
	granted += sink.Attach(func(n uint64) { granted += n })
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
