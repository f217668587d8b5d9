package e2e_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/internal/faultproxy"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
	"github.com/agentmesh/agentmesh/telemetry"
)

// queueFullMsg is what etcd's client logs (at warn) when a lease
// keep-alive response finds its consumer's channel full: S06 wants none.
// meshd's etcd client logs through meshd's own log (registry/etcd
// clientLogger), one JSON line each on stderr, tagged logger=etcd-client.
const queueFullMsg = "keepalive response queue is full"

// linesContaining returns the lines of out that contain s, whatever their
// format (a JSON log line, or anything else a process wrote).
func linesContaining(out, s string) []string {
	var ls []string
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), s) {
			ls = append(ls, sc.Text())
		}
	}
	return ls
}

// etcdClientLines returns meshd's JSON log lines written by its etcd client.
func etcdClientLines(out string) []map[string]any {
	var ls []map[string]any
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["logger"] == "etcd-client" {
			ls = append(ls, m)
		}
	}
	return ls
}

// TestQueueFullLineDetected: S06's check finds the etcd client's
// "keepalive response queue is full" line in a hub log as meshd writes it
// (its JSON handler, the etcd client's message and fields), among other
// lines, and finds nothing in a log without it.
func TestQueueFullLineDetected(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	log, err := telemetry.NewLoggerFormat(&buf, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("listening", "addr", "127.0.0.1:7070")
	log.Warn("retrying of unary invoker failed", "logger", "etcd-client", "method", "/etcdserverpb.KV/Range", "attempt", 0)
	log.Warn("etcd registry: etcd unreachable; routing with what is known", "error", "context deadline exceeded")
	clean := buf.String()
	log.LogAttrs(t.Context(), slog.LevelWarn, "lease keepalive response queue is full; dropping response send",
		slog.String("logger", "etcd-client"), slog.Int("queue-size", 16), slog.Int("queue-capacity", 16))
	log.Info("after")
	dirty := buf.String()

	if got := linesContaining(clean, queueFullMsg); len(got) != 0 {
		t.Errorf("found %q in a log without it: %q", queueFullMsg, got)
	}
	got := linesContaining(dirty, queueFullMsg)
	if len(got) != 1 {
		t.Fatalf("found %d lines with %q in:\n%s\nwant 1", len(got), queueFullMsg, dirty)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(got[0]), &m); err != nil || m["logger"] != "etcd-client" || m["level"] != "WARN" {
		t.Errorf("the line found is %q (%v); want the etcd client's JSON warning", got[0], err)
	}
	if n := len(etcdClientLines(dirty)); n != 2 {
		t.Errorf("%d etcd client lines; want 2", n)
	}
}

// TestMeshdLogsEtcdClientWarnings: meshd's etcd client writes its
// warnings to meshd's log (stderr, where the e2e tests read it, and S06
// looks for queueFullMsg). A hub reaching etcd through a proxy is cut
// from it: its etcd client's warnings about the failing calls appear as
// JSON lines tagged logger=etcd-client. (With the client's logger a
// zap.NewNop, as before, the cut left no such line.)
func TestMeshdLogsEtcdClientWarnings(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	proxy, err := faultproxy.New(t.Context(), strings.TrimPrefix(srv.Endpoint, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	h := hubAt(t, freeAddr(t), "--id", "hub-log", "--registry", "etcd", "--etcd-endpoints", "http://"+proxy.Addr(), "--etcd-prefix", "/etcdlog/")
	if n := len(etcdClientLines(h.proc.stderr.String())); n != 0 {
		t.Logf("%d etcd client lines before the cut", n)
	}
	proxy.Blackhole()
	cut := time.Now()
	var warned []map[string]any
	waitFor(t, "an etcd client warning in meshd's log", 20*time.Second, func() bool {
		warned = warned[:0]
		for _, l := range etcdClientLines(h.proc.stderr.String()) {
			if l["level"] == "WARN" || l["level"] == "ERROR" {
				warned = append(warned, l)
			}
		}
		return len(warned) > 0
	})
	proxy.Unblackhole()
	t.Logf("%v after the cut, meshd's log has %d etcd client warnings; the first: %v", time.Since(cut).Round(time.Millisecond), len(warned), warned[0])
}
