package hub_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/registry/etcd"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
)

// testPKI writes a CA, a certificate for 127.0.0.1 (server and client
// usage, as a hub's) and a client certificate into dir; it returns their
// paths.
type testPKI struct{ ca, cert, key, clientCert, clientKey, otherCA string }

func newPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	newCA := func(cn string) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
		if err != nil {
			t.Fatal(err)
		}
		c, _ := x509.ParseCertificate(der)
		return c, k, der
	}
	ca, caKey, caDER := newCA("agentmesh test CA")
	_, _, otherDER := newCA("someone else's CA")
	leaf := func(name string, serial int64, usage []x509.ExtKeyUsage) (string, string) {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			ExtKeyUsage: usage, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kd, _ := x509.MarshalECPrivateKey(k)
		return write(name+".pem", "CERTIFICATE", der), write(name+"-key.pem", "EC PRIVATE KEY", kd)
	}
	p := testPKI{ca: write("ca.pem", "CERTIFICATE", caDER), otherCA: write("other-ca.pem", "CERTIFICATE", otherDER)}
	p.cert, p.key = leaf("hub", 2, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth})
	p.clientCert, p.clientKey = leaf("client", 3, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth})
	return p
}

// TestMutualTLS: a hub serving mutual TLS answers clients and agents that
// present a certificate from its CA, over wss:// and https://; a client
// without a certificate, or that does not trust the hub's CA, or that
// speaks plain ws://, gets nothing through.
func TestMutualTLS(t *testing.T) {
	pki := newPKI(t)
	srv, err := link.ServerTLS(pki.cert, pki.key, pki.ca)
	if err != nil {
		t.Fatal(err)
	}
	m := meshtest.Start(t, hub.Config{TLS: srv})
	wss, https := strings.Replace(m.WS, "ws://", "wss://", 1), strings.Replace(m.HTTP, "http://", "https://", 1)
	good, err := link.ClientTLS(pki.ca, pki.clientCert, pki.clientKey)
	if err != nil {
		t.Fatal(err)
	}
	runAgentUntilEnd(t, agents.NewEcho(agents.WithConnConfig(link.Config{TLS: good})), wss, "over mutual TLS")
	for _, url := range []string{wss, https} {
		c := testkit.MustClient(t, url, mesh.WithTLS(good))
		var got []string
		if err := c.Call(t.Context(), "echo.echo", []string{"over tls"}, &got); err != nil || len(got) != 1 || got[0] != "over tls" {
			t.Errorf("%s: %q, %v", url, got, err)
		}
	}
	noCert, _ := link.ClientTLS(pki.ca, "", "")
	distrust, _ := link.ClientTLS(pki.otherCA, pki.clientCert, pki.clientKey)
	for name, c := range map[string]struct {
		url string
		tls *tls.Config
	}{
		"no client certificate (wss)":   {wss, noCert},
		"no client certificate (https)": {https, noCert},
		"hub's CA not trusted":          {wss, distrust},
		"plain ws to a TLS port":        {m.WS, nil},
	} {
		cl := testkit.MustClient(t, c.url, mesh.WithTLS(c.tls), mesh.WithoutReliability())
		err := cl.Call(t.Context(), "echo.echo", []string{"x"}, nil)
		if err == nil {
			t.Errorf("%s: the call went through", name)
			continue
		}
		if code := envelope.CodeOf(err); code != envelope.CodeUnavailable {
			t.Errorf("%s: %v; want UNAVAILABLE (no hub reachable)", name, err)
		}
	}
}

// runAgentUntilEnd runs ag against url until the test ends (its run
// returned when the test's deferred cleanups run), and waits up to 10 s
// for it to register; what names the test's transport in the failure.
func runAgentUntilEnd(t *testing.T, ag *agents.Agent, url, what string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ag.Run(ctx, url) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-ag.Registered():
	case <-time.After(10 * time.Second):
		t.Fatal("the agent did not register " + what)
	}
}

// TestPeerLinksOverMutualTLS: two hubs serving mutual TLS on one etcd; a
// call entering hub B for the agent on hub A crosses a wss peer link on
// which B presents its own certificate (the hub certificate has both the
// serverAuth and clientAuth usages).
func TestPeerLinksOverMutualTLS(t *testing.T) {
	pki := newPKI(t)
	srvTLS, err := link.ServerTLS(pki.cert, pki.key, pki.ca)
	if err != nil {
		t.Fatal(err)
	}
	peerTLS, err := link.ClientTLS(pki.ca, pki.cert, pki.key)
	if err != nil {
		t.Fatal(err)
	}
	etcdSrv := etcdtest.Start(t)
	hb := func(name string) *meshtest.Mesh {
		reg, err := etcd.New(etcd.Config{Endpoints: []string{etcdSrv.Endpoint}, Prefix: "/mtls/", Hub: "hub-" + name}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return meshtest.StartCluster(t, hub.Config{ID: "hub-" + name, TLS: srvTLS, PeerTLS: peerTLS}, reg)
	}
	a, b := hb("A"), hb("B")
	wss := func(m *meshtest.Mesh) string { return strings.Replace(m.WS, "ws://", "wss://", 1) }
	clientTLS, _ := link.ClientTLS(pki.ca, pki.clientCert, pki.clientKey)
	runAgentUntilEnd(t, agents.NewEcho(agents.WithID("echo-on-a"), agents.WithConnConfig(link.Config{TLS: clientTLS})), wss(a), "on hub A over mutual TLS")
	meshtest.WaitFor(t, 5*time.Second, func() bool { return b.Hub.Registry().Snapshot().Instance("echo-on-a") != nil })
	c := testkit.MustClient(t, wss(b), mesh.WithTLS(clientTLS))
	for i := range 20 {
		var got []int
		if err := c.Call(t.Context(), "echo.echo", []int{i}, &got); err != nil || len(got) != 1 || got[0] != i {
			t.Fatalf("call %d through B to A: %v, %v", i, got, err)
		}
	}
}
