package bench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/bench"
)

func TestClosedLoopCountsExactly(t *testing.T) {
	var calls atomic.Int64
	var conns [3]atomic.Int64
	rep, err := bench.Run(context.Background(), bench.Config{Method: "m", Concurrency: 8, Total: 1000}, 3,
		func(ctx context.Context, i int, req *envelope.Request) error {
			conns[i].Add(1)
			if n := calls.Add(1); n%10 == 0 {
				return envelope.NewError(envelope.CodeOverloaded, "x")
			}
			if req.Headers.Traceparent == "" || len(req.Headers.TraceID) != 32 {
				t.Errorf("request without a trace context: %+v", req.Headers)
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Count != 1000 || calls.Load() != 1000 || rep.Succeeded != 900 || rep.Errors["OVERLOADED"] != 100 {
		t.Errorf("count %d calls %d ok %d errors %v; want 1000, 1000, 900, 100 OVERLOADED", rep.Count, calls.Load(), rep.Succeeded, rep.Errors)
	}
	for i := range conns {
		if conns[i].Load() < 300 {
			t.Errorf("connection %d got %d calls; want them spread", i, conns[i].Load())
		}
	}
	if len(rep.Slowest) != 5 || rep.Latencies.P50 <= 0 || rep.Latencies.Max < rep.Latencies.P99 {
		t.Errorf("report %+v", rep)
	}
}

func TestOpenLoopMeasuresFromIntendedStart(t *testing.T) {
	// A server that stalls 200ms once: an open loop must charge the stall
	// to every call scheduled during it, not just the one that hit it.
	var n atomic.Int64
	rep, err := bench.Run(context.Background(), bench.Config{Method: "m", Concurrency: 1, RPS: 100, Duration: time.Second}, 1,
		func(ctx context.Context, i int, req *envelope.Request) error {
			if n.Add(1) == 10 {
				time.Sleep(200 * time.Millisecond)
			}
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Count < 90 || rep.Count > 101 {
		t.Errorf("count %d; want about 100 at 100/s for 1s", rep.Count)
	}
	// With one slot, ~20 calls were due during the stall: p90 must see it.
	if rep.Latencies.P90 < 50 {
		t.Errorf("p90 %.1fms; want the stall charged to the calls queued behind it (coordinated omission)", rep.Latencies.P90)
	}
	if rep.Missed == 0 || rep.Mode != "open loop" {
		t.Errorf("missed %d, mode %q; want late sends reported in an open loop", rep.Missed, rep.Mode)
	}
}

func TestBounds(t *testing.T) {
	rep := &bench.Report{Count: 1000, Succeeded: 990, RPS: 5000, Latencies: bench.Latencies{P50: 1, P99: 25, Max: 40}}
	bounds, err := bench.ParseBounds("p99>20ms, errors>0.5%, rps<1000, p50>=1ms, max>1s")
	if err != nil {
		t.Fatal(err)
	}
	broken := rep.Broken(bounds)
	if len(broken) != 3 || !strings.HasPrefix(broken[0], "p99>20ms") || !strings.HasPrefix(broken[1], "errors>0.5%") || !strings.HasPrefix(broken[2], "p50>=1ms") {
		t.Errorf("broken = %v; want p99, errors and p50", broken)
	}
	for _, bad := range []string{"p99", "p99>", "p99>fast", "latency>1ms", "errors>x"} {
		if _, err := bench.ParseBounds(bad); err == nil {
			t.Errorf("ParseBounds(%q) accepted it", bad)
		}
	}
}

func TestReportJSONRoundTripAndCompare(t *testing.T) {
	rep, _ := bench.Run(context.Background(), bench.Config{Method: "m", Concurrency: 2, Total: 50}, 1,
		func(ctx context.Context, i int, req *envelope.Request) error { return nil })
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(rep); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"latencies"`, `"50th"`, `"99th"`, `"rps"`, `"errorDistribution"`, `"histogram"`, `"slowest"`} {
		if !strings.Contains(buf.String(), key) {
			t.Errorf("JSON report lacks %s", key)
		}
	}
	old, err := bench.ReadReport(&buf)
	if err != nil || old.Count != 50 {
		t.Fatalf("ReadReport = %+v, %v", old, err)
	}
	var out bytes.Buffer
	rep.Compare(&out, old)
	if !strings.Contains(out.String(), "p99") || !strings.Contains(out.String(), "rps") {
		t.Errorf("compare output %q", out.String())
	}
	out.Reset()
	rep.Print(&out, "http://jaeger:16686")
	if !strings.Contains(out.String(), "Requests/sec") || !strings.Contains(out.String(), "http://jaeger:16686/trace/") {
		t.Errorf("report text %q", out.String())
	}
	var hdr bytes.Buffer
	if err := rep.WriteHDR(&hdr); err != nil || !strings.Contains(hdr.String(), "Percentile") {
		t.Errorf("HDR output %q, %v", hdr.String(), err)
	}
}
