package cli_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentmesh/agentmesh/internal/cli"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
)

// TestMeshdEtcdCredentialFlags: meshd --check reads and validates the
// etcd credential flags (and their MESH_ETCD_* variables) before anything
// starts: a password file that is missing, readable by others or empty, a
// certificate without its key, TLS files that do not parse, TLS with an
// http:// endpoint are refused with an error naming the flag; the
// password itself is never printed.
func TestMeshdEtcdCredentialFlags(t *testing.T) {
	dir := t.TempDir()
	file := func(name, body string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask
			t.Fatal(err)
		}
		return p
	}
	const secret = "s3cret-etcd-pw"
	pw := file("pw", secret+"\n", 0o600)
	certs := etcdtest.NewCerts(t)
	cert, key := certs.Client(t, "hub")
	_, otherKey := certs.Client(t, "other")
	junk := file("junk.pem", "not a certificate\n", 0o600)
	https := []string{"--registry", "etcd", "--etcd-endpoints", "https://127.0.0.1:2379"}
	cases := []struct {
		name    string
		env     []string // KEY=VALUE
		args    []string
		stderr  string // a part of it, when refused (exit 2)
		summary string // a part of --check's line, when accepted
	}{
		{name: "user and password", args: []string{"--registry", "etcd", "--etcd-username", "hub", "--etcd-password-file", pw}, summary: `registry etcd, auth false, tls false, admin "", etcd user "hub", etcd tls false)`},
		{name: "user from the environment", env: []string{"MESH_REGISTRY=etcd", "MESH_ETCD_USERNAME=hub", "MESH_ETCD_PASSWORD_FILE=" + pw}, summary: `etcd user "hub", etcd tls false`},
		{name: "user without password", args: []string{"--etcd-username", "hub"}, stderr: "--etcd-username needs --etcd-password-file"},
		{name: "password without user", args: []string{"--etcd-password-file", pw}, stderr: "--etcd-password-file needs --etcd-username"},
		{name: "password file missing", args: []string{"--etcd-username", "hub", "--etcd-password-file", filepath.Join(dir, "none")}, stderr: "--etcd-password-file: open " + filepath.Join(dir, "none") + ": no such file or directory"},
		{name: "password file world-readable", args: []string{"--etcd-username", "hub", "--etcd-password-file", file("pw644", secret, 0o644)}, stderr: "has mode 0644: it must not be readable by other users"},
		{name: "password file group-writable", args: []string{"--etcd-username", "hub", "--etcd-password-file", file("pw620", secret, 0o620)}, stderr: "has mode 0620"},
		{name: "password file empty", args: []string{"--etcd-username", "hub", "--etcd-password-file", file("pw0", "", 0o600)}, stderr: "is empty"},
		{name: "password file only a newline", args: []string{"--etcd-username", "hub", "--etcd-password-file", file("pwnl", "\n", 0o600)}, stderr: "is empty"},
		{name: "password file a directory", args: []string{"--etcd-username", "hub", "--etcd-password-file", t.TempDir()}, stderr: "is not a regular file"},
		{name: "client certificate", args: append(https, "--etcd-cert", cert, "--etcd-key", key, "--etcd-ca", certs.CA), summary: `etcd user "", etcd tls true`},
		{name: "client certificate from the environment", env: []string{"MESH_REGISTRY=etcd", "MESH_ETCD_ENDPOINTS=https://127.0.0.1:2379", "MESH_ETCD_CERT=" + cert, "MESH_ETCD_KEY=" + key, "MESH_ETCD_CA=" + certs.CA}, summary: `etcd tls true`},
		{name: "CA only", args: append(https, "--etcd-ca", certs.CA, "--etcd-username", "hub", "--etcd-password-file", pw), summary: `etcd user "hub", etcd tls true`},
		{name: "certificate without key", args: append(https, "--etcd-cert", cert), stderr: "--etcd-cert " + cert + " needs --etcd-key"},
		{name: "key without certificate", args: append(https, "--etcd-key", key), stderr: "--etcd-key " + key + " needs --etcd-cert"},
		{name: "certificate does not parse", args: append(https, "--etcd-cert", junk, "--etcd-key", key), stderr: "--etcd-cert " + junk + ", --etcd-key " + key + ": tls: failed to find any PEM data in certificate input"},
		{name: "key of another certificate", args: append(https, "--etcd-cert", cert, "--etcd-key", otherKey), stderr: "private key does not match public key"},
		{name: "certificate file missing", args: append(https, "--etcd-cert", filepath.Join(dir, "none.pem"), "--etcd-key", key), stderr: "no such file or directory"},
		{name: "CA does not parse", args: append(https, "--etcd-ca", junk), stderr: "--etcd-ca " + junk + " holds no PEM certificate"},
		{name: "CA missing", args: append(https, "--etcd-ca", filepath.Join(dir, "none-ca.pem")), stderr: "--etcd-ca: open"},
		{name: "TLS with an http endpoint", args: []string{"--registry", "etcd", "--etcd-endpoints", "https://127.0.0.1:2379,http://127.0.0.1:2380", "--etcd-ca", certs.CA},
			stderr: "--etcd-endpoints http://127.0.0.1:2380: with --etcd-cert or --etcd-ca every endpoint must be https://"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, kv := range tc.env {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
			var out, errb bytes.Buffer
			code := cli.Run(t.Context(), cli.NewMeshd(&out, &errb), append(tc.args, "--check", "--log-level", "error"), &errb)
			want := cli.ExitOK
			if tc.stderr != "" {
				want = cli.ExitUsage
			}
			if code != want {
				t.Fatalf("exit %d; want %d\nstdout %s\nstderr %s", code, want, out.String(), errb.String())
			}
			if tc.stderr != "" && !strings.Contains(errb.String(), tc.stderr) {
				t.Errorf("stderr %q; want it to say %q", errb.String(), tc.stderr)
			}
			if tc.summary != "" && (!strings.Contains(out.String(), "meshd: configuration OK") || !strings.Contains(out.String(), tc.summary)) {
				t.Errorf("stdout %q; want the --check summary with %q", out.String(), tc.summary)
			}
			if strings.Contains(out.String()+errb.String(), secret) {
				t.Errorf("the password was printed: stdout %q stderr %q", out.String(), errb.String())
			}
		})
	}
}
