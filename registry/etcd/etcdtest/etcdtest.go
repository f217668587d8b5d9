// Package etcdtest starts a real etcd server (the etcd binary, Debian's
// etcd-server in CI) on loopback for tests, and stops it when they end.
package etcdtest

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// Server is a running etcd.
type Server struct {
	Endpoint string // http://127.0.0.1:PORT
	cmd      *exec.Cmd
	done     chan struct{}
}

func freePort(tb testing.TB) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Start runs etcd with its data in a temporary directory. Without an etcd
// binary it fails the test in CI (where .ci/run installs it) and skips it
// elsewhere, saying what to install.
func Start(tb testing.TB) *Server {
	tb.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		if os.Getenv("CI") != "" {
			tb.Fatalf("etcd is not installed: .ci/run installs Debian's etcd-server")
		}
		tb.Skip("etcd is not installed (apt-get install etcd-server); CI installs it")
	}
	client, peer := freePort(tb), freePort(tb)
	s := &Server{Endpoint: fmt.Sprintf("http://127.0.0.1:%d", client), done: make(chan struct{})}
	s.cmd = exec.Command(bin,
		"--name", "test", "--data-dir", tb.TempDir(),
		"--listen-client-urls", s.Endpoint, "--advertise-client-urls", s.Endpoint,
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peer),
		"--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peer),
		"--initial-cluster", fmt.Sprintf("test=http://127.0.0.1:%d", peer),
		"--log-level", "error", "--logger", "zap")
	if err := s.cmd.Start(); err != nil {
		tb.Fatalf("start etcd: %v", err)
	}
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	tb.Cleanup(s.Stop)
	deadline := time.Now().Add(15 * time.Second)
	for {
		res, err := http.Get(s.Endpoint + "/health")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return s
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("etcd did not become healthy: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop stops etcd (SIGTERM, then SIGKILL) and waits for it. Idempotent.
func (s *Server) Stop() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

// Pause freezes etcd (SIGSTOP) to make it unreachable; Resume thaws it.
func (s *Server) Pause()  { _ = s.cmd.Process.Signal(syscall.SIGSTOP) }
func (s *Server) Resume() { _ = s.cmd.Process.Signal(syscall.SIGCONT) }
