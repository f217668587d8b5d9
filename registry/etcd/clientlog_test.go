package etcd_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/registry/etcd"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
)

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// clientLines returns the JSON log lines written by the etcd client.
func clientLines(s string) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["logger"] == "etcd-client" {
			out = append(out, m)
		}
	}
	return out
}

// TestEtcdClientWarningsReachTheLog: the registry's etcd client logs
// through the logger the registry is given (the hub's). With etcd frozen
// its calls fail, and the client's own warnings about them appear there,
// tagged logger=etcd-client. Under zap.NewNop nothing the client said was
// ever seen.
func TestEtcdClientWarningsReachTheLog(t *testing.T) {
	srv := etcdtest.Start(t)
	var buf lockedBuf
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	r, err := etcd.New(etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: "/clientlog/", OpTimeout: 500 * time.Millisecond}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	waitFor(t, "the registry to sync", 10*time.Second, func() bool { return r.Synced() })
	if n := len(clientLines(buf.String())); n != 0 {
		t.Logf("%d etcd client lines before the freeze:\n%s", n, buf.String())
	}
	srv.Pause()
	defer srv.Resume()
	waitFor(t, "a warning of the etcd client in the log", 15*time.Second, func() bool {
		for _, l := range clientLines(buf.String()) {
			if l["level"] == "WARN" || l["level"] == "ERROR" {
				return true
			}
		}
		return false
	})
	l := clientLines(buf.String())[0]
	t.Logf("first etcd client line: %v", l)
	if msg, _ := l["msg"].(string); msg == "" {
		t.Errorf("etcd client line without a message: %v", l)
	}
}
