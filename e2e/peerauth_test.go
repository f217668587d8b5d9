package e2e_test

import (
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/tokentap"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
)

// TestClusterPeerTokenReplay: two meshd processes with one --auth-key on a
// real etcd; hub B advertises a wiretap (a TCP proxy that keeps the bearer
// token of each HTTP request crossing it) in front of its port, so that
// hub A's peer link to B crosses it. Calls through A reach the agent on B
// (the handshake works between real processes); the peer token captured
// from A's dial, replayed to B, opens no second link and calls neither
// mesh.agents nor anything else, on /ws or /rpc, and A does not take it
// either.
func TestClusterPeerTokenReplay(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	key := filepath.Join(t.TempDir(), "mesh.key")
	if r := meshctl(t, "token", "keygen", "--out", key); r.code != 0 {
		t.Fatalf("keygen: %v", r)
	}
	issue := func(args ...string) string {
		r := meshctl(t, append([]string{"token", "issue", "--key", key}, args...)...)
		if r.code != 0 {
			t.Fatalf("token issue %v: %v", args, r)
		}
		return strings.TrimSpace(r.stdout)
	}
	if r := meshctl(t, "token", "issue", "--key", key, "--sub", "hub.x", "--role", "hub"); r.code == 0 {
		t.Errorf("meshctl token issue --role hub: exit 0; want it refused")
	}
	bAddr := freeAddr(t)
	tap := tokentap.Start(t, bAddr)
	common := []string{"--registry", "etcd", "--etcd-endpoints", srv.Endpoint, "--etcd-prefix", "/e2e-peerauth/", "--auth-key", key}
	a := startHub(t, append(common, "--id", "hub-A")...)
	b := startHub(t, append(common, "--id", "hub-B", "--listen", bAddr, "--advertise", tap.Addr)...)
	startWithEnv(t, []string{"MESH_TOKEN=" + issue("--sub", "echo", "--serve", "echo.*")}, "meshctl", "agent", "run", "echo", "--id", "echo-b", "--hub", b.ws)

	cl, err := mesh.NewClient([]string{a.ws}, mesh.WithToken(issue("--sub", "caller")), mesh.WithoutReliability())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	waitFor(t, "a call through hub A to the agent on hub B", 10*time.Second, func() bool {
		var got string
		return cl.Call(t.Context(), "echo.echo", "hi", &got, mesh.To("echo-b")) == nil && got == "hi"
	})
	for i := range 20 {
		var got int
		if err := cl.Call(t.Context(), "echo.echo", i, &got); err != nil || got != i {
			t.Fatalf("call %d through A to B: %d, %v", i, got, err)
		}
	}
	toks := tap.Captured()
	if len(toks) == 0 {
		t.Fatal("the tap saw no peer token (A's peer link did not cross it)")
	}
	tok := toks[0]
	for _, h := range []*hub{a, b} {
		d := websocket.Dialer{Subprotocols: []string{envelope.Subprotocol}, HandshakeTimeout: 5 * time.Second}
		ws, res, err := d.DialContext(t.Context(), h.ws, http.Header{"Authorization": {"Bearer " + tok}})
		if err == nil {
			ws.Close()
			t.Errorf("the captured peer token replayed on %s /ws: the link opened", h.ws)
		} else if res == nil || res.StatusCode != http.StatusUnauthorized {
			t.Errorf("the captured peer token replayed on %s /ws: %v; want HTTP 401", h.ws, err)
		} else {
			body, _ := io.ReadAll(res.Body)
			t.Logf("replayed on %s /ws: %s", h.ws, strings.TrimSpace(string(body)))
		}
		for _, m := range []string{"mesh.agents", "mesh.breakers", "echo.echo"} {
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, h.base+"/rpc",
				strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"`+m+`","params":{}}`))
			req.Header.Set("Authorization", "Bearer "+tok)
			req.Header.Set("Content-Type", "application/json")
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != http.StatusUnauthorized {
				t.Errorf("%s with the captured peer token on %s/rpc: HTTP %d %s; want 401", m, h.base, res.StatusCode, body)
			}
		}
	}
	// The cluster goes on.
	if err := cl.Call(t.Context(), "echo.echo", 1, nil); err != nil {
		t.Errorf("call through A to B after the replays: %v", err)
	}
	// A token minted like a peer's but by hand is no better.
	raw, err := auth.LoadKey(key)
	if err != nil {
		t.Fatal(err)
	}
	forged, _ := auth.Issue(raw, auth.Claims{Subject: "hub.hub-A", Roles: []string{auth.RolePeer}}, time.Hour)
	d := websocket.Dialer{Subprotocols: []string{envelope.Subprotocol}, HandshakeTimeout: 5 * time.Second}
	if ws, res, err := d.DialContext(t.Context(), b.ws, http.Header{"Authorization": {"Bearer " + forged}}); err == nil {
		ws.Close()
		t.Error("an unbound, hour-long hub token opened a link to B")
	} else if res == nil || res.StatusCode != http.StatusUnauthorized {
		t.Errorf("an unbound, hour-long hub token on B's /ws: %v; want HTTP 401", err)
	}
}
