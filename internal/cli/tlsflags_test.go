package cli_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// secPKI is a test CA with a hub certificate for 127.0.0.1 (server and
// client usage, as a hub's, which also dials its demo agents and peers),
// a client certificate from the CA, and a client certificate from
// another CA; all PEM files in a temporary directory.
type secPKI struct {
	ca, hubCert, hubKey, clientCert, clientKey, rogueCert, rogueKey string
}

func newSecPKI(t *testing.T) secPKI {
	t.Helper()
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	serial := int64(0)
	newCA := func(cn string) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
		serial++
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
		if err != nil {
			t.Fatal(err)
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		return c, k, der
	}
	leaf := func(ca *x509.Certificate, caKey *ecdsa.PrivateKey, name string, usage ...x509.ExtKeyUsage) (string, string) {
		serial++
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usage,
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kd, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return write(name+".pem", "CERTIFICATE", der), write(name+"-key.pem", "EC PRIVATE KEY", kd)
	}
	ca, caKey, caDER := newCA("agentmesh test CA")
	rogueCA, rogueKey, _ := newCA("someone else's CA")
	p := secPKI{ca: write("ca.pem", "CERTIFICATE", caDER)}
	p.hubCert, p.hubKey = leaf(ca, caKey, "hub", x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth)
	p.clientCert, p.clientKey = leaf(ca, caKey, "client", x509.ExtKeyUsageClientAuth)
	p.rogueCert, p.rogueKey = leaf(rogueCA, rogueKey, "rogue", x509.ExtKeyUsageClientAuth)
	return p
}

// secTCPReady: something accepts TCP connections on addr (a TLS
// listener's probe cannot be a plain HTTP request).
func secTCPReady(addr string) bool {
	c, err := net.Dial("tcp", addr)
	if err == nil {
		c.Close()
	}
	return err == nil
}

// secWaitCall retries a meshctl call until it succeeds (the demo agents
// register shortly after meshd listens) or 15 s pass.
func secWaitCall(t *testing.T, args ...string) result {
	t.Helper()
	var r result
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if r = meshctl(t, "", args...); r.code == 0 {
			break
		}
	}
	return r
}

