package e2e_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
)

// The etcd side of these tests: the role meshd's user holds, limited to
// the mesh's prefix, as deploy/etcd-rbac.md sets it up.
const (
	etcdRole   = "agentmesh"
	meshPrefix = "/agentmesh/"
	etcdRootPw = "root-secret-e2e"
)

// writeSecret writes a password file readable by its owner only.
func writeSecret(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// meshTokens makes a mesh key and issues, with meshctl, the echo agent's
// token and a client's (admin: it lists the agents).
func meshTokens(t *testing.T) (key, agentTok, clientTok string) {
	t.Helper()
	key = newKey(t, t.TempDir())
	r := meshctl(t, "token", "issue", "--key", key, "--sub", "echo-agent", "--serve", "echo.*", "--ttl", "1h")
	if r.code != 0 {
		t.Fatalf("%v", r)
	}
	agentTok = strings.TrimSpace(r.stdout)
	r = meshctl(t, "token", "issue", "--key", key, "--sub", "e2e-client", "--role", "admin", "--ttl", "1h")
	if r.code != 0 {
		t.Fatalf("%v", r)
	}
	return key, agentTok, strings.TrimSpace(r.stdout)
}

// checkRoutedThroughOtherHub starts two hubs with args (each adding its
// id), an echo agent on A with its mesh token, and calls it through B.
func checkRoutedThroughOtherHub(t *testing.T, key, agentTok, clientTok string, args ...string) (a, b *hub) {
	t.Helper()
	common := append([]string{"--registry", "etcd", "--auth-key", key}, args...)
	a = startHub(t, append(common, "--id", "hub-A")...)
	b = startHub(t, append(common, "--id", "hub-B")...)
	startWithEnv(t, []string{"MESH_TOKEN=" + agentTok}, "meshctl", "agent", "run", "echo", "--id", "echo-a", "--hub", a.ws)
	cl, err := mesh.NewClient([]string{b.ws}, mesh.WithToken(clientTok))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	waitFor(t, "hub B to see echo-a (on hub A) through etcd", 10*time.Second, func() bool {
		var list []control.AgentInfo
		if cl.Call(t.Context(), "mesh.agents", nil, &list) != nil {
			return false
		}
		for _, ag := range list {
			if ag.AgentID == "echo-a" && ag.Hub == "hub-A" {
				return true
			}
		}
		return false
	})
	var got string
	if err := cl.Call(t.Context(), "echo.echo", "through B", &got, mesh.To("echo-a")); err != nil || got != "through B" {
		t.Fatalf("echo.echo to echo-a through hub B = %q, %v", got, err)
	}
	return a, b
}

// checkRoleHolds: with the hubs' own credentials etcd lets a client write
// under the mesh's prefix and nowhere else, and the hubs' keys are there.
func checkRoleHolds(t *testing.T, cli *clientv3.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	res, err := cli.Get(ctx, meshPrefix+"hubs/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil || res.Count != 2 {
		t.Fatalf("the hubs' presence under %shubs/ read with their credentials: %v keys, %v; want 2", meshPrefix, res, err)
	}
	if _, err := cli.Put(ctx, "/other-tenant/x", "y"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("write outside the prefix with the hubs' credentials: %v; want %v", err, rpctypes.ErrPermissionDenied)
	}
	if _, err := cli.Get(ctx, "/", clientv3.WithPrefix()); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("read of the whole keyspace with the hubs' credentials: %v; want %v", err, rpctypes.ErrPermissionDenied)
	}
}

// TestClusterEtcdPasswordAuth: etcd with auth on, meshd's user holding a
// role limited to /agentmesh/; two hubs authenticate with
// --etcd-username and --etcd-password-file, an echo agent on A is called
// through B, and the same credentials cannot write outside the prefix.
// Neither the password nor anything that grants etcd access reaches the
// agent or meshd's log; a mesh token is refused by etcd both as the
// password and as an etcd auth token.
func TestClusterEtcdPasswordAuth(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	const hubPw = "hub-secret-e2e-7f3a"
	srv.EnableAuth(t, etcdRootPw, etcdRole, meshPrefix, etcdtest.User{Name: "hub", Password: hubPw})
	// Auth is on: without credentials etcd refuses a read of the prefix.
	anon := srv.Client(t, "", "", "")
	if _, err := anon.Get(t.Context(), meshPrefix, clientv3.WithPrefix()); !errors.Is(err, rpctypes.ErrUserEmpty) {
		t.Fatalf("anonymous read of %s: %v; want %v", meshPrefix, err, rpctypes.ErrUserEmpty)
	}
	key, agentTok, clientTok := meshTokens(t)
	pwFile := writeSecret(t, "etcd-password", hubPw+"\n")
	a, b := checkRoutedThroughOtherHub(t, key, agentTok, clientTok,
		"--etcd-endpoints", srv.Endpoint, "--etcd-username", "hub", "--etcd-password-file", pwFile)
	checkRoleHolds(t, srv.Client(t, "hub", hubPw, ""))

	for _, h := range []*hub{a, b} {
		if log := h.stderr.String(); strings.Contains(log, hubPw) {
			t.Errorf("meshd logged the etcd password:\n%s", log)
		}
	}
	// An agent holds a mesh token, never etcd credentials: presented to
	// etcd, as the hub user's password, as a password of a user named by
	// the token's subject, or as etcd's own auth token, it is refused.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, user := range []string{"hub", "echo-agent", "root"} {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, Username: user, Password: agentTok, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err == nil {
			cli.Close()
		}
		if !errors.Is(err, rpctypes.ErrAuthFailed) {
			t.Errorf("mesh token as etcd user %q's password: %v; want %v", user, err, rpctypes.ErrAuthFailed)
		}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, Token: agentTok, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Get(ctx, meshPrefix, clientv3.WithPrefix()); !errors.Is(err, rpctypes.ErrInvalidAuthToken) {
		t.Errorf("mesh token as etcd's auth token, read of %s: %v; want %v", meshPrefix, err, rpctypes.ErrInvalidAuthToken)
	}
	if _, err := cli.Put(ctx, meshPrefix+"instances/forged", "{}"); !errors.Is(err, rpctypes.ErrInvalidAuthToken) {
		t.Errorf("mesh token as etcd's auth token, write under %s: %v; want %v", meshPrefix, err, rpctypes.ErrInvalidAuthToken)
	}
}

