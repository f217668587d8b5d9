package e2e_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/freeport"
	"github.com/agentmesh/agentmesh/mesh"
)

// Helpers of the fault-proxy scenarios (S05, S06, S07): hubs on fixed
// loopback ports so that a proxy can sit in front of them, their logs and
// metrics read back, and etcd's view to compare the hubs' with.

// freeAddr returns a loopback host:port nothing listens on, from below the
// ephemeral range (see freeport): another process binds it.
func freeAddr(t *testing.T) string {
	t.Helper()
	return freeport.Addr(t)
}

// writeFile writes a temporary file and returns its path.
func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// hubAt runs meshd on addr and waits until /readyz answers 200.
func hubAt(t *testing.T, addr string, args ...string) *hub {
	t.Helper()
	return hubAtEnv(t, nil, addr, args...)
}

// hubAtEnv is hubAt with extra environment variables.
func hubAtEnv(t *testing.T, extraEnv []string, addr string, args ...string) *hub {
	t.Helper()
	p := startWithEnv(t, extraEnv, "meshd", append([]string{"--listen", addr}, args...)...)
	h := &hub{proc: p, addr: addr, ws: "ws://" + addr + "/ws", base: "http://" + addr}
	client := &http.Client{Timeout: time.Second}
	waitFor(t, "meshd on "+addr+" ready", 15*time.Second, func() bool {
		if p.exitedYet() {
			t.Fatalf("meshd exited early (%v):\n%s", p.err, p.stderr.String())
		}
		return httpStatus(client, h.base+"/readyz") == http.StatusOK
	})
	return h
}

// logLine is one JSON log line of meshd.
type logLine struct {
	Time time.Time      `json:"time"`
	Msg  string         `json:"msg"`
	Raw  map[string]any `json:"-"`
}

// logTimes returns the times of p's log lines with message msg, at or
// after since.
func logTimes(p *proc, msg string, since time.Time) []time.Time {
	var out []time.Time
	sc := bufio.NewScanner(strings.NewReader(p.stderr.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l logLine
		if json.Unmarshal(sc.Bytes(), &l) == nil && l.Msg == msg && !l.Time.Before(since) {
			out = append(out, l.Time)
		}
	}
	return out
}

// countLog counts p's log lines containing s.
func countLog(p *proc, s string) int {
	return strings.Count(p.stderr.String(), s)
}

// metric returns the value of the sample named exactly series (name and
// labels as Prometheus prints them) on base's /metrics, or -1.
func metric(base, series string) float64 {
	c := &http.Client{Timeout: time.Second}
	req, err := http.NewRequest(http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return -1
	}
	if adminToken != "" { // with --auth-key, /metrics needs an admin token
		req.Header.Set("Authorization", "Bearer "+adminToken)
	}
	res, err := c.Do(req)
	if err != nil {
		return -1
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	for line := range strings.SplitSeq(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// etcdInstances lists the instance ids stored under prefix.
func etcdInstances(ctx context.Context, endpoint, prefix string) ([]string, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	res, err := cli.Get(ctx, prefix+"instances/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, kv := range res.Kvs {
		ids = append(ids, strings.TrimPrefix(string(kv.Key), prefix+"instances/"))
	}
	slices.Sort(ids)
	return ids, nil
}

// adminToken is the bearer token hubInstances presents: empty, except in
// the network lab's tests, whose hubs run with --auth-key.
var adminToken string

// hubInstances is what mesh.agents on the hub at ws lists, sorted.
func hubInstances(ctx context.Context, ws string) ([]string, error) {
	c, err := mesh.NewClient([]string{ws}, mesh.WithoutReliability(), mesh.WithToken(adminToken))
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return agentsOf(ctx, c)
}

// agentsOf is what mesh.agents through c lists, sorted.
func agentsOf(ctx context.Context, c *mesh.Client) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var list []control.AgentInfo
	if err := c.Call(ctx, "mesh.agents", nil, &list); err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(list))
	for _, a := range list {
		ids = append(ids, a.AgentID)
	}
	slices.Sort(ids)
	return ids, nil
}

// call is one request of a scenario's load as the test saw it: which client
// sent it, what came back and when (besides the ledger's own record).
type call struct {
	Client   string
	Method   string
	Intended time.Time
	Start    time.Time // when it was actually sent
	End      time.Time
	Code     envelope.Code
	NotSent  bool
}

// calls collects calls. Safe for concurrent use.
type calls struct {
	mu  sync.Mutex
	all []call
}

// invoker wraps inv to record each call under client's name.
func (cs *calls) invoker(client string, inv envelope.Invoker, intended time.Time) envelope.Invoker {
	return func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
		start := time.Now()
		res, err := inv(ctx, req)
		c := call{Client: client, Method: req.Method, Intended: intended, Start: start, End: time.Now()}
		if err != nil {
			e := envelope.AsError(err)
			c.Code, c.NotSent = e.Code, e.NotSent()
		}
		cs.mu.Lock()
		cs.all = append(cs.all, c)
		cs.mu.Unlock()
		return res, err
	}
}

// where returns the calls for which keep holds.
func (cs *calls) where(keep func(c call) bool) []call {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	var out []call
	for _, c := range cs.all {
		if keep(c) {
			out = append(out, c)
		}
	}
	return out
}

// p99 is the 99th percentile of End - Intended over cs (0 when empty).
func p99(cs []call) time.Duration {
	if len(cs) == 0 {
		return 0
	}
	lat := make([]time.Duration, len(cs))
	for i, c := range cs {
		lat[i] = c.End.Sub(c.Intended)
	}
	slices.Sort(lat)
	return lat[len(lat)*99/100]
}

// byCode counts cs by result code.
func byCode(cs []call) map[string]int {
	out := map[string]int{}
	for _, c := range cs {
		out[c.Code.String()]++
	}
	return out
}

// labAuth is a mesh's authentication (the network lab's, whose meshd
// refuses a non-loopback --listen without --auth-key, and others'). It writes a key, issues one token (admin,
// may serve any method) for the agents and the test's clients, and makes
// hubInstances present it until the test ends.
type labAuth struct {
	keyFile, token string
}

func newLabAuth(t *testing.T) labAuth {
	t.Helper()
	a := labAuth{keyFile: filepath.Join(t.TempDir(), "auth.key")}
	if r := meshctl(t, "token", "keygen", "--out", a.keyFile); r.code != 0 {
		t.Fatalf("%v", r)
	}
	r := meshctl(t, "token", "issue", "--key", a.keyFile, "--sub", "lab", "--role", "admin", "--serve", "*", "--ttl", "1h")
	if r.code != 0 {
		t.Fatalf("%v", r)
	}
	a.token = strings.TrimSpace(r.stdout)
	adminToken = a.token
	t.Cleanup(func() { adminToken = "" })
	return a
}
