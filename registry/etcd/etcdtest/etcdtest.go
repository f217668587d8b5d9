// Package etcdtest starts a real etcd server (the etcd binary, Debian's
// etcd-server in CI) on loopback for tests, and stops it when they end:
// one member (Start) or a cluster of several (StartCluster).
package etcdtest

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/internal/freeport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Server is a running etcd member.
type Server struct {
	Name     string // member name ("test" for Start)
	Endpoint string // http://127.0.0.1:PORT (https:// with Options.TLS)
	Certs    *Certs // the PKI of a TLS member (StartWith), else nil

	bin  string
	args []string // the command line, to restart the member

	health *http.Client // what waitHealthy polls /health with

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// freePort: a port for etcd to bind, from below the ephemeral range (see
// freeport).
func freePort(tb testing.TB) int {
	tb.Helper()
	return freeport.Port(tb)
}

// Binary returns the path of the etcd binary, for tests that run etcd
// their own way (in a network namespace): as Start, it fails the test in
// CI without one and skips it elsewhere.
func Binary(tb testing.TB) string {
	tb.Helper()
	return lookup(tb)
}

// lookup finds the etcd binary. Without one it fails the test in CI (where
// .ci/run installs it) and skips it elsewhere, saying what to install.
func lookup(tb testing.TB) string {
	tb.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		if os.Getenv("CI") != "" {
			tb.Fatalf("etcd is not installed: .ci/run installs Debian's etcd-server")
		}
		tb.Skip("etcd is not installed (apt-get install etcd-server); CI installs it")
	}
	return bin
}

// Start runs etcd with its data in a temporary directory. Without an etcd
// binary it fails the test in CI (where .ci/run installs it) and skips it
// elsewhere, saying what to install.
func Start(tb testing.TB) *Server {
	tb.Helper()
	return StartWith(tb, Options{})
}

// StartWith is Start with options: clients served over TLS, and a client
// certificate required of them.
func StartWith(tb testing.TB, o Options) *Server {
	tb.Helper()
	bin := lookup(tb)
	if o.ClientCertAuth && o.TLS == nil {
		tb.Fatal("etcdtest: ClientCertAuth needs TLS")
	}
	client, peer := freePort(tb), freePort(tb)
	scheme := "http"
	if o.TLS != nil {
		scheme = "https"
	}
	s := &Server{Name: "test", Endpoint: fmt.Sprintf("%s://127.0.0.1:%d", scheme, client), bin: bin, Certs: o.TLS,
		health: &http.Client{Timeout: time.Second}}
	s.args = []string{
		"--name", "test", "--data-dir", tb.TempDir(),
		"--listen-client-urls", s.Endpoint, "--advertise-client-urls", s.Endpoint,
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peer),
		"--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peer),
		"--initial-cluster", fmt.Sprintf("test=http://127.0.0.1:%d", peer),
		"--log-level", "error", "--logger", "zap"}
	if o.AuthTokenTTL > 0 {
		s.args = append(s.args, "--auth-token-ttl", fmt.Sprint(max(int(o.AuthTokenTTL.Seconds()), 1)))
	}
	if o.TLS != nil {
		s.args = append(s.args, "--cert-file", o.TLS.ServerCert, "--key-file", o.TLS.ServerKey)
		cn := ""
		if o.ClientCertAuth {
			s.args = append(s.args, "--client-cert-auth", "--trusted-ca-file", o.TLS.CA)
			cn = "etcdtest-health" // a user that does not exist: /health needs no permission
		}
		s.health.Transport = &http.Transport{TLSClientConfig: o.TLS.TLSConfig(tb, cn)}
	}
	s.run(tb)
	tb.Cleanup(s.Stop)
	s.waitHealthy(tb, 15*time.Second)
	return s
}

// run starts the process.
func (s *Server) run(tb testing.TB) {
	tb.Helper()
	cmd := exec.Command(s.bin, s.args...)
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start etcd %s: %v", s.Name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
}

// proc is the current process and its exit channel.
func (s *Server) proc() (*exec.Cmd, chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd, s.done
}

