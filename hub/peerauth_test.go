package hub_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/internal/tokentap"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/registry"
	"github.com/agentmesh/agentmesh/registry/memory"
)

// peerSec is the Security of the hubs of these tests: the test key, and
// no failed-authentication budget, so that every refusal says why.
func peerSec() *hub.Security { return &hub.Security{Key: testkit.TestKey, FailedAuthRate: -1} }

// fakeHub is a listener posing as a hub: it upgrades /ws with the native
// subprotocol, keeps the bearer token of each upgrade, and answers every
// call sent over the link with a forged result.
type fakeHub struct {
	addr   string
	proof  func(tok string) string // the Agentmesh-Peer-Proof it answers with ("": none)
	mu     sync.Mutex
	tokens []string
	links  []*link.Link
	calls  atomic.Int64
}

func startFakeHub(t *testing.T, proof func(tok string) string) *fakeHub {
	t.Helper()
	f := &fakeHub{proof: proof}
	up := websocket.Upgrader{Subprotocols: []string{envelope.Subprotocol}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, _ := auth.BearerToken(r)
		var hdr http.Header
		if f.proof != nil {
			if p := f.proof(tok); p != "" {
				hdr = http.Header{"Agentmesh-Peer-Proof": {p}}
			}
		}
		ws, err := up.Upgrade(w, r, hdr)
		if err != nil {
			return
		}
		l := link.New(ws, link.Config{}, link.WithHandler(func(_ context.Context, req *envelope.Request) (*envelope.Response, error) {
			f.calls.Add(1)
			return &envelope.Response{ID: req.ID, Destination: req.Origin, Result: json.RawMessage(`"forged"`)}, nil
		}))
		f.mu.Lock()
		f.tokens = append(f.tokens, tok)
		f.links = append(f.links, l)
		f.mu.Unlock()
	}))
	t.Cleanup(func() {
		srv.Close()
		f.mu.Lock()
		defer f.mu.Unlock()
		for _, l := range f.links {
			l.Close()
		}
	})
	f.addr = srv.Listener.Addr().String()
	return f
}

func (f *fakeHub) Captured() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.tokens...)
}

// upgrade asks hub (ws://…/ws) for a native link with tok and returns the
// HTTP status, the body of a refusal and the response headers.
func upgrade(t *testing.T, hb, tok string, protocols ...string) (int, string, http.Header) {
	t.Helper()
	if protocols == nil {
		protocols = []string{envelope.Subprotocol}
	}
	d := websocket.Dialer{Subprotocols: protocols, HandshakeTimeout: 5 * time.Second}
	ws, res, err := d.DialContext(t.Context(), hb, http.Header{"Authorization": {"Bearer " + tok}})
	if err == nil {
		ws.Close()
		return res.StatusCode, "", res.Header
	}
	if res == nil {
		t.Fatalf("upgrade %s: %v", hb, err)
	}
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b), res.Header
}

// rpc posts one JSON-RPC call to hub's /rpc with tok and returns the HTTP
// status and the error code of the reply (CodeOK for a result).
func rpc(t *testing.T, base, tok, method string) (int, envelope.Code) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/rpc",
		strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"`+method+`","params":{}}`))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var v struct {
		Error *struct {
			Data struct {
				Code string `json:"code"`
			} `json:"data"`
			Code int `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(b, &v)
	if v.Error == nil {
		return res.StatusCode, envelope.CodeOK
	}
	c, ok := envelope.ParseCode(v.Error.Data.Code)
	if !ok {
		t.Fatalf("POST /rpc %s: a reply without a code: %s", method, b)
	}
	return res.StatusCode, c
}

