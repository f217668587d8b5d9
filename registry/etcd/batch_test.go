package etcd_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/registry/etcd"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
	"github.com/agentmesh/agentmesh/registry/registrytest"
)

// TestRegistrationsGroupCommitted: a storm of registrations on one hub
// reaches etcd in far fewer transactions than registrations (the writes
// queued while one transaction commits go in the next), every one of
// them lands, and another hub sees them all; deregistrations likewise,
// each keeping its own ownership check.
func TestRegistrationsGroupCommitted(t *testing.T) {
	srv := etcdtest.Start(t)
	cfg := etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: "/batch/", Hub: "hub-a"}
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
	const n = 400
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			reg := registrytest.Reg(fmt.Sprintf("storm-%d", i), "storm.call")
			if _, err := a.Register(ctx, reg); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	txns, writes := a.Commits()
	t.Logf("%d registrations: %d writes in %d transactions", n, writes, txns)
	if writes < n || txns > n/4 {
		t.Errorf("%d writes in %d transactions; want all %d, in at most %d", writes, txns, n, n/4)
	}
	waitFor(t, "hub b to see every registration", 10*time.Second, func() bool { return len(b.Snapshot().Lookup("storm.call")) == n })
	for i := range n / 2 {
		wg.Go(func() {
			if err := a.Deregister(ctx, fmt.Sprintf("storm-%d", i)); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	waitFor(t, "hub b to see half of them go", 10*time.Second, func() bool { return len(b.Snapshot().Lookup("storm.call")) == n/2 })
}
