package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/agentmesh/agentmesh/registry/etcd"
)

// etcdAuth is how meshd authenticates to etcd: --etcd-username with
// --etcd-password-file, and/or a client certificate (--etcd-cert,
// --etcd-key; etcd's --client-cert-auth takes its CN as the user), with
// --etcd-ca to verify etcd's own certificate. Agents never see any of it:
// they reach the mesh through a hub, never etcd.
type etcdAuth struct {
	user, passwordFile string
	cert, key, ca      string
}

// maxPasswordFile bounds what is read of --etcd-password-file.
const maxPasswordFile = 4096

// load checks the flags against each other and the endpoints, reads the
// password file and the TLS files, and returns what etcd.Config takes.
// The password goes nowhere else (never into a log or an error).
func (a etcdAuth) load(endpoints []string) (user, password string, tlsCfg *tls.Config, err error) {
	switch {
	case a.user != "" && a.passwordFile == "":
		return "", "", nil, errors.New("--etcd-username needs --etcd-password-file (a user known only by its client certificate's CN needs neither: give --etcd-cert and --etcd-key)")
	case a.user == "" && a.passwordFile != "":
		return "", "", nil, errors.New("--etcd-password-file needs --etcd-username")
	case a.cert != "" && a.key == "":
		return "", "", nil, fmt.Errorf("--etcd-cert %s needs --etcd-key", a.cert)
	case a.cert == "" && a.key != "":
		return "", "", nil, fmt.Errorf("--etcd-key %s needs --etcd-cert", a.key)
	}
	if a.passwordFile != "" {
		if password, err = readPasswordFile(a.passwordFile); err != nil {
			return "", "", nil, err
		}
	}
	if a.cert == "" && a.ca == "" {
		return a.user, password, nil, nil
	}
	// TLS given: every endpoint must use it. clientv3 would dial an
	// http:// endpoint in clear text, the configuration ignored.
	for _, ep := range endpoints {
		if !strings.HasPrefix(ep, "https://") {
			return "", "", nil, fmt.Errorf("--etcd-endpoints %s: with --etcd-cert or --etcd-ca every endpoint must be https://", ep)
		}
	}
	tlsCfg = &tls.Config{MinVersion: tls.VersionTLS12}
	if a.ca != "" {
		pem, err := os.ReadFile(a.ca)
		if err != nil {
			return "", "", nil, fmt.Errorf("--etcd-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return "", "", nil, fmt.Errorf("--etcd-ca %s holds no PEM certificate", a.ca)
		}
		tlsCfg.RootCAs = pool
	}
	if a.cert != "" {
		kp, err := tls.LoadX509KeyPair(a.cert, a.key)
		if err != nil {
			return "", "", nil, fmt.Errorf("--etcd-cert %s, --etcd-key %s: %w", a.cert, a.key, err)
		}
		tlsCfg.Certificates = []tls.Certificate{kp}
	}
	return a.user, password, tlsCfg, nil
}

// readPasswordFile reads etcd's password from path: a regular file that
// its group cannot write and other users cannot read (as --auth-key's),
// not empty; one trailing newline is dropped.
func readPasswordFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("--etcd-password-file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("--etcd-password-file: %w", err)
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("--etcd-password-file %s is not a regular file", path)
	}
	if perm := st.Mode().Perm(); perm&0o027 != 0 {
		return "", fmt.Errorf("--etcd-password-file %s has mode %04o: it must not be readable by other users or writable by its group; run chmod 600 %s", path, perm, path)
	}
	data, err := io.ReadAll(io.LimitReader(f, maxPasswordFile+1))
	if err != nil {
		return "", fmt.Errorf("--etcd-password-file: %w", err)
	}
	if len(data) > maxPasswordFile {
		return "", fmt.Errorf("--etcd-password-file %s is larger than %d bytes", path, maxPasswordFile)
	}
	pw := strings.TrimSuffix(strings.TrimSuffix(string(data), "\n"), "\r")
	if pw == "" {
		return "", fmt.Errorf("--etcd-password-file %s is empty", path)
	}
	return pw, nil
}

// waitEtcdAccess asks etcd whether cfg's credentials may read the
// prefix, again a second after each attempt etcd did not answer (saying
// so each time); it returns nil once they may, an error (exit 1) when etcd
// refuses them, and nil (exit 0, nothing served) if meshd is stopped
// meanwhile: the caller sees ctx done.
func waitEtcdAccess(ctx context.Context, log *slog.Logger, cfg etcd.Config) error {
	// Short attempts, so that the log says often enough that etcd is
	// awaited: one every 1 to 5 s.
	cfg.DialTimeout, cfg.OpTimeout = 2*time.Second, 2*time.Second
	for {
		err := etcd.CheckAccess(ctx, cfg)
		if err == nil {
			log.Info("registry: etcd accepts this hub's credentials", "endpoints", cfg.Endpoints, "user", cfg.Username)
			return nil
		}
		if errors.Is(err, etcd.ErrRefused) {
			log.Error("registry: access to etcd refused; not starting", "error", err)
			return withCode(ExitError, err)
		}
		log.Warn("registry: etcd does not answer; waiting for it to check this hub's credentials before serving", "error", err)
		t := time.NewTimer(time.Second)
		select {
		case <-ctx.Done():
			t.Stop()
			log.Info("stopped before etcd answered")
			return nil
		case <-t.C:
		}
	}
}
