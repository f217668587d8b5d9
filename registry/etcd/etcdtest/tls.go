package etcdtest

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
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Certs is a test PKI made with crypto/x509, in PEM files of a temporary
// directory: a CA, a server certificate for 127.0.0.1 and, on demand,
// client certificates whose CN etcd takes as the user name
// (--client-cert-auth).
type Certs struct {
	Dir        string
	CA         string // the CA certificate
	ServerCert string // for 127.0.0.1 and localhost, signed by the CA
	ServerKey  string

	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
	serial int64
}

// NewCerts makes a CA and a server certificate in a temporary directory.
func NewCerts(tb testing.TB) *Certs {
	tb.Helper()
	c := &Certs{Dir: tb.TempDir(), serial: 1}
	key := newKey(tb)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "etcdtest CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	if c.caCert, err = x509.ParseCertificate(der); err != nil {
		tb.Fatal(err)
	}
	c.caKey = key
	c.CA = filepath.Join(c.Dir, "ca.pem")
	writePEM(tb, c.CA, "CERTIFICATE", der)
	c.ServerCert, c.ServerKey = c.issue(tb, "server", "etcd", []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		[]net.IP{net.IPv4(127, 0, 0, 1)}, []string{"localhost"})
	return c
}

// Client issues a client certificate with CN cn (the etcd user it is
// taken for) and returns its certificate and key files.
func (c *Certs) Client(tb testing.TB, cn string) (cert, key string) {
	tb.Helper()
	return c.issue(tb, "client-"+cn, cn, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil, nil)
}

// TLSConfig is a client TLS configuration trusting the CA, presenting
// the client certificate of cn (none if cn is empty).
func (c *Certs) TLSConfig(tb testing.TB, cn string) *tls.Config {
	tb.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(c.caCert)
	cfg := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if cn != "" {
		certFile, keyFile := c.Client(tb, cn)
		kp, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			tb.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{kp}
	}
	return cfg
}

func (c *Certs) issue(tb testing.TB, name, cn string, usage []x509.ExtKeyUsage, ips []net.IP, dns []string) (cert, key string) {
	tb.Helper()
	c.serial++
	k := newKey(tb)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(c.serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: usage, IPAddresses: ips, DNSNames: dns,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.caCert, &k.PublicKey, c.caKey)
	if err != nil {
		tb.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		tb.Fatal(err)
	}
	cert, key = filepath.Join(c.Dir, name+".pem"), filepath.Join(c.Dir, name+"-key.pem")
	writePEM(tb, cert, "CERTIFICATE", der)
	writePEM(tb, key, "EC PRIVATE KEY", kder)
	return cert, key
}

func newKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	return k
}

func writePEM(tb testing.TB, path, typ string, der []byte) {
	tb.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
}

// User is an etcd user for EnableAuth. An empty Password makes a user
// without one, known only by a client certificate's CN.
type User struct {
	Name, Password string
}

// EnableAuth turns etcd's authentication on, as an operator would: a root
// user (password rootPassword) with the root role, a role named role with
// readwrite on the keys under prefix and nothing else, the users given
// that role, then auth enable. On a member started with ClientCertAuth it
// connects with a client certificate of CN root.
func (s *Server) EnableAuth(tb testing.TB, rootPassword, role, prefix string, users ...User) {
	tb.Helper()
	cli := s.Client(tb, "", "", "root")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	step := func(what string, err error) {
		if err != nil {
			tb.Fatalf("etcd %s: %s: %v", s.Name, what, err)
		}
	}
	_, err := cli.UserAdd(ctx, "root", rootPassword)
	step("user add root", err)
	_, err = cli.UserGrantRole(ctx, "root", "root")
	step("user grant-role root root", err)
	_, err = cli.RoleAdd(ctx, role)
	step("role add "+role, err)
	_, err = cli.RoleGrantPermission(ctx, role, prefix, clientv3.GetPrefixRangeEnd(prefix), clientv3.PermissionType(clientv3.PermReadWrite))
	step("role grant-permission --prefix "+role+" readwrite "+prefix, err)
	for _, u := range users {
		if u.Password == "" {
			_, err = cli.UserAddWithOptions(ctx, u.Name, "", &clientv3.UserAddOptions{NoPassword: true})
		} else {
			_, err = cli.UserAdd(ctx, u.Name, u.Password)
		}
		step("user add "+u.Name, err)
		_, err = cli.UserGrantRole(ctx, u.Name, role)
		step("user grant-role "+u.Name+" "+role, err)
	}
	_, err = cli.AuthEnable(ctx)
	step("auth enable", err)
}

// Client is a client of this member as user with password (none if
// empty) and, on a TLS member, a client certificate of CN certCN (none
// if empty). It is closed when the test ends.
func (s *Server) Client(tb testing.TB, user, password, certCN string) *clientv3.Client {
	tb.Helper()
	cfg := clientv3.Config{Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		Username: user, Password: password}
	if s.Certs != nil {
		cfg.TLS = s.Certs.TLSConfig(tb, certCN)
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		tb.Fatalf("etcd %s client as %q: %v", s.Name, user, err)
	}
	tb.Cleanup(func() { _ = cli.Close() })
	return cli
}

// Options are StartWith's settings.
type Options struct {
	// TLS, if set, serves clients over https with its server certificate.
	TLS *Certs
	// ClientCertAuth (with TLS) requires a client certificate signed by
	// the CA (--client-cert-auth); with auth enabled its CN is the user.
	ClientCertAuth bool
	// AuthTokenTTL, if set, is how long an idle auth token lives once
	// auth is enabled (--auth-token-ttl, whole seconds; etcd's default
	// 5 min).
	AuthTokenTTL time.Duration
}
