package etcd

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"go.uber.org/zap"
)

// TestClientLoggerWritesThroughSlog: what the etcd client logs at warn and
// above reaches the registry's slog logger as one line with the client's
// message, logger=etcd-client and its fields; info and debug do not; a
// message repeated in a burst is logged at most 5 times per 10 s.
func TestClientLoggerWritesThroughSlog(t *testing.T) {
	var buf bytes.Buffer
	lg := clientLogger(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	// The call clientv3's lease.go makes when a keep-alive response finds
	// the consumer's channel full.
	lg.Warn("lease keepalive response queue is full; dropping response send",
		zap.Int("queue-size", 16), zap.Int("queue-capacity", 16))
	lg.Info("an info line")
	lg.Debug("a debug line")
	lg.With(zap.String("target", "etcd-endpoints://0x1/127.0.0.1:2379")).Error("an error line", zap.Error(errFake{}))
	for range 7 {
		lg.Warn("retrying of unary invoker failed")
	}

	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("not a JSON line: %q", l)
		}
		lines = append(lines, m)
	}
	if len(lines) != 1+1+5 {
		t.Fatalf("%d lines; want 7 (warn, error, 5 of 7 repeats):\n%s", len(lines), buf.String())
	}
	w := lines[0]
	if w["level"] != "WARN" || w["msg"] != "lease keepalive response queue is full; dropping response send" ||
		w["logger"] != "etcd-client" || w["queue-size"] != float64(16) || w["queue-capacity"] != float64(16) {
		t.Errorf("keep-alive warning logged as %v", w)
	}
	e := lines[1]
	if e["level"] != "ERROR" || e["msg"] != "an error line" || e["target"] != "etcd-endpoints://0x1/127.0.0.1:2379" || e["error"] != "fake" {
		t.Errorf("error logged as %v", e)
	}
	if strings.Contains(buf.String(), "info line") || strings.Contains(buf.String(), "debug line") {
		t.Errorf("info or debug lines of the etcd client reached the log:\n%s", buf.String())
	}
}

type errFake struct{}

func (errFake) Error() string { return "fake" }