// TestForgedPeerGetsNoUsableToken: registry records point instances (one
// on a hub id nobody runs, one on the real hub B's id) at a listener
// posing as a hub. Hub A dials it, but the token it hands over is bound
// to the hub and address dialled: neither A nor B accepts it on /ws or
// /rpc (UNAUTHENTICATED). The listener cannot prove it is the hub named,
// so A sends no call over its link: calls named for the forged instances
// fail UNAVAILABLE, not sent, and calls of a method the real agent on B
// serves too all go to the real agent.
func TestForgedPeerGetsNoUsableToken(t *testing.T) {
	reg := memory.New() // shared: one registry, as etcd is for a cluster
	a := meshtest.StartCluster(t, hub.Config{ID: "hub-A", Security: peerSec()}, reg)
	b := meshtest.StartCluster(t, hub.Config{ID: "hub-B", Security: peerSec()}, reg)
	var ran atomic.Int64
	b.RunAgent(t, testkit.CountingAgent("echo", &ran, testkit.Token(t, auth.Claims{Subject: "echo", Serve: []string{"echo.*"}}, time.Hour), "echo.*"))
	fake := startFakeHub(t, nil)
	forge := func(id, hb string, caps ...string) {
		if _, err := reg.Register(t.Context(), registry.Registration{InstanceID: id, Name: "forged", Hub: hb, HubAddr: fake.addr,
			Capabilities: caps, HeartbeatInterval: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	forge("forged-evil", "hub-evil", "forged.*")
	forge("forged-b", "hub-B", "forged.*")
	meshtest.WaitFor(t, 5*time.Second, func() bool { return a.Hub.Registry().Snapshot().Instance("forged-b") != nil })

	cl := testkit.MustClient(t, a.WS, mesh.WithToken(testkit.Token(t, auth.Claims{Subject: "caller"}, time.Hour)), mesh.WithoutReliability())
	for _, dest := range []string{"forged-evil", "forged-b"} {
		var got any
		err := cl.Call(t.Context(), "forged.echo", 1, &got, mesh.To(dest))
		t.Logf("call to %s: %v (result %v)", dest, err, got)
		if envelope.CodeOf(err) != envelope.CodeUnavailable || !envelope.AsError(err).NotSent() {
			t.Errorf("call to %s through A = %v, result %v; want UNAVAILABLE, not sent", dest, err, got)
		} else if !strings.Contains(envelope.AsError(err).Error(), "did not prove it is hub") {
			t.Errorf("call to %s: %v; want the missing proof named", dest, err)
		}
	}
	// A forged instance beside the real one: every call is served by the
	// real agent.
	forge("forged-echo", "hub-B", "echo.*")
	meshtest.WaitFor(t, 5*time.Second, func() bool { return len(a.Hub.Registry().Snapshot().Lookup("echo.echo")) == 2 })
	for i := range 10 {
		var got map[string]string
		if err := cl.Call(t.Context(), "echo.echo", i, &got); err != nil {
			t.Errorf("echo.echo %d with a forged instance listed: %v", i, err)
		}
	}
	if n := ran.Load(); n != 10 {
		t.Errorf("the real agent ran %d calls; want 10", n)
	}
	if n := fake.calls.Load(); n != 0 {
		t.Errorf("hub A sent %d calls to the listener posing as a hub; want 0", n)
	}

	toks := fake.Captured()
	if len(toks) == 0 {
		t.Fatal("hub A never dialled the forged address (nothing tested)")
	}
	for i, tok := range toks {
		for _, h := range []*meshtest.Mesh{a, b} {
			st, body, _ := upgrade(t, h.WS, tok)
			if st != http.StatusUnauthorized {
				t.Errorf("token %d given to the forged hub, on %s /ws: HTTP %d %s; want 401", i, h.Hub.ID(), st, body)
			} else if i == 0 {
				t.Logf("token given to the forged hub, on %s /ws: %s", h.Hub.ID(), strings.TrimSpace(body))
			}
			if st, code := rpc(t, h.HTTP, tok, "mesh.ping"); st != http.StatusUnauthorized || code != envelope.CodeUnauthenticated {
				t.Errorf("token %d given to the forged hub, on %s /rpc: HTTP %d %v; want 401 UNAUTHENTICATED", i, h.Hub.ID(), st, code)
			}
		}
	}
}

// TestReplayedPeerToken: a wiretap (a proxy hub B advertises) captures the
// token of a real peer dial from A. Replayed to B, or to A, it opens
// nothing: the second use of the link token is refused, mesh.agents and
// mesh.breakers are refused, no agent registers with it, and calls made
// with it do not escape B's per-token and global rate limits.
func TestReplayedPeerToken(t *testing.T) {
	reg := memory.New()
	a := meshtest.StartCluster(t, hub.Config{ID: "hub-A", Security: peerSec()}, reg)
	lnB, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tap := tokentap.Start(t, lnB.Addr().String())
	secB := peerSec()
	secB.RatePerToken, secB.BurstPerToken = 2, 3
	b := meshtest.StartClusterOn(t, hub.Config{ID: "hub-B", Advertise: tap.Addr, Security: secB, GlobalRate: 2, GlobalBurst: 3}, reg, lnB)
	var ran atomic.Int64
	b.RunAgent(t, testkit.CountingAgent("echo", &ran, testkit.Token(t, auth.Claims{Subject: "echo", Serve: []string{"echo.*"}}, time.Hour), "echo.*"))
	meshtest.WaitFor(t, 5*time.Second, func() bool { return len(a.Hub.Registry().Snapshot().Lookup("echo.echo")) == 1 })
	cl := testkit.MustClient(t, a.WS, mesh.WithToken(testkit.Token(t, auth.Claims{Subject: "caller"}, time.Hour)), mesh.WithoutReliability())
	if err := cl.Call(t.Context(), "echo.echo", 1, nil); err != nil {
		t.Fatalf("call through A to B over the tapped peer link: %v", err)
	}
	toks := tap.Captured()
	if len(toks) != 1 {
		t.Fatalf("the tap captured %d tokens; want the one of A's dial", len(toks))
	}
	tok := toks[0]

	// The link token, a second time.
	if st, body, _ := upgrade(t, b.WS, tok); st != http.StatusUnauthorized {
		t.Errorf("the captured peer token replayed on B's /ws: HTTP %d; want 401", st)
	} else {
		t.Logf("replayed on B's /ws: %s", strings.TrimSpace(body))
		if !strings.Contains(body, "used already") {
			t.Errorf("replayed on B's /ws: %q; want the second use named", body)
		}
	}
	if st, _, _ := upgrade(t, a.WS, tok); st != http.StatusUnauthorized {
		t.Errorf("the captured peer token on A's /ws: HTTP %d; want 401", st)
	}
	// Admin methods and other surfaces.
	for _, h := range []*meshtest.Mesh{a, b} {
		for _, m := range []string{"mesh.agents", "mesh.breakers"} {
			st, code := rpc(t, h.HTTP, tok, m)
			if code != envelope.CodeUnauthenticated && code != envelope.CodePermissionDenied {
				t.Errorf("%s on %s /rpc with the captured peer token: HTTP %d %v; want UNAUTHENTICATED or PERMISSION_DENIED", m, h.Hub.ID(), st, code)
			}
		}
	}
	viaWS, err := mesh.NewClient([]string{b.WS}, mesh.WithToken(tok), mesh.WithoutReliability())
	if err != nil {
		t.Fatal(err)
	}
	defer viaWS.Close()
	for _, m := range []string{"mesh.agents", "mesh.breakers"} {
		err := viaWS.Call(t.Context(), m, nil, nil)
		if c := envelope.CodeOf(err); c != envelope.CodeUnauthenticated && c != envelope.CodePermissionDenied {
			t.Errorf("%s on B's /ws with the captured peer token: %v; want UNAUTHENTICATED or PERMISSION_DENIED", m, err)
		}
	}
	// Registration.
	thief := agents.New("thief", agents.WithToken(tok))
	thief.Handle("thief.steal", func(context.Context, json.RawMessage) (any, error) { return nil, nil })
	rctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	err = thief.Run(rctx, b.WS)
	cancel()
	if c := envelope.CodeOf(err); c != envelope.CodeUnauthenticated && c != envelope.CodePermissionDenied {
		t.Errorf("an agent registering with the captured peer token: %v; want UNAUTHENTICATED or PERMISSION_DENIED", err)
	}
	if b.Hub.Registry().Snapshot().Instance(thief.ID()) != nil {
		t.Error("the agent with the captured peer token is registered")
	}
	// Limits: B admits 3 calls of one identity at once, and 3 in all.
	before := ran.Load()
	ok := 0
	for range 20 {
		if viaWS.Call(t.Context(), "echo.echo", 1, nil) == nil {
			ok++
		}
		if st, code := rpc(t, b.HTTP, tok, "echo.echo"); st == http.StatusOK && code == envelope.CodeOK {
			ok++
		}
	}
	t.Logf("40 calls with the captured peer token on B (/ws and /rpc): %d answered", ok)
	if ok > 3 || ran.Load()-before > 3 {
		t.Errorf("40 calls with the captured peer token: %d answered, the agent ran %d; want at most B's burst of 3", ok, ran.Load()-before)
	}
	// The cluster still works, and the calls A forwards over its peer
	// link are not held to B's limits (A counted them): 20 at once pass
	// B's global burst of 3.
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := range 20 {
		wg.Go(func() {
			if err := cl.Call(t.Context(), "echo.echo", i, nil); err != nil {
				failed.Add(1)
				t.Logf("call %d through A to B after the replays: %v", i, err)
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n != 0 {
		t.Errorf("%d of 20 calls through A to B failed; want 0 (forwarded calls pass B's limits)", n)
	}
}

// TestPeerTokenBinding: the hub that is dialled accepts a hub token only
// bound to it (audience its id, addr its advertised address), short-lived,
// once, and on a native /ws upgrade, which it answers with a proof for
// the dialler; on that link the hub role forwards calls for agents
// (hops > 0) and nothing else.
func TestPeerTokenBinding(t *testing.T) {
	b := meshtest.StartCluster(t, hub.Config{ID: "hub-B", Security: peerSec()}, memory.New())
	var ran atomic.Int64
	ag := testkit.CountingAgent("echo", &ran, testkit.Token(t, auth.Claims{Subject: "echo", Serve: []string{"echo.*"}}, time.Hour), "echo.*")
	b.RunAgent(t, ag)
	peer := func(mod func(*auth.Claims), ttl time.Duration) (string, string) {
		c := auth.Claims{Subject: "hub.hub-X", Roles: []string{auth.RolePeer}, Audience: "hub-B", Addr: b.Addr, ID: envelope.NewID()}
		if mod != nil {
			mod(&c)
		}
		return testkit.Token(t, c, ttl), c.ID
	}
	for _, tc := range []struct {
		name string
		mod  func(*auth.Claims)
		ttl  time.Duration
	}{
		{"no audience", func(c *auth.Claims) { c.Audience = "" }, 30 * time.Second},
		{"another hub's audience", func(c *auth.Claims) { c.Audience = "hub-C" }, 30 * time.Second},
		{"no address", func(c *auth.Claims) { c.Addr = "" }, 30 * time.Second},
		{"another address", func(c *auth.Claims) { c.Addr = "127.0.0.1:1" }, 30 * time.Second},
		{"a long lifetime", nil, 10 * time.Minute},
		{"a subject that is no hub", func(c *auth.Claims) { c.Subject = "mallory" }, 30 * time.Second},
		// Captured before a restart of this hub, whose replay cache died
		// with it: still within its lifetime, never used here.
		{"an issue time before the hub started", func(c *auth.Claims) { c.IssuedAt = time.Now().Add(-10 * time.Second) }, 30 * time.Second},
	} {
		tok, _ := peer(tc.mod, tc.ttl)
		st, body, _ := upgrade(t, b.WS, tok)
		t.Logf("hub token with %s on /ws: HTTP %d %s", tc.name, st, strings.TrimSpace(body))
		if st != http.StatusUnauthorized {
			t.Errorf("hub token with %s on /ws: HTTP %d; want 401", tc.name, st)
		}
	}
	// A well-bound one anywhere but a native /ws upgrade.
	tok, _ := peer(nil, 30*time.Second)
	if st, code := rpc(t, b.HTTP, tok, "mesh.ping"); st != http.StatusUnauthorized || code != envelope.CodeUnauthenticated {
		t.Errorf("well-bound hub token on /rpc: HTTP %d %v; want 401 UNAUTHENTICATED", st, code)
	}
	if st, _, _ := upgrade(t, b.WS, tok, "jsonrpc"); st != http.StatusUnauthorized {
		t.Errorf("well-bound hub token on a JSON-RPC WebSocket: HTTP %d; want 401", st)
	}
	// On a native upgrade: accepted, with a proof for hub-X of this dial.
	tok, jti := peer(nil, 30*time.Second)
	st, body, hdr := upgrade(t, b.WS, tok)
	if st != http.StatusSwitchingProtocols {
		t.Fatalf("well-bound hub token on /ws: HTTP %d %s; want 101", st, body)
	}
	v, _ := auth.NewVerifier(testkit.TestKey)
	proof, err := v.VerifyProof(hdr.Get("Agentmesh-Peer-Proof"))
	if err != nil || proof.Subject != "hub.hub-B" || proof.Audience != "hub-X" || proof.Nonce != jti {
		t.Errorf("the proof answering the upgrade: %+v, %v; want subject hub.hub-B, audience hub-X, nonce %s", proof, err, jti)
	}
	if _, err := v.Verify(hdr.Get("Agentmesh-Peer-Proof")); err == nil {
		t.Error("the proof verifies as a token: it must be no credential")
	}
	if st, _, _ := upgrade(t, b.WS, tok); st != http.StatusUnauthorized {
		t.Errorf("the same hub token a second time: HTTP %d; want 401", st)
	}

	// What the hub role may do on its link.
	tok, _ = peer(nil, 30*time.Second)
	l, err := link.DialToken(t.Context(), b.WS, tok, link.Config{})
	if err != nil {
		t.Fatalf("a peer link with a well-bound hub token: %v", err)
	}
	defer l.Close()
	call := func(method, dest string, hops int, params string) error {
		req := &envelope.Request{ID: envelope.NewID(), Method: method, Destination: dest, Params: json.RawMessage(params), Timestamp: time.Now().UnixMilli()}
		req.Headers.Hops = hops
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		_, err := l.Call(ctx, req)
		return err
	}
	for _, c := range []struct {
		method string
		hops   int
		params string
	}{
		{"mesh.agents", 0, `{}`}, {"mesh.agents", 1, `{}`}, {"mesh.breakers", 1, `{}`}, {"mesh.ping", 0, `{}`}, {"schema", 1, `{}`},
		{"agent.register", 1, `{"agentId":"thief","name":"thief","capabilities":["echo.*"]}`},
		{"echo.echo", 0, `1`},
	} {
		err := call(c.method, "", c.hops, c.params)
		t.Logf("%s (hops %d) over the peer link: %v", c.method, c.hops, err)
		if envelope.CodeOf(err) != envelope.CodePermissionDenied {
			t.Errorf("%s (hops %d) over the peer link: %v; want PERMISSION_DENIED", c.method, c.hops, err)
		}
	}
	before := ran.Load()
	if err := call("echo.echo", ag.ID(), 1, `1`); err != nil {
		t.Errorf("a forwarded call over the peer link: %v", err)
	}
	if ran.Load() != before+1 {
		t.Errorf("the agent ran %d forwarded calls; want 1", ran.Load()-before)
	}
}

// TestPeerLinkOutlivesItsToken: the token a hub dials with lives 1 s
// here; the peer link it opened stays up past it (no re-dial: the proxy
// in front of B sees one connection), and calls go on over it.
func TestPeerLinkOutlivesItsToken(t *testing.T) {
	reg := memory.New()
	a := meshtest.StartCluster(t, hub.Config{ID: "hub-A", Security: peerSec()}, reg, hub.WithPeerTokenTTL(time.Second))
	lnB, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tap := tokentap.Start(t, lnB.Addr().String())
	b := meshtest.StartClusterOn(t, hub.Config{ID: "hub-B", Advertise: tap.Addr, Security: peerSec()}, reg, lnB)
	var ran atomic.Int64
	b.RunAgent(t, testkit.CountingAgent("echo", &ran, testkit.Token(t, auth.Claims{Subject: "echo", Serve: []string{"echo.*"}}, time.Hour), "echo.*"))
	meshtest.WaitFor(t, 5*time.Second, func() bool { return len(a.Hub.Registry().Snapshot().Lookup("echo.echo")) == 1 })
	cl := testkit.MustClient(t, a.WS, mesh.WithToken(testkit.Token(t, auth.Claims{Subject: "caller"}, time.Hour)), mesh.WithoutReliability())
	if err := cl.Call(t.Context(), "echo.echo", 1, nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3500 * time.Millisecond) // the token's 1 s, the 2 s leeway, slack
	for i := range 5 {
		if err := cl.Call(t.Context(), "echo.echo", i, nil); err != nil {
			t.Errorf("call %d after the peer token expired: %v", i, err)
		}
	}
	if n := tap.Conns.Load(); n != 1 {
		t.Errorf("A dialled B %d times; want 1 (the link outlives its token)", n)
	}
}

// TestPeerLinksAcrossKeyRotation: hubs rotate their keys (k1 → k2) while
// a peer link is up: the link opened with a k1 token (of 1 s, expired by
// then) stays up while k1 is in both sets, is closed when B drops k1, and
// A re-dials with k2; calls through A to B keep working.
func TestPeerLinksAcrossKeyRotation(t *testing.T) {
	k1, k2 := testkit.TestKey, []byte("a second key of at least thirty-two bytes, for rotation")
	both := []auth.Key{{Secret: k1}, {Secret: k2}}
	reg := memory.New()
	sec := func() *hub.Security { return &hub.Security{Keys: both, FailedAuthRate: -1} }
	a := meshtest.StartCluster(t, hub.Config{ID: "hub-A", Security: sec()}, reg, hub.WithPeerTokenTTL(time.Second))
	b := meshtest.StartCluster(t, hub.Config{ID: "hub-B", Security: sec()}, reg)
	tok := func(c auth.Claims) string {
		s, err := auth.Issue(k2, c, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	var ran atomic.Int64
	b.RunAgent(t, testkit.CountingAgent("echo", &ran, tok(auth.Claims{Subject: "echo", Serve: []string{"echo.*"}}), "echo.*"))
	meshtest.WaitFor(t, 5*time.Second, func() bool { return len(a.Hub.Registry().Snapshot().Lookup("echo.echo")) == 1 })
	cl := testkit.MustClient(t, a.WS, mesh.WithToken(tok(auth.Claims{Subject: "caller"})), mesh.WithoutReliability())
	calls := func(what string) {
		t.Helper()
		for i := range 5 {
			if err := cl.Call(t.Context(), "echo.echo", i, nil); err != nil {
				t.Errorf("%s: call %d through A to B: %v", what, i, err)
			}
		}
	}
	calls("k1 signing")
	// Past the peer token's life (1 s and the 2 s leeway): a rotation
	// checks a peer link's key, not its token's times.
	time.Sleep(3500 * time.Millisecond)
	set := func(m *meshtest.Mesh, keys []auth.Key) int {
		n, err := m.Hub.SetAuthKeys(keys)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := set(a, []auth.Key{{Secret: k2}, {Secret: k1}}) + set(b, both); n != 0 {
		t.Errorf("A signing with k2, B with k1: %d links closed; want 0", n)
	}
	calls("A signing with k2, B with k1")
	if n := set(a, []auth.Key{{Secret: k2}}); n != 0 {
		t.Errorf("A dropping k1: %d links closed; want 0 (A accepted no peer link)", n)
	}
	if n := set(b, []auth.Key{{Secret: k2}}); n != 1 {
		t.Errorf("B dropping k1: %d links closed; want 1 (A's peer link, opened with a k1 token)", n)
	}
	// A notices the lost link and re-dials with k2 within its backoff.
	meshtest.WaitFor(t, 5*time.Second, func() bool { return cl.Call(t.Context(), "echo.echo", 0, nil) == nil })
	calls("k2 only")
}

// TestPeerMustProveItsIdentity: listeners posing as hub B (a registry
// record puts an instance of hub-B at each) answer A's dial with a proof
// that is wrong in one way each: signed with another key, for another
// dial (a real proof of B's, captured), from another hub, for another
// hub, a token that is not a proof. A closes each link before sending a
// call: the call fails UNAVAILABLE, not sent, naming the failed proof,
// and the listener runs nothing. A listener that holds the key and
// answers right (the control) is used.
func TestPeerMustProveItsIdentity(t *testing.T) {
	reg := memory.New()
	a := meshtest.StartCluster(t, hub.Config{ID: "hub-A", Security: peerSec()}, reg)
	// A real proof of hub B's, for a dial of hub-A's that is not this one.
	realB := meshtest.StartCluster(t, hub.Config{ID: "hub-B", Security: peerSec()}, memory.New())
	old := testkit.Token(t, auth.Claims{Subject: "hub.hub-A", Roles: []string{auth.RolePeer}, Audience: "hub-B", Addr: realB.Addr}, 30*time.Second)
	st, body, hdr := upgrade(t, realB.WS, old)
	captured := hdr.Get("Agentmesh-Peer-Proof")
	if st != http.StatusSwitchingProtocols || captured == "" {
		t.Fatalf("a real dial of hub B: HTTP %d %s, proof %q", st, body, captured)
	}
	v, _ := auth.NewVerifier(testkit.TestKey)
	jti := func(tok string) string {
		c, err := v.Verify(tok)
		if err != nil {
			t.Errorf("the token A dialled with: %v", err)
			return ""
		}
		return c.ID
	}
	sign := func(key []byte, c auth.Claims) string {
		p, err := auth.IssueProof(key, auth.KeyID(key), c, 30*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	otherKey := []byte("not the mesh key, but long enough for HS256!!")
	cl := testkit.MustClient(t, a.WS, mesh.WithToken(testkit.Token(t, auth.Claims{Subject: "caller"}, time.Hour)), mesh.WithoutReliability())
	for i, tc := range []struct {
		name  string
		proof func(tok string) string
		ok    bool
	}{
		{"signed with another key", func(tok string) string {
			return sign(otherKey, auth.Claims{Subject: "hub.hub-B", Audience: "hub-A", Nonce: jti(tok)})
		}, false},
		{"captured from another dial", func(string) string { return captured }, false},
		{"from another hub", func(tok string) string {
			return sign(testkit.TestKey, auth.Claims{Subject: "hub.hub-C", Audience: "hub-A", Nonce: jti(tok)})
		}, false},
		{"for another hub", func(tok string) string {
			return sign(testkit.TestKey, auth.Claims{Subject: "hub.hub-B", Audience: "hub-C", Nonce: jti(tok)})
		}, false},
		{"a token, not a proof", func(tok string) string {
			return testkit.Token(t, auth.Claims{Subject: "hub.hub-B", Audience: "hub-A", Nonce: jti(tok)}, 30*time.Second)
		}, false},
		{"right (control)", func(tok string) string {
			return sign(testkit.TestKey, auth.Claims{Subject: "hub.hub-B", Audience: "hub-A", Nonce: jti(tok)})
		}, true},
	} {
		fake := startFakeHub(t, tc.proof)
		id := fmt.Sprintf("posing-%d", i)
		if _, err := reg.Register(t.Context(), registry.Registration{InstanceID: id, Name: "posing", Hub: "hub-B", HubAddr: fake.addr,
			Capabilities: []string{"posing.*"}, HeartbeatInterval: time.Hour}); err != nil {
			t.Fatal(err)
		}
		meshtest.WaitFor(t, 5*time.Second, func() bool { return a.Hub.Registry().Snapshot().Instance(id) != nil })
		var got string
		err := cl.Call(t.Context(), "posing.echo", 1, &got, mesh.To(id))
		t.Logf("proof %s: %v (result %q)", tc.name, err, got)
		if tc.ok {
			if err != nil || got != "forged" || fake.calls.Load() != 1 {
				t.Errorf("proof %s: %v, result %q, %d calls; want the listener's answer", tc.name, err, got, fake.calls.Load())
			}
			continue
		}
		if e := envelope.AsError(err); envelope.CodeOf(err) != envelope.CodeUnavailable || !e.NotSent() || !strings.Contains(e.Message, "did not prove it is hub hub-B") {
			t.Errorf("proof %s: %v; want UNAVAILABLE, not sent, the peer did not prove it is hub hub-B", tc.name, err)
		}
		if n := fake.calls.Load(); n != 0 {
			t.Errorf("proof %s: the listener ran %d calls; want 0", tc.name, n)
		}
		if len(fake.Captured()) == 0 {
			t.Errorf("proof %s: A never dialled the listener (nothing tested)", tc.name)
		}
	}
}

// TestPeerHandshakeOverMutualTLS: the handshake over wss peer links (the
// hubs serve mutual TLS and dial each other with their certificate): a
// call entering hub B for the agent on hub A crosses the link, and a
// token captured from it would be bound as over plain ws.
func TestPeerHandshakeOverMutualTLS(t *testing.T) {
	pki := newPKI(t)
	srvTLS, err := link.ServerTLS(pki.cert, pki.key, pki.ca)
	if err != nil {
		t.Fatal(err)
	}
	peerTLS, err := link.ClientTLS(pki.ca, pki.cert, pki.key)
	if err != nil {
		t.Fatal(err)
	}
	clientTLS, _ := link.ClientTLS(pki.ca, pki.clientCert, pki.clientKey)
	reg := memory.New()
	hb := func(name string) *meshtest.Mesh {
		return meshtest.StartCluster(t, hub.Config{ID: "hub-" + name, TLS: srvTLS, PeerTLS: peerTLS, Security: peerSec()}, reg)
	}
	a, b := hb("A"), hb("B")
	wss := func(m *meshtest.Mesh) string { return strings.Replace(m.WS, "ws://", "wss://", 1) }
	var ran atomic.Int64
	ag := testkit.CountingAgent("echo", &ran, testkit.Token(t, auth.Claims{Subject: "echo", Serve: []string{"echo.*"}}, time.Hour), "echo.*")
	agents.WithConnConfig(link.Config{TLS: clientTLS})(ag)
	runAgentUntilEnd(t, ag, wss(a), "on hub A over mutual TLS")
	meshtest.WaitFor(t, 5*time.Second, func() bool { return b.Hub.Registry().Snapshot().Instance(ag.ID()) != nil })
	c := testkit.MustClient(t, wss(b), mesh.WithTLS(clientTLS), mesh.WithToken(testkit.Token(t, auth.Claims{Subject: "caller"}, time.Hour)), mesh.WithoutReliability())
	for i := range 20 {
		if err := c.Call(t.Context(), "echo.echo", []int{i}, nil); err != nil {
			t.Fatalf("call %d through B to A over wss: %v", i, err)
		}
	}
	if n := ran.Load(); n != 20 {
		t.Errorf("the agent on A ran %d calls; want 20", n)
	}
}