// waitHealthy polls /health until it answers 200, failing the test after d.
func (s *Server) waitHealthy(tb testing.TB, d time.Duration) {
	tb.Helper()
	client := s.health
	if client == nil {
		client = &http.Client{Timeout: time.Second}
	}
	deadline := time.Now().Add(d)
	for {
		res, err := client.Get(s.Endpoint + "/health")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("etcd %s did not become healthy: %v", s.Name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// exited reports whether the member's process has exited.
func (s *Server) exited() bool {
	_, done := s.proc()
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// Stop stops etcd (SIGTERM, then SIGKILL) and waits for it. Idempotent.
func (s *Server) Stop() {
	cmd, done := s.proc()
	select {
	case <-done:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// Kill stops the member at once (SIGKILL) and waits for its exit: a crash.
func (s *Server) Kill() {
	cmd, done := s.proc()
	_ = cmd.Process.Kill()
	<-done
}

// Restart runs a stopped or killed member again on its data directory,
// same name and URLs (it rejoins its cluster), and waits until it is
// healthy.
func (s *Server) Restart(tb testing.TB) {
	tb.Helper()
	if !s.exited() {
		tb.Fatalf("etcd %s restarted while running", s.Name)
	}
	s.run(tb)
	s.waitHealthy(tb, 30*time.Second)
}

// Pause freezes etcd (SIGSTOP) to make it unreachable; Resume thaws it.
func (s *Server) Pause() {
	cmd, _ := s.proc()
	_ = cmd.Process.Signal(syscall.SIGSTOP)
}

func (s *Server) Resume() {
	cmd, _ := s.proc()
	_ = cmd.Process.Signal(syscall.SIGCONT)
}

// Cluster is a multi-member etcd cluster on loopback.
type Cluster struct {
	Members []*Server
	// ElectionTimeout is the members' --election-timeout: once the leader
	// dies a follower starts an election after 1 to 2 times this.
	ElectionTimeout time.Duration
}

// StartCluster runs an n-member etcd cluster on loopback, each member its
// own process with --initial-cluster naming all of them (heartbeat 100 ms,
// election timeout 1 s: etcd's defaults), and waits until every member is
// healthy. Like Start it skips without an etcd binary outside CI. The
// members are stopped when the test ends.
func StartCluster(tb testing.TB, n int) *Cluster {
	tb.Helper()
	bin := lookup(tb)
	c := &Cluster{ElectionTimeout: time.Second}
	clients, peers := make([]int, n), make([]int, n)
	var initial []string
	for i := range n {
		clients[i], peers[i] = freePort(tb), freePort(tb)
		initial = append(initial, fmt.Sprintf("m%d=http://127.0.0.1:%d", i, peers[i]))
	}
	token := fmt.Sprintf("etcdtest-%d-%d", os.Getpid(), clients[0])
	for i := range n {
		s := &Server{Name: fmt.Sprintf("m%d", i), Endpoint: fmt.Sprintf("http://127.0.0.1:%d", clients[i]), bin: bin}
		peerURL := fmt.Sprintf("http://127.0.0.1:%d", peers[i])
		s.args = []string{"--name", s.Name, "--data-dir", tb.TempDir(),
			"--listen-client-urls", s.Endpoint, "--advertise-client-urls", s.Endpoint,
			"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", token,
			"--heartbeat-interval", "100", "--election-timeout", fmt.Sprint(c.ElectionTimeout.Milliseconds()),
			"--log-level", "error", "--logger", "zap"}
		c.Members = append(c.Members, s)
	}
	for _, s := range c.Members {
		s.run(tb)
		tb.Cleanup(s.Stop)
	}
	for _, s := range c.Members {
		s.waitHealthy(tb, 30*time.Second)
	}
	return c
}

// Endpoints are the members' client URLs.
func (c *Cluster) Endpoints() []string {
	out := make([]string, 0, len(c.Members))
	for _, s := range c.Members {
		out = append(out, s.Endpoint)
	}
	return out
}

// Leader asks the running members for their status (the client's Status
// API) and returns the index of the member they name as leader; an error
// when none answers, none knows a leader or the leader is not running.
func (c *Cluster) Leader(ctx context.Context) (int, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return -1, err
	}
	defer cli.Close()
	ids := map[uint64]int{}
	var leader uint64
	var lastErr error
	for i, s := range c.Members {
		if s.exited() {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := cli.Status(sctx, s.Endpoint)
		cancel()
		if err != nil {
			lastErr = err
			continue
		}
		ids[st.Header.MemberId] = i
		if leader == 0 {
			leader = st.Leader
		}
	}
	if leader == 0 {
		return -1, fmt.Errorf("no member names a leader (last error: %v)", lastErr)
	}
	i, ok := ids[leader]
	if !ok {
		return -1, fmt.Errorf("leader %x is not a running member", leader)
	}
	return i, nil
}