// TestClusterEtcdClientCertAuth: the same over TLS with etcd's
// --client-cert-auth, meshd known to etcd by its client certificate's CN
// (--etcd-cert, --etcd-key, --etcd-ca; a user without a password).
func TestClusterEtcdClientCertAuth(t *testing.T) {
	t.Parallel()
	certs := etcdtest.NewCerts(t)
	srv := etcdtest.StartWith(t, etcdtest.Options{TLS: certs, ClientCertAuth: true})
	srv.EnableAuth(t, etcdRootPw, etcdRole, meshPrefix, etcdtest.User{Name: "hub"})
	hubCert, hubKey := certs.Client(t, "hub")
	key, agentTok, clientTok := meshTokens(t)
	checkRoutedThroughOtherHub(t, key, agentTok, clientTok,
		"--etcd-endpoints", srv.Endpoint, "--etcd-cert", hubCert, "--etcd-key", hubKey, "--etcd-ca", certs.CA)
	checkRoleHolds(t, srv.Client(t, "", "", "hub"))
	// The mesh token is no etcd credential over TLS either.
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, Token: agentTok, TLS: certs.TLSConfig(t, "hub"), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Put(t.Context(), meshPrefix+"instances/forged", "{}"); !errors.Is(err, rpctypes.ErrInvalidAuthToken) {
		t.Errorf("mesh token as etcd's auth token over TLS: %v; want %v", err, rpctypes.ErrInvalidAuthToken)
	}
}

