package cli_test

import (
	"bytes"
	"context"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/internal/cli"
	"github.com/agentmesh/agentmesh/internal/freeport"
	"github.com/agentmesh/agentmesh/mesh"
)

// secKey writes a new key file (meshctl token keygen's format) and
// returns its path and secret.
func secKey(t *testing.T) (string, []byte) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "auth.key")
	k, err := auth.NewKeyFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return p, k
}

func secToken(t *testing.T, key []byte, c auth.Claims) string {
	t.Helper()
	tok, err := auth.Issue(key, c, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// secFreeAddr returns a loopback address no one listens on (yet).
func secFreeAddr(t *testing.T) string {
	t.Helper()
	return freeport.Addr(t)
}

// secPlainReady: a plain-HTTP meshd answers its readiness probe.
func secPlainReady(addr string) bool {
	res, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return false
	}
	res.Body.Close()
	return res.StatusCode == http.StatusOK
}

// secMeshd runs meshd in this process, as the binary does (cli.Run of
// cli.NewMeshd), listening on addr with args, until the test ends, and
// waits until ready(addr) holds. At the end it stops meshd as SIGTERM
// would and checks that it exited 0.
func secMeshd(t *testing.T, addr string, ready func(string) bool, args ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var mu sync.Mutex
	var errb bytes.Buffer
	w := secLockedWriter{mu: &mu, w: &errb}
	go func() {
		done <- cli.Run(ctx, cli.NewMeshd(&bytes.Buffer{}, w), append([]string{"--listen", addr, "--log-level", "error"}, args...), w)
	}()
	stderr := func() string { mu.Lock(); defer mu.Unlock(); return errb.String() }
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("meshd exited %d; stderr %s", code, stderr())
			}
		case <-time.After(20 * time.Second):
			t.Errorf("meshd did not stop within 20 s")
		}
	})
	deadline := time.Now().Add(15 * time.Second)
	for !ready(addr) {
		select {
		case code := <-done:
			t.Fatalf("meshd exited %d before it was ready; stderr %s", code, stderr())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("meshd not ready within 15 s; stderr %s", stderr())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type secLockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l secLockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// secAgent runs an agent on hub until the test ends and waits until it
// is registered.
func secAgent(t *testing.T, hub string, a *agents.Agent) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = a.Run(ctx, hub) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	select {
	case <-a.Registered():
	case <-time.After(15 * time.Second):
		t.Fatalf("agent %s did not register within 15 s", a.Name())
	}
}

// secClient is a client of hub presenting tok, without retries (a refusal
// is seen as the hub gave it).
func secClient(t *testing.T, hub, tok string, opts ...mesh.ClientOption) *mesh.Client {
	t.Helper()
	c, err := mesh.NewClient([]string{hub}, append([]mesh.ClientOption{mesh.WithToken(tok), mesh.WithoutReliability()}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// secMeshdRun runs meshd with args to its end (--check, or a refusal).
func secMeshdRun(t *testing.T, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	code := cli.Run(ctx, cli.NewMeshd(&out, &errb), args, &errb)
	return result{code, out.String(), errb.String()}
}
