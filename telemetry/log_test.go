package telemetry_test

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/agentmesh/agentmesh/telemetry"
)

func TestNewLogger(t *testing.T) {
	var buf bytes.Buffer
	l, err := telemetry.NewLogger(&buf, "warn")
	if err != nil {
		t.Fatal(err)
	}
	l.Info("hidden")
	l.Warn("shown", "k", 1)
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("log line %q is not one JSON object: %v", buf.String(), err)
	}
	if rec["msg"] != "shown" || rec["level"] != "WARN" || rec["k"] != 1.0 {
		t.Errorf("log record = %v", rec)
	}
	for _, lv := range []string{"debug", "info", "", "warning", "error", "ERROR"} {
		if _, err := telemetry.NewLogger(&buf, lv); err != nil {
			t.Errorf("NewLogger(%q) = %v", lv, err)
		}
	}
	if _, err := telemetry.NewLogger(&buf, "loud"); err == nil {
		t.Error(`NewLogger("loud") succeeded; want an error`)
	}
}
