package etcd_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/registry/etcd"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
	"github.com/agentmesh/agentmesh/registry/registrytest"
)

// TestSchemasRoundTrip: the schemas an instance declares travel in its
// etcd record: another hub's view holds them byte for byte, and a
// re-registration that changes only the schemas replaces them there.
func TestSchemasRoundTrip(t *testing.T) {
	srv := etcdtest.Start(t)
	cfg := etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: "/schemas/", Hub: "hub-a"}
	a, err := etcd.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	cfg.Hub = "hub-b"
	b, err := etcd.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, schemas := range []string{
		`{"kv.get":{"description":"read","params":{"type":"object","required":["key"]}}}`,
		`{"kv.get":{"description":"read a key","params":{"type":"object","required":["key"]},"errors":["INVALID_PARAMS"]}}`,
	} {
		reg := registrytest.Reg("agent-on-a", "kv.*")
		reg.Hub = "hub-a"
		reg.Schemas = json.RawMessage(schemas)
		if _, err := a.Register(context.Background(), reg); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "hub b to see the schemas "+schemas, 5*time.Second, func() bool {
			in := b.Snapshot().Instance("agent-on-a")
			return in != nil && string(in.Schemas) == schemas
		})
		if got := a.Snapshot().Instance("agent-on-a").Schemas; string(got) != schemas {
			t.Errorf("hub a's own view holds schemas %s; want %s", got, schemas)
		}
	}
}
