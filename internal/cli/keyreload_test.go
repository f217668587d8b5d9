package cli_test

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/internal/cli"
	"github.com/agentmesh/agentmesh/internal/freeport"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
)

// TestMeshdAuthKeyReload: meshd --auth-key old.key,new.key starts with
// new.key not yet written; after new.key is written and SIGHUP, tokens of
// both keys are valid and the link opened with an old-key token goes on;
// after old.key is removed and SIGHUP, old-key tokens are UNAUTHENTICATED
// (401) and that link is closed, while new-key tokens still work.
func TestMeshdAuthKeyReload(t *testing.T) {
	dir := t.TempDir()
	oldKey, newKey := filepath.Join(dir, "old.key"), filepath.Join(dir, "new.key")
	k1, err := auth.NewKeyFile(oldKey)
	if err != nil {
		t.Fatal(err)
	}
	addr := freeport.Addr(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan int, 1)
	var errb bytes.Buffer
	go func() {
		done <- cli.Run(ctx, cli.NewMeshd(&bytes.Buffer{}, &errb), []string{"--listen", addr, "--auth-key", oldKey + "," + newKey, "--log-level", "error"}, &errb)
	}()
	tok := func(key []byte) string {
		s, err := auth.Issue(key, auth.Claims{Subject: "c"}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	status := func(tok string) int {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, "http://"+addr+"/rpc", strings.NewReader(`{"jsonrpc":"2.0","method":"mesh.ping","id":1}`))
		req.Header.Set("Authorization", "Bearer "+tok)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		res.Body.Close()
		return res.StatusCode
	}
	tok1 := tok(k1)
	meshtest.WaitFor(t, 10*time.Second, func() bool { return status(tok1) == http.StatusOK })
	c1, err := mesh.NewClient([]string{"ws://" + addr + "/ws"}, mesh.WithToken(tok1), mesh.WithoutReliability())
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	if err := c1.Call(ctx, "mesh.ping", nil, nil); err != nil {
		t.Fatalf("old-key link: %v", err)
	}

	// Write the new key, SIGHUP: both valid, the old-key link goes on.
	k2, err := auth.NewKeyFile(newKey)
	if err != nil {
		t.Fatal(err)
	}
	tok2 := tok(k2)
	if st := status(tok2); st != http.StatusUnauthorized {
		t.Fatalf("new-key token before the reload: HTTP %d; want 401", st)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	meshtest.WaitFor(t, 5*time.Second, func() bool { return status(tok2) == http.StatusOK })
	if st := status(tok1); st != http.StatusOK {
		t.Errorf("old-key token with both keys: HTTP %d", st)
	}
	if err := c1.Call(ctx, "mesh.ping", nil, nil); err != nil {
		t.Errorf("old-key link after the new key was added: %v", err)
	}

	// Remove the old key, SIGHUP: old-key tokens refused, its link closed.
	if err := os.Remove(oldKey); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	meshtest.WaitFor(t, 5*time.Second, func() bool { return status(tok1) == http.StatusUnauthorized })
	if st := status(tok2); st != http.StatusOK {
		t.Errorf("new-key token after the old key was removed: HTTP %d", st)
	}
	if err := c1.Call(ctx, "mesh.ping", nil, nil); err == nil {
		t.Error("old-key link after the old key was removed: the call succeeded")
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("meshd exited %d; want 0 (stderr %s)", code, errb.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("meshd did not stop")
	}
}
