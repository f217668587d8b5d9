package cli_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
)

// TestMeshctlStream: meshctl stream prints a streaming method's chunks,
// one per line with -o json, and a summary with -o pretty; a failing
// stream exits 1 with its code; bench --stream reports the chunks and the
// time to first chunk.
func TestMeshctlStream(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	m.RunAgent(t, agents.NewEcho())
	r := meshctl(t, "", "stream", "echo.stream", `{"n":3}`, "--hub", m.WS, "-o", "json")
	want := "{\"i\":1,\"pad\":\"\"}\n{\"i\":2,\"pad\":\"\"}\n{\"i\":3,\"pad\":\"\"}\n"
	if r.code != 0 || r.stdout != want {
		t.Fatalf("stream -o json: exit %d, %q (stderr %q); want %q", r.code, r.stdout, r.stderr, want)
	}
	r = meshctl(t, "", "stream", "echo.stream", `{"n":2,"intervalMs":10}`, "--hub", m.WS, "-o", "pretty", "--window", "1")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "[1] +") || !strings.Contains(r.stdout, "✅ Stream ended: 2 chunks in ") || !strings.Contains(r.stdout, `"chunks": 2`) {
		t.Fatalf("stream -o pretty: exit %d, %q", r.code, r.stdout)
	}
	r = meshctl(t, "", "stream", "echo.stream", `{"n":-1}`, "--hub", m.WS)
	if r.code != 1 || !strings.HasPrefix(r.stderr, "INVALID_PARAMS: ") {
		t.Fatalf("a refused stream: exit %d, stderr %q", r.code, r.stderr)
	}

	r = meshctl(t, "", "bench", "echo.stream", `{"n":100,"size":128}`, "--stream", "--hub", m.WS, "-c", "2", "-n", "20", "-o", "json")
	var rep struct {
		Count, Success int64
		Stream         struct {
			Chunks           int64
			ChunksPerSec     float64
			TimeToFirstChunk struct {
				P50 float64 `json:"50th"`
			}
		}
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rep) != nil {
		t.Fatalf("bench --stream: exit %d, %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if rep.Count != 20 || rep.Success != 20 || rep.Stream.Chunks != 2000 || rep.Stream.ChunksPerSec <= 0 || rep.Stream.TimeToFirstChunk.P50 <= 0 {
		t.Fatalf("bench --stream report: %+v; want 20 streams of 100 chunks, a rate, a time to first chunk", rep)
	}
	r = meshctl(t, "", "bench", "echo.stream", `{"n":10}`, "--stream", "--hub", m.WS, "-n", "3")
	if r.code != 0 || !strings.Contains(r.stdout, "Streams:\n  Chunks:\t30 (") || !strings.Contains(r.stdout, "Time to first chunk:") {
		t.Fatalf("bench --stream text: exit %d, %q", r.code, fmt.Sprint(r.stdout))
	}
}
