package registry

import (
	"encoding/json"
	"testing"
	"time"
	"unsafe"
)

// TestInstancesShareWhatRepeats: two registrations of the same kind of
// agent, decoded apart (equal values in distinct memory), keep one copy of
// their name, capabilities and schemas; an instance's own fields stay its
// own, and its capability slice is not the caller's.
func TestInstancesShareWhatRepeats(t *testing.T) {
	reg := func(id string) Registration {
		var r Registration
		raw := `{"agentId":"` + id + `","name":"echo","capabilities":["echo.echo","echo.stream"],"schemas":{"echo.echo":{"description":"echoes"}}}`
		if err := json.Unmarshal([]byte(raw), &r); err != nil {
			t.Fatal(err)
		}
		r.HeartbeatInterval = time.Second
		return r
	}
	ra, rb := reg("a-1"), reg("b-2")
	a, b := NewInstance(ra, time.Now()), NewInstance(rb, time.Now())
	same := func(x, y string) bool { return unsafe.StringData(x) == unsafe.StringData(y) }
	if !same(a.Name, b.Name) || !same(a.Capabilities[0], b.Capabilities[0]) || !same(a.Capabilities[1], b.Capabilities[1]) {
		t.Error("the name or the capabilities are not shared")
	}
	if &a.Schemas[0] != &b.Schemas[0] {
		t.Error("the schemas are not shared")
	}
	if a.InstanceID == b.InstanceID || string(a.Schemas) != `{"echo.echo":{"description":"echoes"}}` {
		t.Errorf("instance fields: %q %q, schemas %s", a.InstanceID, b.InstanceID, a.Schemas)
	}
	ra.Capabilities[0] = "changed.after"
	if a.Capabilities[0] != "echo.echo" {
		t.Error("the instance's capabilities alias the caller's slice")
	}
}
