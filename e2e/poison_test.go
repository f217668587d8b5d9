package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/registry/etcd"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
)

// TestRegistryPoison (issue M9): three hubs with --auth-key on one etcd,
// an echo agent on hubs a and b, 100 calls/s through all three hubs. Then
// whoever can write the mesh's etcd prefix (but holds no auth key) writes
// every kind of poison: an instance of an unknown hub at a forged
// address, a forged hub with its own lease and an instance under it, a
// presence claiming hub b's id, an instance claiming hub b under hub b's
// own lease at a forged address, 10,000 junk records, a 1 MiB record,
// invalid JSON under every key family, a record re-using a live agent's
// id on a new key, and the live agent's and hub's own keys overwritten.
// The hubs stay up, no call reaches the forged endpoint, legitimate
// success stays >= 99.9 %, every bad record is counted; once the poison
// is removed every hub routes to every live agent within 2 s.
func TestRegistryPoison(t *testing.T) {
	srv := etcdtest.Start(t)
	au := newLabAuth(t)
	const prefix = "/poison/"
	common := []string{"--registry", "etcd", "--etcd-endpoints", srv.Endpoint, "--etcd-prefix", prefix, "--auth-key", au.keyFile}
	hubs := map[string]*hub{}
	for _, id := range []string{"hub-a", "hub-b", "hub-c"} {
		hubs[id] = startHub(t, append(common, "--id", id)...)
	}
	agentEnv := []string{"MESH_TOKEN=" + au.token}
	startWithEnv(t, agentEnv, "meshctl", "agent", "run", "echo", "--id", "echo-a", "--hub", hubs["hub-a"].ws)
	startWithEnv(t, agentEnv, "meshctl", "agent", "run", "echo", "--id", "echo-b", "--hub", hubs["hub-b"].ws)

	// The forged endpoint: any connection to it is a failure.
	forged, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer forged.Close()
	var reached atomic.Int64
	go func() {
		for {
			c, err := forged.Accept()
			if err != nil {
				return
			}
			reached.Add(1)
			c.Close()
		}
	}()
	fAddr := forged.Addr().String()

	clients := map[string]*mesh.Client{}
	for id, h := range hubs {
		c, err := mesh.NewClient([]string{h.ws}, mesh.WithToken(au.token))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients[id] = c
	}
	routesAll := func() bool {
		for _, c := range clients {
			for _, to := range []string{"echo-a", "echo-b"} {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				var got string
				err := c.Call(ctx, "echo.echo", to, &got, mesh.To(to))
				cancel()
				if err != nil || got != to {
					return false
				}
			}
		}
		return true
	}
	waitFor(t, "every hub to route to both agents", 10*time.Second, routesAll)

	// 100 calls/s of legitimate load, round robin over the hubs.
	var sent, ok atomic.Int64
	var mu sync.Mutex
	failed := map[string]int{}
	lctx, stopLoad := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		order := []*mesh.Client{clients["hub-a"], clients["hub-b"], clients["hub-c"]}
		for i := 0; ; i++ {
			select {
			case <-lctx.Done():
				return
			case <-tick.C:
			}
			c := order[i%3]
			wg.Go(func() {
				sent.Add(1)
				want := fmt.Sprintf(`{"i":%d}`, i)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				var got json.RawMessage
				err := c.Call(ctx, "echo.echo", json.RawMessage(want), &got)
				if err == nil && string(got) == want {
					ok.Add(1)
					return
				}
				mu.Lock()
				failed[envelope.CodeOf(err).String()+" "+string(got)]++
				mu.Unlock()
			})
		}
	})

	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	ctx := context.Background()
	grant, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	lease := grant.ID
	hubB, err := cli.Get(ctx, prefix+"hubs/hub-b")
	if err != nil || len(hubB.Kvs) != 1 {
		t.Fatalf("hub b's presence: %v %v", hubB, err)
	}
	bLease := clientv3.LeaseID(hubB.Kvs[0].Lease)
	inst := func(id, hub, addr string) string {
		v, _ := json.Marshal(map[string]any{"agentId": id, "name": "echo", "hub": hub, "hubAddr": addr,
			"capabilities": []string{"echo.echo"}, "heartbeatMs": 5000, "state": "ready", "hubEpoch": "forged"})
		return string(v)
	}
	presence := func(id string) string {
		v, _ := json.Marshal(map[string]any{"id": id, "addr": fAddr, "epoch": "forged"})
		return string(v)
	}
	type poison struct {
		key, val string
		lease    clientv3.LeaseID
		remove   bool // deleted when the poison is removed (the others are live keys, written back by their owners)
	}
	big := inst("big", "ghost", fAddr)
	big = big[:len(big)-1] + `,"metadata":"` + strings.Repeat("x", 1<<20) + `"}`
	poisons := []poison{
		{key: "instances/x", val: inst("x", "ghost", fAddr), remove: true},                                 // an unknown hub
		{key: "hubs/ghost", val: presence("ghost"), lease: lease, remove: true},                            // a forged hub...
		{key: "instances/ghost-echo", val: inst("ghost-echo", "ghost", fAddr), lease: lease, remove: true}, // ...and its instance
		{key: "hubs/evil", val: presence("hub-b"), lease: lease, remove: true},                             // another hub's id
		{key: "instances/y", val: inst("y", "hub-b", fAddr), lease: bLease, remove: true},                  // hub b's lease, forged address
		{key: "instances/big", val: big, lease: lease, remove: true},                                       // 1 MiB
		{key: "hubs/badjson", val: "{not json", lease: lease, remove: true},                                // invalid JSON, every family
		{key: "instances/badjson", val: "{not json", lease: lease, remove: true},
		{key: "other/badjson", val: "{not json", remove: true},
		{key: "instances/echo-copy", val: inst("echo-a", "hub-a", fAddr), lease: lease, remove: true}, // a live agent's id on a new key
		{key: "instances/echo-b", val: inst("echo-b", "hub-b", fAddr), lease: lease},                  // a live agent's own key
		{key: "hubs/hub-b", val: presence("hub-b"), lease: lease},                                     // a live hub's own key
	}
	time.Sleep(500 * time.Millisecond) // healthy load first
	poisoned := time.Now()
	for _, p := range poisons {
		var opts []clientv3.OpOption
		if p.lease != 0 {
			opts = append(opts, clientv3.WithLease(p.lease))
		}
		if _, err := cli.Put(ctx, prefix+p.key, p.val, opts...); err != nil {
			t.Fatalf("put %s: %v", p.key, err)
		}
	}
	const junk = 10_000
	var ops []clientv3.Op
	for i := range junk {
		id := "junk-" + strconv.Itoa(i)
		ops = append(ops, clientv3.OpPut(prefix+"instances/"+id, inst(id, "ghost", fAddr), clientv3.WithLease(lease)))
		if len(ops) == 100 {
			if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
				t.Fatal(err)
			}
			ops = ops[:0]
		}
	}
	t.Logf("poison written in %v", time.Since(poisoned).Round(time.Millisecond))
	time.Sleep(3 * time.Second) // load under the poison

	// Every bad record is counted on every hub.
	wantBad := float64(junk + len(poisons))
	for id, h := range hubs {
		if h.proc.exitedYet() {
			t.Fatalf("%s exited: %v", id, h.proc.err)
		}
		total := 0.0
		byReason := map[string]float64{}
		for _, r := range etcd.Reasons {
			v := metric(h.base, `agentmesh_registry_invalid_records_total{reason="`+r+`"}`)
			if v < 0 {
				t.Errorf("%s: no agentmesh_registry_invalid_records_total{reason=%q}", id, r)
			}
			if v > 0 {
				byReason[r] = v
			}
			total += max(v, 0)
		}
		t.Logf("%s refused %v records: %v; RSS %s", id, total, byReason, rss(h.proc.cmd.Process.Pid))
		if total < wantBad {
			t.Errorf("%s counted %v refused records; want at least %v", id, total, wantBad)
		}
	}

	// Remove the poison: every hub routes to every live agent within 2 s.
	for _, p := range poisons {
		if p.remove {
			if _, err := cli.Delete(ctx, prefix+p.key); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := cli.Delete(ctx, prefix+"instances/junk-", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	removed := time.Now()
	waitFor(t, "every hub to route to every live agent after the poison is removed", 2*time.Second, routesAll)
	t.Logf("every hub routes to both agents %v after the poison was removed", time.Since(removed).Round(time.Millisecond))
	time.Sleep(500 * time.Millisecond)
	stopLoad()
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	t.Logf("%d calls, %d succeeded, failed: %v; connections to the forged endpoint: %d", sent.Load(), ok.Load(), failed, reached.Load())
	if n := reached.Load(); n != 0 {
		t.Errorf("%d connections reached the forged endpoint; want 0", n)
	}
	if rate := float64(ok.Load()) / float64(sent.Load()); rate < 0.999 {
		t.Errorf("legitimate success %.2f%%; want >= 99.9%%", 100*rate)
	}
	for id, h := range hubs {
		if h.proc.exitedYet() {
			t.Errorf("%s exited: %v", id, h.proc.err)
		}
	}
}

// rss is a process's resident set size, as /proc says it.
func rss(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return "?"
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}
