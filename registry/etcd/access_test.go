package etcd_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/registry"
	"github.com/agentmesh/agentmesh/registry/etcd"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
	"github.com/agentmesh/agentmesh/registry/registrytest"
)

// TestConformanceWithAuth: the whole registry contract against an etcd
// with authentication on, the registry's user holding readwrite on
// /conformance/ only (password), over TLS: every call the registry makes
// (grant, keep-alive, txn, watch, revoke) is one that role allows.
func TestConformanceWithAuth(t *testing.T) {
	certs := etcdtest.NewCerts(t)
	srv := etcdtest.StartWith(t, etcdtest.Options{TLS: certs})
	srv.EnableAuth(t, "root-pw", "agentmesh", "/conformance/", etcdtest.User{Name: "hub", Password: "hub-pw"})
	tlsCfg := certs.TLSConfig(t, "")
	registrytest.Run(t, func(t *testing.T) registry.Registry {
		r, err := etcd.New(etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: "/conformance/" + t.Name() + "/",
			Username: "hub", Password: "hub-pw", TLS: tlsCfg}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Close() })
		return r
	})
}

// TestTwoHubsShareOneViewWithCredentials: two registries authenticated
// by password, then by client certificate (--client-cert-auth, the CN
// the user), share one view under the prefix their role allows.
func TestTwoHubsShareOneViewWithCredentials(t *testing.T) {
	certs := etcdtest.NewCerts(t)
	for _, tc := range []struct {
		name string
		opts etcdtest.Options
		user etcdtest.User
		cfg  func(etcd.Config) etcd.Config
	}{
		{"password", etcdtest.Options{}, etcdtest.User{Name: "hub", Password: "hub-pw"}, func(c etcd.Config) etcd.Config {
			c.Username, c.Password = "hub", "hub-pw"
			return c
		}},
		{"client certificate", etcdtest.Options{TLS: certs, ClientCertAuth: true}, etcdtest.User{Name: "hub"}, func(c etcd.Config) etcd.Config {
			c.TLS = certs.TLSConfig(t, "hub")
			return c
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := etcdtest.StartWith(t, tc.opts)
			srv.EnableAuth(t, "root-pw", "agentmesh", "/two/", tc.user)
			cfg := tc.cfg(etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: "/two/", Hub: "hub-a"})
			a, err := etcd.New(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			cfg.Hub = "hub-b"
			b, err := etcd.New(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			reg := registrytest.Reg("agent-on-a", "kv.*")
			reg.Hub = "hub-a"
			if _, err := a.Register(context.Background(), reg); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "hub b to see the agent", 5*time.Second, func() bool {
				in := b.Snapshot().Instance("agent-on-a")
				return in != nil && in.Hub == "hub-a" && b.Synced()
			})
		})
	}
}