// TestMeshdTLSFlags: meshd's --tls-cert/--tls-key serve every surface
// over TLS, and with --client-ca over mutual TLS, reached by meshctl's
// --tls-ca/--tls-cert/--tls-key (or $MESH_TLS_CA): a client trusting the
// CA calls through wss:// and https:// (to the demo agents, which dial
// their own hub over wss presenting its certificate); a client that does
// not trust the CA, or speaks plain ws://, gets nothing through; with
// --client-ca a client without a certificate, or with one from another
// CA, is refused in the TLS handshake, before any HTTP; the admin port
// stays reachable without a client certificate (probes and scrapers).
func TestMeshdTLSFlags(t *testing.T) {
	pki := newSecPKI(t)
	const echo = `{"a":1}`
	call := func(hub string, flags ...string) result {
		return meshctl(t, "", append([]string{"call", "echo.echo", echo, "--hub", hub, "-o", "json"}, flags...)...)
	}
	failsUnreachable := func(name string, r result, why string) {
		t.Helper()
		if r.code != 3 || !strings.HasPrefix(r.stderr, "UNAVAILABLE: ") || !strings.Contains(r.stderr, why) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit 3, UNAVAILABLE naming %q", name, r.code, r.stdout, r.stderr, why)
		}
	}

	t.Run("TLS", func(t *testing.T) {
		addr := secFreeAddr(t)
		secMeshd(t, addr, secTCPReady, "--tls-cert", pki.hubCert, "--tls-key", pki.hubKey, "--tls-ca", pki.ca,
			"--demo", "--chat-data-dir", t.TempDir())
		wss, https := "wss://"+addr+"/ws", "https://"+addr+"/rpc"
		if r := secWaitCall(t, "call", "echo.echo", echo, "--hub", wss, "--tls-ca", pki.ca, "-o", "json"); r.code != 0 || r.stdout != echo+"\n" {
			t.Fatalf("wss with --tls-ca: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
		if r := call(https, "--tls-ca", pki.ca); r.code != 0 || r.stdout != echo+"\n" {
			t.Errorf("https with --tls-ca: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
		t.Setenv("MESH_TLS_CA", pki.ca)
		if r := call(wss); r.code != 0 {
			t.Errorf("wss with $MESH_TLS_CA: exit %d, stderr %q", r.code, r.stderr)
		}
		t.Setenv("MESH_TLS_CA", "")
		failsUnreachable("wss trusting the system's roots only", call(wss), "certificate")
		failsUnreachable("https trusting the system's roots only", call(https), "certificate")
		if r := call("ws://" + addr + "/ws"); r.code == 0 {
			t.Errorf("plain ws:// to the TLS port: the call went through (%q)", r.stdout)
		}
		if r := call("http://" + addr + "/rpc"); r.code == 0 {
			t.Errorf("plain http:// to the TLS port: the call went through (%q)", r.stdout)
		}
	})

	t.Run("mutual TLS", func(t *testing.T) {
		addr, admin := secFreeAddr(t), secFreeAddr(t)
		secMeshd(t, addr, secTCPReady, "--tls-cert", pki.hubCert, "--tls-key", pki.hubKey, "--client-ca", pki.ca,
			"--admin-addr", admin, "--demo", "--chat-data-dir", t.TempDir())
		wss, https := "wss://"+addr+"/ws", "https://"+addr+"/rpc"
		mine := []string{"--tls-ca", pki.ca, "--tls-cert", pki.clientCert, "--tls-key", pki.clientKey}
		if r := secWaitCall(t, append([]string{"call", "echo.echo", echo, "--hub", wss, "-o", "json"}, mine...)...); r.code != 0 || r.stdout != echo+"\n" {
			t.Fatalf("wss with a client certificate: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
		if r := call(https, mine...); r.code != 0 || r.stdout != echo+"\n" {
			t.Errorf("https with a client certificate: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
		}
		for _, tc := range []struct {
			name  string
			flags []string
		}{
			{"no client certificate", []string{"--tls-ca", pki.ca}},
			{"a certificate from another CA", []string{"--tls-ca", pki.ca, "--tls-cert", pki.rogueCert, "--tls-key", pki.rogueKey}},
		} {
			for _, hub := range []string{wss, https} {
				failsUnreachable(tc.name+" over "+hub[:strings.Index(hub, ":")], call(hub, tc.flags...), "certificate")
			}
		}

		// Refused in the handshake: the hub's alert comes before (instead
		// of) any HTTP response.
		roots := x509.NewCertPool()
		caPEM, err := os.ReadFile(pki.ca)
		if err != nil {
			t.Fatal(err)
		}
		roots.AppendCertsFromPEM(caPEM)
		rogue, err := tls.LoadX509KeyPair(pki.rogueCert, pki.rogueKey)
		if err != nil {
			t.Fatal(err)
		}
		// (Go's client offers no certificate the hub's CA list does not
		// name, as meshctl's refusal above shows; here the rogue one is
		// sent whatever the hub asks, for the hub to refuse it itself.)
		for name, cert := range map[string]*tls.Certificate{"no certificate": {}, "another CA's certificate": &rogue} {
			c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, &tls.Config{RootCAs: roots, ServerName: "127.0.0.1",
				GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }})
			if err != nil {
				if !strings.Contains(err.Error(), "certificate") {
					t.Errorf("raw TLS with %s: %v; want the hub's certificate alert", name, err)
				}
				continue // refused during the handshake itself (TLS 1.2)
			}
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			_, _ = io.WriteString(c, "GET /readyz HTTP/1.1\r\nHost: hub\r\n\r\n")
			b, err := io.ReadAll(c)
			c.Close()
			if len(b) != 0 || err == nil || !strings.Contains(err.Error(), "certificate") {
				t.Errorf("raw TLS with %s: read %q, %v; want the hub's certificate alert and no HTTP", name, b, err)
			}
		}

		// The admin port: TLS, a client certificate only if given.
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}}
		res, err := hc.Get("https://" + admin + "/livez")
		if err != nil {
			t.Fatalf("admin /livez without a client certificate: %v", err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Errorf("admin /livez: HTTP %d", res.StatusCode)
		}
	})

	// Flags that cannot work are refused before listening.
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--tls-cert", pki.hubCert}, "both a certificate and a key"},
		{[]string{"--tls-cert", pki.hubCert, "--tls-key", pki.clientKey}, "TLS certificate"},
		{[]string{"--tls-cert", pki.hubCert, "--tls-key", pki.hubKey, "--client-ca", pki.hubKey}, "holds no PEM certificate"},
		{[]string{"--client-ca", pki.ca}, "both a certificate and a key"},
	} {
		r := secMeshdRun(t, append([]string{"--check", "--listen", "127.0.0.1:0"}, tc.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("meshd --check %v: exit %d, stderr %q; want 2 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
}
