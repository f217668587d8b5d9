package hub_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
)

// TestAuthKeyRotation: the hub's keys change while it runs
// (Hub.SetAuthKeys, meshd's SIGHUP). Issue with key1; rotate to
// key1+key2; issue with key2: both tokens valid, and the links opened
// with key1 tokens stay open; drop key1: key1 tokens are UNAUTHENTICATED,
// the links opened with them are closed, the key2 ones go on untouched.
func TestAuthKeyRotation(t *testing.T) {
	key1 := testkit.TestKey
	key2 := []byte("a second key of at least thirty-two bytes, for rotation")
	m := meshtest.Start(t, hub.Config{HeartbeatInterval: time.Second, Security: &hub.Security{Keys: []auth.Key{{Secret: key1}}}})
	issue := func(key []byte, c auth.Claims) string {
		tok, err := auth.Issue(key, c, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()

	// key1: an agent and a caller, each on its own link.
	var n1, n2 atomic.Int64
	a1 := testkit.CountingAgent("rot1", &n1, issue(key1, auth.Claims{Subject: "rot1", Serve: []string{"rot1.*"}}), "rot1.call")
	run1 := make(chan error, 1)
	go func() { run1 <- a1.Run(ctx, m.WS) }()
	<-a1.Registered()
	tok1 := issue(key1, auth.Claims{Subject: "caller1"})
	c1 := testkit.MustClient(t, m.WS, mesh.WithToken(tok1), mesh.WithoutReliability())
	if err := c1.Call(ctx, "rot1.call", nil, nil); err != nil {
		t.Fatalf("key1 caller before the rotation: %v", err)
	}

	// Rotate in key2: nothing is cut.
	closed, err := m.Hub.SetAuthKeys([]auth.Key{{Secret: key1}, {Secret: key2}})
	if err != nil || closed != 0 {
		t.Fatalf("SetAuthKeys(key1, key2) = %d, %v; want 0 closed", closed, err)
	}
	a2 := testkit.CountingAgent("rot2", &n2, issue(key2, auth.Claims{Subject: "rot2", Serve: []string{"rot2.*"}}), "rot2.call")
	run2 := make(chan error, 1)
	go func() { run2 <- a2.Run(ctx, m.WS) }()
	<-a2.Registered()
	tok2 := issue(key2, auth.Claims{Subject: "caller2"})
	c2 := testkit.MustClient(t, m.WS, mesh.WithToken(tok2), mesh.WithoutReliability())
	for _, call := range []struct {
		c      *mesh.Client
		method string
	}{{c1, "rot1.call"}, {c1, "rot2.call"}, {c2, "rot1.call"}, {c2, "rot2.call"}} {
		if err := call.c.Call(ctx, call.method, nil, nil); err != nil {
			t.Errorf("%s under key1+key2: %v", call.method, err)
		}
	}
	for _, tok := range []string{tok1, tok2} {
		if st := postWithToken(t, m.HTTP, tok); st != http.StatusOK {
			t.Errorf("POST /rpc with a token under key1+key2: HTTP %d", st)
		}
	}

	// Drop key1: its links are closed, its tokens refused; key2's go on.
	closed, err = m.Hub.SetAuthKeys([]auth.Key{{Secret: key2}})
	if err != nil || closed != 2 {
		t.Errorf("SetAuthKeys(key2) = %d, %v; want 2 closed (the key1 agent and caller)", closed, err)
	}
	select {
	case err := <-run1:
		testkit.WantCode(t, "key1 agent after key1 was dropped", err, envelope.CodeUnauthenticated)
	case <-time.After(10 * time.Second):
		t.Fatal("the key1 agent kept its link (or kept reconnecting) after key1 was dropped")
	}
	if err := c1.Call(ctx, "rot2.call", nil, nil); err == nil {
		t.Error("key1 caller after key1 was dropped: the call succeeded")
	}
	if st := postWithToken(t, m.HTTP, tok1); st != http.StatusUnauthorized {
		t.Errorf("POST /rpc with a key1 token after key1 was dropped: HTTP %d; want 401", st)
	}
	fresh, err := mesh.NewClient([]string{m.WS}, mesh.WithToken(tok1), mesh.WithoutReliability())
	if err == nil {
		err = fresh.Call(ctx, "rot2.call", nil, nil)
		_ = fresh.Close()
	}
	testkit.WantCode(t, "a new key1 link after key1 was dropped", err, envelope.CodeUnauthenticated)
	before := n2.Load()
	if err := c2.Call(ctx, "rot2.call", nil, nil); err != nil {
		t.Errorf("key2 caller after key1 was dropped: %v", err)
	}
	if n2.Load() != before+1 {
		t.Errorf("the key2 agent ran %d calls; want %d", n2.Load(), before+1)
	}
	if st := postWithToken(t, m.HTTP, tok2); st != http.StatusOK {
		t.Errorf("POST /rpc with a key2 token after key1 was dropped: HTTP %d", st)
	}
	// A bad set changes nothing.
	if _, err := m.Hub.SetAuthKeys(nil); err == nil {
		t.Error("SetAuthKeys(nil) accepted")
	}
	if err := c2.Call(ctx, "rot2.call", nil, nil); err != nil {
		t.Errorf("after a refused SetAuthKeys: %v", err)
	}
	cancel()
	<-run2
}

// postWithToken calls mesh.ping over POST /rpc with a bearer token.
func postWithToken(t *testing.T, base, tok string) int {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/rpc", strings.NewReader(`{"jsonrpc":"2.0","method":"mesh.ping","id":1}`))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}