// TestCheckAccess: CheckAccess tells credentials etcd refuses (ErrRefused:
// waiting will not mend them) from an etcd that does not answer.
func TestCheckAccess(t *testing.T) {
	pw := etcdtest.Start(t)
	pw.EnableAuth(t, "root-pw", "agentmesh", "/mesh/", etcdtest.User{Name: "hub", Password: "hub-pw"}, etcdtest.User{Name: "other", Password: "other-pw"})
	// other exists but without the role on /mesh/.
	if _, err := pw.Client(t, "root", "root-pw", "").UserRevokeRole(t.Context(), "other", "agentmesh"); err != nil {
		t.Fatal(err)
	}
	certs := etcdtest.NewCerts(t)
	tlsSrv := etcdtest.StartWith(t, etcdtest.Options{TLS: certs, ClientCertAuth: true})
	tlsSrv.EnableAuth(t, "root-pw", "agentmesh", "/mesh/", etcdtest.User{Name: "hub"})
	otherCA := etcdtest.NewCerts(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() // nothing listens there once closed
	ln.Close()

	short := func(c etcd.Config) etcd.Config {
		c.Prefix, c.DialTimeout, c.OpTimeout = "/mesh/", time.Second, time.Second
		return c
	}
	for _, tc := range []struct {
		name    string
		cfg     etcd.Config
		refused bool // else no error at all, or "no answer"
		ok      bool
	}{
		{name: "right password", cfg: etcd.Config{Endpoints: []string{pw.Endpoint}, Username: "hub", Password: "hub-pw"}, ok: true},
		{name: "wrong password", cfg: etcd.Config{Endpoints: []string{pw.Endpoint}, Username: "hub", Password: "nope"}, refused: true},
		{name: "no credentials", cfg: etcd.Config{Endpoints: []string{pw.Endpoint}}, refused: true},
		{name: "user without the role", cfg: etcd.Config{Endpoints: []string{pw.Endpoint}, Username: "other", Password: "other-pw"}, refused: true},
		{name: "prefix outside the role", cfg: etcd.Config{Endpoints: []string{pw.Endpoint}, Username: "hub", Password: "hub-pw", Prefix: "/elsewhere/"}, refused: true},
		{name: "nothing listening", cfg: etcd.Config{Endpoints: []string{closed}, Username: "hub", Password: "hub-pw"}},
		{name: "client certificate", cfg: etcd.Config{Endpoints: []string{tlsSrv.Endpoint}, TLS: certs.TLSConfig(t, "hub")}, ok: true},
		{name: "no client certificate", cfg: etcd.Config{Endpoints: []string{tlsSrv.Endpoint}, TLS: certs.TLSConfig(t, "")}, refused: true},
		{name: "certificate of another CA", cfg: etcd.Config{Endpoints: []string{tlsSrv.Endpoint}, TLS: otherCA.TLSConfig(t, "hub")}, refused: true},
		{name: "certificate of an unknown user", cfg: etcd.Config{Endpoints: []string{tlsSrv.Endpoint}, TLS: certs.TLSConfig(t, "stranger")}, refused: true},
		{name: "TLS to nothing listening", cfg: etcd.Config{Endpoints: []string{"https" + closed[len("http"):]}, TLS: &tls.Config{MinVersion: tls.VersionTLS12}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			prefix := cfg.Prefix
			cfg = short(cfg)
			if prefix != "" {
				cfg.Prefix = prefix
			}
			start := time.Now()
			err := etcd.CheckAccess(t.Context(), cfg)
			t.Logf("%v after %v", err, time.Since(start).Round(time.Millisecond))
			switch {
			case tc.ok && err != nil:
				t.Errorf("CheckAccess: %v; want nil", err)
			case !tc.ok && err == nil:
				t.Error("CheckAccess: nil; want an error")
			case err != nil && errors.Is(err, etcd.ErrRefused) != tc.refused:
				t.Errorf("CheckAccess: %v; ErrRefused %v, want %v", err, errors.Is(err, etcd.ErrRefused), tc.refused)
			}
			if err != nil && (strings.Contains(err.Error(), "hub-pw") || strings.Contains(err.Error(), "other-pw")) {
				t.Errorf("the error shows the password: %v", err)
			}
		})
	}
}

// TestAuthTokenInvalidated: etcd drops a user's auth tokens when its
// password is changed (here to the same one, as a rotation's first step
// might); registries authenticated by password get new tokens and go on:
// registrations and heartbeats after it, with the probe's and the
// keep-alive's calls in between, reach the other registry, and the
// session written before it lives on.
func TestAuthTokenInvalidated(t *testing.T) {
	srv := etcdtest.Start(t)
	srv.EnableAuth(t, "root-pw", "agentmesh", "/tok/", etcdtest.User{Name: "hub", Password: "hub-pw"})
	cfg := etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: "/tok/", Username: "hub", Password: "hub-pw", HubTTL: 2 * time.Second}
	a, err := etcd.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := etcd.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	first := registrytest.Reg("before", "kv.*")
	first.HeartbeatInterval = 5 * time.Second
	if _, err := a.Register(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to see the first agent", 5*time.Second, func() bool { return b.Snapshot().Instance("before") != nil })
	root := srv.Client(t, "root", "root-pw", "")
	for i := range 3 {
		if _, err := root.UserChangePassword(t.Context(), "hub", "hub-pw"); err != nil {
			t.Fatal(err)
		}
		reg := registrytest.Reg(fmt.Sprintf("after-%d", i), "kv.*")
		reg.HeartbeatInterval = 5 * time.Second
		if _, err := a.Register(context.Background(), reg); err != nil {
			t.Fatalf("register after the tokens were dropped: %v", err)
		}
		if err := a.Heartbeat(context.Background(), "before", registry.Beat{}); err != nil {
			t.Fatalf("heartbeat after the tokens were dropped: %v", err)
		}
		waitFor(t, "b to see "+reg.InstanceID, 5*time.Second, func() bool { return b.Snapshot().Instance(reg.InstanceID) != nil })
		// Past a session TTL: a's keep-alive held its lease, b is synced.
		time.Sleep(2500 * time.Millisecond) // real time: the lease is etcd's clock
		if b.Snapshot().Instance("before") == nil || !b.Synced() {
			t.Fatalf("round %d: b lost the first agent (its session expired) or is not synced (%v)", i, b.Synced())
		}
	}
}

// TestAuthTokenExpiredWhileCut: a hub cut from etcd for longer than
// etcd's auth token TTL (1 s here, --auth-token-ttl; 5 min by default)
// finds its token expired when the link heals; it gets a new one and
// writes its agents again, which the other hub sees.
func TestAuthTokenExpiredWhileCut(t *testing.T) {
	srv := etcdtest.StartWith(t, etcdtest.Options{AuthTokenTTL: time.Second})
	srv.EnableAuth(t, "root-pw", "agentmesh", "/cut/", etcdtest.User{Name: "hub", Password: "hub-pw"})
	px := newCutProxy(t, srv.Endpoint)
	cfg := etcd.Config{Prefix: "/cut/", Username: "hub", Password: "hub-pw", HubTTL: 2 * time.Second, OpTimeout: time.Second}
	acfg, bcfg := cfg, cfg
	acfg.Endpoints, bcfg.Endpoints = []string{"http://" + px.addr()}, []string{srv.Endpoint}
	a, err := etcd.New(acfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := etcd.New(bcfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	reg := registrytest.Reg("on-a", "kv.*")
	reg.HeartbeatInterval = 5 * time.Second
	if _, err := a.Register(context.Background(), reg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b to see a's agent", 5*time.Second, func() bool { return b.Snapshot().Instance("on-a") != nil })
	px.cut(true)
	// Real time: the token's TTL and a's lease are etcd's clocks.
	waitFor(t, "a's lease to expire while cut (its agent gone from b)", 10*time.Second, func() bool { return b.Snapshot().Instance("on-a") == nil })
	time.Sleep(1500 * time.Millisecond) // past the token TTL too
	px.cut(false)
	healed := time.Now()
	waitFor(t, "a to write its agent again, seen by b", 15*time.Second, func() bool { return b.Snapshot().Instance("on-a") != nil })
	t.Logf("a's agent back in b's view %v after the heal", time.Since(healed).Round(time.Millisecond))
	reg.InstanceID = "on-a-2"
	if _, err := a.Register(context.Background(), reg); err != nil {
		t.Fatalf("register after the heal: %v", err)
	}
}

// cutProxy forwards TCP connections to an etcd; cut closes them all and
// refuses new ones until it is called with false.
type cutProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	isCut  bool
	conns  map[net.Conn]bool
}

func newCutProxy(t *testing.T, endpoint string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: strings.TrimPrefix(endpoint, "http://"), conns: map[net.Conn]bool{}}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			cut := p.isCut
			p.mu.Unlock()
			if cut {
				c.Close()
				continue
			}
			u, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns[c], p.conns[u] = true, true
			p.mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(u, c); u.Close(); c.Close() })
			wg.Go(func() { _, _ = io.Copy(c, u); u.Close(); c.Close() })
		}
	})
	t.Cleanup(func() { ln.Close(); p.cut(true); wg.Wait() })
	return p
}

func (p *cutProxy) addr() string { return p.ln.Addr().String() }

func (p *cutProxy) cut(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.isCut = on
	if on {
		for c := range p.conns {
			c.Close()
		}
		clear(p.conns)
	}
}
