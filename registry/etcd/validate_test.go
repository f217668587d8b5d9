package etcd_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/registry/etcd"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
	"github.com/agentmesh/agentmesh/registry/registrytest"
)

// refusals counts the reasons a registry reports through OnInvalid.
type refusals struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *refusals) add(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	r.n[reason]++
}

func (r *refusals) get(reason string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[reason]
}

func key(t *testing.T, b byte) auth.Key {
	t.Helper()
	return auth.Key{Secret: []byte(strings.Repeat(string(b), 32))}
}

func sealer(t *testing.T, keys ...auth.Key) *auth.Sealer {
	t.Helper()
	s, err := auth.NewSealer(keys)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newReg(t *testing.T, cfg etcd.Config) *etcd.Registry {
	t.Helper()
	r, err := etcd.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

func leaseOf(t *testing.T, cli *clientv3.Client, key string) clientv3.LeaseID {
	t.Helper()
	res, err := cli.Get(context.Background(), key)
	if err != nil || len(res.Kvs) != 1 {
		t.Fatalf("get %s: %v %v", key, res, err)
	}
	return clientv3.LeaseID(res.Kvs[0].Lease)
}

func record(id, hub string, extra map[string]any) string {
	m := map[string]any{"agentId": id, "name": "kv", "hub": hub, "capabilities": []string{"kv.*"},
		"heartbeatMs": 5000, "state": "ready", "hubEpoch": "e"}
	for k, v := range extra {
		m[k] = v
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// TestRecordsAreChecked: without a seal, records are still checked for
// form and ownership. Each bad record below is refused with its reason,
// and the view keeps only what hub a itself wrote.
func TestRecordsAreChecked(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := rawClient(t, srv)
	const p = "/checked/"
	var seen refusals
	a := newReg(t, etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: p, Hub: "hub-a", HubAddr: "127.0.0.1:7701"})
	b := newReg(t, etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: p, Hub: "hub-b", MaxInstancesPerHub: 3, OnInvalid: seen.add})
	if _, err := a.Register(context.Background(), registrytest.Reg("good", "kv.*")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to see a's agent", 5*time.Second, func() bool { return b.Snapshot().Instance("good") != nil })
	if got := b.Snapshot().Instance("good").HubAddr; got != "127.0.0.1:7701" {
		t.Errorf("a's agent is reached at %q; want hub a's address from its presence", got)
	}
	aLease := leaseOf(t, cli, p+"hubs/hub-a")
	ctx := context.Background()
	other, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		key, val string
		lease    clientv3.LeaseID
		reason   string
	}{
		{"instances/x", record("x", "ghost", nil), other.ID, etcd.ReasonNoHub},
		{"instances/y", record("y", "hub-a", nil), other.ID, etcd.ReasonNotOwner},
		{"instances/z", record("z", "hub-a", map[string]any{"hubAddr": "127.0.0.1:1"}), aLease, etcd.ReasonNotOwner},
		{"instances/copy", record("good", "hub-a", nil), aLease, etcd.ReasonIDMismatch},
		{"instances/big", record("big", "hub-a", map[string]any{"metadata": strings.Repeat("x", 100<<10)}), aLease, etcd.ReasonTooLarge},
		{"instances/j", "{", aLease, etcd.ReasonJSON},
		{"instances/s", record("s", "hub-a", map[string]any{"capabilities": []string{"a b"}}), aLease, etcd.ReasonSchema},
		{"instances/hb", record("hb", "hub-a", map[string]any{"heartbeatMs": 0}), aLease, etcd.ReasonSchema},
		{"hubs/evil", `{"id":"hub-a","epoch":"e","addr":"127.0.0.1:1"}`, other.ID, etcd.ReasonIDMismatch},
		{"hubs/nolease", `{"id":"nolease","epoch":"e","addr":"127.0.0.1:1"}`, 0, etcd.ReasonNoLease},
		{"hubs/badaddr", `{"id":"badaddr","epoch":"e","addr":"not an address"}`, other.ID, etcd.ReasonSchema},
		{"other/k", "x", 0, etcd.ReasonUnknownKey},
		{"instances/" + strings.Repeat("k", 100<<10), record("k", "hub-a", nil), aLease, etcd.ReasonBadKey},
		{"instances/sp ace", record("sp ace", "hub-a", nil), aLease, etcd.ReasonBadKey},
	}
	for _, c := range cases {
		var opts []clientv3.OpOption
		if c.lease != 0 {
			opts = append(opts, clientv3.WithLease(c.lease))
		}
		before := seen.get(c.reason)
		if _, err := cli.Put(ctx, p+c.key, c.val, opts...); err != nil {
			t.Fatal(err)
		}
		waitFor(t, c.key+" refused as "+c.reason, 5*time.Second, func() bool { return seen.get(c.reason) > before })
	}
	if n := len(b.Snapshot().Instances()); n != 1 {
		t.Errorf("b's view holds %d instances; want a's one agent", n)
	}
	// hub a's epoch in b's view was not replaced by hubs/evil's claim:
	// its agent is still routable.
	if b.Snapshot().Instance("good") == nil {
		t.Error("a's agent left b's view")
	}
	// Bounds: b keeps at most 3 of hub a's instances.
	for _, id := range []string{"m1", "m2", "m3"} {
		if _, err := a.Register(ctx, registrytest.Reg(id, "kv.*")); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the 4th instance of hub a refused as over_limit", 5*time.Second, func() bool { return seen.get(etcd.ReasonOverLimit) > 0 })
	if n := len(b.Snapshot().Instances()); n != 3 {
		t.Errorf("b's view holds %d instances of hub a; want 3 (the bound)", n)
	}
	// A relist (after an outage) applies the same checks.
	srv.Pause()
	time.Sleep(1500 * time.Millisecond) // the probe notices (1 s)
	srv.Resume()
	waitFor(t, "b synced again", 10*time.Second, b.Synced)
	if n := len(b.Snapshot().Instances()); n != 3 {
		t.Errorf("after a relist b's view holds %d instances; want 3", n)
	}
}

// TestSealedRecords: with a Sealer, a record no hub of the mesh wrote is
// refused even when it is well formed, under the right lease and names
// the right hub; one sealed with another key, or moved to another key,
// too.
func TestSealedRecords(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := rawClient(t, srv)
	const p = "/sealed/"
	k1 := key(t, 'a')
	var seen refusals
	a := newReg(t, etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: p, Hub: "hub-a", HubAddr: "127.0.0.1:7701", Sealer: sealer(t, k1)})
	b := newReg(t, etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: p, Hub: "hub-b", Sealer: sealer(t, k1), OnInvalid: seen.add})
	if _, err := a.Register(context.Background(), registrytest.Reg("good", "kv.*")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to see a's agent", 5*time.Second, func() bool { return b.Snapshot().Instance("good") != nil })
	ctx := context.Background()
	aLease := leaseOf(t, cli, p+"hubs/hub-a")
	good, err := cli.Get(ctx, p+"instances/good")
	if err != nil || len(good.Kvs) != 1 {
		t.Fatal(err)
	}
	sealedGood := string(good.Kvs[0].Value)
	// Another mesh's key seals a record for the same key.
	foreign := sealer(t, key(t, 'z')).Seal([]byte(p + "instances/f\x00" + record("f", "hub-a", map[string]any{"hubEpoch": a.Epoch()})))
	fv := record("f", "hub-a", map[string]any{"hubEpoch": a.Epoch()})
	fv = fv[:len(fv)-1] + `,"seal":"` + foreign + `"}`
	cases := []struct{ key, val, reason string }{
		{"instances/u", record("u", "hub-a", map[string]any{"hubEpoch": a.Epoch()}), etcd.ReasonUnsealed},
		{"instances/f", fv, etcd.ReasonUnknownSealKey},
		{"instances/moved", strings.Replace(sealedGood, `"agentId":"good"`, `"agentId":"moved"`, 1), etcd.ReasonBadSeal},
		{"instances/good2", sealedGood, etcd.ReasonBadSeal}, // a valid seal, for another key
	}
	for _, c := range cases {
		before := seen.get(c.reason)
		if _, err := cli.Put(ctx, p+c.key, c.val, clientv3.WithLease(aLease)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, c.key+" refused as "+c.reason, 5*time.Second, func() bool { return seen.get(c.reason) > before })
	}
	if n := len(b.Snapshot().Instances()); n != 1 {
		t.Errorf("b's view holds %d instances; want a's one agent", n)
	}
	// a's own sealed record put back under another lease (a replay: it
	// would outlive a's session) is refused, and a writes its own back.
	other, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	before := seen.get(etcd.ReasonBadSeal)
	if _, err := cli.Put(ctx, p+"instances/good", sealedGood, clientv3.WithLease(other.ID)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the replay under another lease refused as bad_seal", 5*time.Second, func() bool { return seen.get(etcd.ReasonBadSeal) > before })
	waitFor(t, "a's record written back under a's lease, routable on b", 2*time.Second, func() bool {
		return leaseOf(t, cli, p+"instances/good") == aLease && len(b.Snapshot().Lookup("kv.get")) == 1
	})
}

// TestRefusedUpdateLeavesTheView: an instance whose key comes to hold a
// record this hub refuses leaves its view, as a listing would drop it
// (the view does not depend on watch or list); once the key holds a
// valid record again it is back.
func TestRefusedUpdateLeavesTheView(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := rawClient(t, srv)
	const p = "/refused/"
	a := newReg(t, etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: p, Hub: "hub-a", HubAddr: "127.0.0.1:7701"})
	b := newReg(t, etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: p, Hub: "hub-b"})
	if _, err := a.Register(context.Background(), registrytest.Reg("x", "kv.*")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to see x", 5*time.Second, func() bool { return b.Snapshot().Instance("x") != nil })
	// A record naming a hub that is not present: refused (no_hub), and
	// not one a hub repairs (it may be a hub's whose presence lags).
	if _, err := cli.Put(context.Background(), p+"instances/x", record("x", "ghost", nil)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to drop x", 2*time.Second, func() bool { return b.Snapshot().Instance("x") == nil })
	if _, err := cli.Delete(context.Background(), p+"instances/x"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "x back on b once a wrote its key again", 2*time.Second, func() bool { return b.Snapshot().Instance("x") != nil })
}

// TestOwnKeysWrittenBack: a hub whose presence or agent key is
// overwritten or deleted by someone else writes it back, and the other
// hubs route to its agent again.
func TestOwnKeysWrittenBack(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := rawClient(t, srv)
	const p = "/back/"
	k := key(t, 'a')
	a := newReg(t, etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: p, Hub: "hub-a", HubAddr: "127.0.0.1:7701", Sealer: sealer(t, k)})
	b := newReg(t, etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: p, Hub: "hub-b", Sealer: sealer(t, k)})
	if _, err := a.Register(context.Background(), registrytest.Reg("good", "kv.*")); err != nil {
		t.Fatal(err)
	}
	routable := func() bool { return len(b.Snapshot().Lookup("kv.get")) == 1 }
	waitFor(t, "b to route to a's agent", 5*time.Second, routable)
	ctx := context.Background()
	sealedBy := func(k string) bool {
		res, err := cli.Get(ctx, p+k)
		return err == nil && len(res.Kvs) == 1 && strings.Contains(string(res.Kvs[0].Value), `"seal":"`)
	}
	for _, step := range []struct {
		what string
		do   func() error
	}{
		{"agent key overwritten", func() error {
			_, err := cli.Put(ctx, p+"instances/good", record("good", "hub-a", map[string]any{"hubAddr": "127.0.0.1:1"}))
			return err
		}},
		{"agent key deleted", func() error { _, err := cli.Delete(ctx, p+"instances/good"); return err }},
		{"presence overwritten", func() error {
			_, err := cli.Put(ctx, p+"hubs/hub-a", `{"id":"hub-a","epoch":"x","addr":"127.0.0.1:1"}`)
			return err
		}},
		{"presence deleted", func() error { _, err := cli.Delete(ctx, p+"hubs/hub-a"); return err }},
	} {
		if err := step.do(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		waitFor(t, step.what+": written back", 2*time.Second, func() bool {
			return sealedBy("instances/good") && sealedBy("hubs/hub-a") && routable()
		})
		t.Logf("%s: written back and routable on b after %v", step.what, time.Since(start).Round(time.Millisecond))
	}
}

// TestKeyRotationReseals: the mesh's key is rotated (the new key added
// everywhere, made first, the old one dropped); a hub that joins with the
// new key alone sees the agents written under the old one, because their
// hub sealed its records again when its keys changed.
func TestKeyRotationReseals(t *testing.T) {
	srv := etcdtest.Start(t)
	const p = "/rotate/"
	k1, k2 := key(t, '1'), key(t, '2')
	sa := sealer(t, k1)
	a := newReg(t, etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: p, Hub: "hub-a", HubAddr: "127.0.0.1:7701", Sealer: sa})
	if _, err := a.Register(context.Background(), registrytest.Reg("good", "kv.*")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a synced", 5*time.Second, a.Synced)
	if err := sa.SetKeys([]auth.Key{k2, k1}); err != nil {
		t.Fatal(err)
	}
	if err := a.Reseal(context.Background()); err != nil {
		t.Fatal(err)
	}
	c := newReg(t, etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: p, Hub: "hub-c", Sealer: sealer(t, k2)})
	waitFor(t, "a hub with the new key alone to see a's agent", 5*time.Second, func() bool { return len(c.Snapshot().Lookup("kv.get")) == 1 })
}

// TestListInPages: a listing reads the prefix a page at a time, at one
// revision; a hub that joins sees every instance of a hub with more than
// a page of them, and refuses a record too large without holding it.
func TestListInPages(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := rawClient(t, srv)
	const p = "/pages/"
	a := newReg(t, etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: p, Hub: "hub-a", HubAddr: "127.0.0.1:7701"})
	const n = 600 // over two pages of 256
	for i := range n {
		if _, err := a.Register(context.Background(), registrytest.Reg(fmt.Sprintf("agent-%03d", i), "kv.*")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Put(context.Background(), p+"instances/zz-big", record("zz-big", "hub-a", map[string]any{"metadata": strings.Repeat("x", 1<<20)})); err != nil {
		t.Fatal(err)
	}
	var seen refusals
	c := newReg(t, etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: p, Hub: "hub-c", OnInvalid: seen.add})
	waitFor(t, "c to list every instance of a", 10*time.Second, func() bool { return len(c.Snapshot().Lookup("kv.get")) == n })
	if seen.get(etcd.ReasonTooLarge) != 1 {
		t.Errorf("too_large refusals: %d; want 1", seen.get(etcd.ReasonTooLarge))
	}
}