// TestMeshdEtcdCredentialsRefused: meshd whose credentials etcd refuses
// does not serve: it exits 1 at once with etcd's reason in an error log
// line and on stderr, and never logs the password. A wrong password, no
// client certificate, a certificate of a user etcd does not know, and a
// CA that did not sign etcd's certificate.
func TestMeshdEtcdCredentialsRefused(t *testing.T) {
	t.Parallel()
	pwSrv := etcdtest.Start(t)
	pwSrv.EnableAuth(t, etcdRootPw, etcdRole, meshPrefix, etcdtest.User{Name: "hub", Password: "the-right-one"})
	const wrong = "not-the-password-e2e"
	certs := etcdtest.NewCerts(t)
	tlsSrv := etcdtest.StartWith(t, etcdtest.Options{TLS: certs, ClientCertAuth: true})
	tlsSrv.EnableAuth(t, etcdRootPw, etcdRole, meshPrefix, etcdtest.User{Name: "hub"}, etcdtest.User{Name: "outsider"})
	intruderCert, intruderKey := certs.Client(t, "intruder") // signed by the CA, but no such etcd user
	hubCert, hubKey := certs.Client(t, "hub")
	other := etcdtest.NewCerts(t) // another CA
	// outsider is an etcd user without the role on the prefix.
	root := tlsSrv.Client(t, "root", etcdRootPw, "root")
	if _, err := root.UserRevokeRole(t.Context(), "outsider", etcdRole); err != nil {
		t.Fatal(err)
	}
	outsiderCert, outsiderKey := certs.Client(t, "outsider")
	for _, tc := range []struct {
		name   string
		args   []string
		reason string // etcd's, in the log
	}{
		{"wrong password", []string{"--etcd-endpoints", pwSrv.Endpoint, "--etcd-username", "hub", "--etcd-password-file", writeSecret(t, "pw", wrong)},
			"as user \\\"hub\\\", reading /agentmesh/ at [" + pwSrv.Endpoint + "]: etcdserver: authentication failed, invalid user ID or password"},
		{"password of a user etcd does not know", []string{"--etcd-endpoints", pwSrv.Endpoint, "--etcd-username", "nobody", "--etcd-password-file", writeSecret(t, "pw", wrong)},
			"etcdserver: authentication failed, invalid user ID or password"},
		{"no client certificate", []string{"--etcd-endpoints", tlsSrv.Endpoint, "--etcd-ca", certs.CA}, "access to etcd refused: TLS handshake with " + tlsSrv.Endpoint + " failed: remote error: tls: bad certificate"},
		{"certificate of a user etcd does not know", []string{"--etcd-endpoints", tlsSrv.Endpoint, "--etcd-ca", certs.CA, "--etcd-cert", intruderCert, "--etcd-key", intruderKey},
			"with its client certificate, reading /agentmesh/ at [" + tlsSrv.Endpoint + "]: etcdserver: permission denied"},
		{"certificate of a user without the role", []string{"--etcd-endpoints", tlsSrv.Endpoint, "--etcd-ca", certs.CA, "--etcd-cert", outsiderCert, "--etcd-key", outsiderKey},
			"etcdserver: permission denied"},
		{"etcd's certificate from another CA", []string{"--etcd-endpoints", tlsSrv.Endpoint, "--etcd-ca", other.CA, "--etcd-cert", hubCert, "--etcd-key", hubKey},
			"x509: certificate signed by unknown authority"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := start(t, "meshd", append([]string{"--listen", "127.0.0.1:0", "--registry", "etcd"}, tc.args...)...)
			select {
			case <-p.done:
			case <-time.After(20 * time.Second):
				t.Fatalf("meshd still running 20 s after etcd refused its credentials:\n%s", p.stderr.String())
			}
			log := p.stderr.String()
			if code := p.cmd.ProcessState.ExitCode(); code != 1 {
				t.Errorf("meshd exit code %d; want 1", code)
			}
			if !strings.Contains(log, `"msg":"registry: access to etcd refused; not starting"`) || !strings.Contains(log, tc.reason) {
				t.Errorf("meshd's log does not say etcd refused its credentials (%q):\n%s", tc.reason, log)
			}
			if strings.Contains(log, wrong) {
				t.Errorf("meshd logged the password:\n%s", log)
			}
			if strings.Contains(log, "hub listening") {
				t.Errorf("meshd served though etcd refused its credentials:\n%s", log)
			}
		})
	}
}

// TestMeshdWaitsForEtcdToCheckCredentials: meshd with credentials started
// while etcd is down says so at each attempt (every 1 to 5 s) and serves
// nothing; stopped
// meanwhile it exits 0; once etcd is back it checks the credentials and
// serves.
func TestMeshdWaitsForEtcdToCheckCredentials(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	const hubPw = "hub-secret-wait"
	srv.EnableAuth(t, etcdRootPw, etcdRole, meshPrefix, etcdtest.User{Name: "hub", Password: hubPw})
	srv.Stop()
	args := []string{"--listen", "127.0.0.1:0", "--heartbeat", "200ms", "--registry", "etcd", "--etcd-endpoints", srv.Endpoint,
		"--etcd-username", "hub", "--etcd-password-file", writeSecret(t, "pw", hubPw)}
	const waiting = `"msg":"registry: etcd does not answer; waiting for it to check this hub's credentials before serving"`
	stopped := start(t, "meshd", args...)
	p := start(t, "meshd", args...)
	waitFor(t, "meshd saying twice that etcd does not answer", 15*time.Second, func() bool {
		return strings.Count(p.stderr.String(), waiting) >= 2 && strings.Count(stopped.stderr.String(), waiting) >= 1
	})
	if log := p.stderr.String(); strings.Contains(log, "hub listening") || strings.Contains(log, hubPw) {
		t.Fatalf("meshd served before etcd checked its credentials, or logged the password:\n%s", log)
	}
	stopped.stop(5 * time.Second)
	if code := stopped.cmd.ProcessState.ExitCode(); code != 0 || !strings.Contains(stopped.stderr.String(), "stopped before etcd answered") {
		t.Errorf("meshd stopped while waiting for etcd: exit %d; want 0 and a log line:\n%s", code, stopped.stderr.String())
	}
	srv.Restart(t)
	waitFor(t, `meshd serving once etcd is back`, 15*time.Second, func() bool {
		if p.exitedYet() {
			t.Fatalf("meshd exited (%v):\n%s", p.err, p.stderr.String())
		}
		return listeningAddr(p.stderr.String()) != ""
	})
	h := &hub{proc: p, addr: listeningAddr(p.stderr.String())}
	client := &http.Client{Timeout: time.Second}
	waitFor(t, "meshd /readyz 200", 10*time.Second, func() bool {
		return httpStatus(client, "http://"+h.addr+"/readyz") == http.StatusOK
	})
	if !strings.Contains(p.stderr.String(), `"msg":"registry: etcd accepts this hub's credentials"`) {
		t.Errorf("meshd did not log that etcd accepted its credentials:\n%s", p.stderr.String())
	}
}
