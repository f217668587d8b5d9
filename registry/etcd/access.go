package etcd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/status"
)

// ErrRefused marks CheckAccess's errors that waiting does not mend: etcd
// refused the credentials of Config, or the TLS handshake failed.
var ErrRefused = errors.New("access to etcd refused")

// CheckAccess connects to etcd with cfg's endpoints and credentials and
// reads the prefix once (a count, no values), within ctx and at most
// DialTimeout (default 5 s) plus OpTimeout (default 3 s). It returns nil
// when etcd lets it; an error wrapping ErrRefused when etcd refuses the
// credentials (a wrong password, an unknown user, a role without the
// prefix, no or an untrusted client certificate, a server certificate the
// CA does not vouch for); any other error means etcd did not answer.
func CheckAccess(ctx context.Context, cfg Config) error {
	if len(cfg.Endpoints) == 0 {
		return errors.New("etcd registry: no endpoints")
	}
	dial, op := cfg.DialTimeout, cfg.OpTimeout
	if dial <= 0 {
		dial = 5 * time.Second
	}
	if op <= 0 {
		op = 3 * time.Second
	}
	prefix := cfg.Prefix
	if prefix == "" {
		prefix = "/agentmesh/"
	}
	who := "without credentials"
	if cfg.Username != "" {
		who = fmt.Sprintf("as user %q", cfg.Username)
	} else if cfg.TLS != nil && len(cfg.TLS.Certificates) > 0 {
		who = "with its client certificate"
	}
	if cfg.TLS != nil {
		// A TLS handshake etcd fails (no client certificate, or one it
		// does not trust; a server certificate the CA did not sign)
		// reaches a gRPC call only as a timeout: an HTTPS request
		// names it.
		if err := tlsHandshake(ctx, cfg, dial); err != nil {
			return err
		}
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: dial, Logger: zap.NewNop(), Context: ctx,
		Username: cfg.Username, Password: cfg.Password, TLS: cfg.TLS})
	if err == nil {
		defer cli.Close()
		gctx, cancel := context.WithTimeout(ctx, op)
		_, err = cli.Get(gctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		cancel()
	}
	if err == nil {
		return nil
	}
	if refused(err) {
		return fmt.Errorf("etcd registry: %w %s, reading %s at %v: %s", ErrRefused, who, prefix, cfg.Endpoints, status.Convert(err).Message())
	}
	return fmt.Errorf("etcd registry: no answer from etcd at %v %s: %s", cfg.Endpoints, who, status.Convert(err).Message())
}

// refused reports whether err is etcd refusing credentials: one of its
// auth errors, or a failed TLS handshake, which gRPC reports only as the
// text of the connection's last error.
func refused(err error) bool {
	for _, e := range []error{rpctypes.ErrAuthFailed, rpctypes.ErrPermissionDenied, rpctypes.ErrUserEmpty,
		rpctypes.ErrUserNotFound, rpctypes.ErrRoleNotGranted, rpctypes.ErrInvalidAuthToken, rpctypes.ErrInvalidAuthMgmt} {
		if errors.Is(err, e) {
			return true
		}
	}
	msg := status.Convert(err).Message()
	return strings.Contains(msg, "tls:") || strings.Contains(msg, "x509:")
}

// tlsHandshake GETs /health of each https:// endpoint with cfg.TLS: an
// error wrapping ErrRefused if the TLS handshake fails, another if no
// endpoint answers, nil once one completes the exchange.
func tlsHandshake(ctx context.Context, cfg Config, timeout time.Duration) error {
	tr := &http.Transport{TLSClientConfig: cfg.TLS.Clone(), ForceAttemptHTTP2: false}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: timeout}
	var last error
	for _, ep := range cfg.Endpoints {
		if !strings.HasPrefix(ep, "https://") {
			continue
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(ep, "/")+"/health", nil)
		if err != nil {
			return err
		}
		res, err := client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 1<<16))
			res.Body.Close()
			return nil
		}
		if msg := err.Error(); strings.Contains(msg, "tls:") || strings.Contains(msg, "x509:") {
			// From etcd's alert ("remote error: tls: bad certificate")
			// or this side's verdict on etcd's certificate, without
			// net/http's wrapping.
			for _, from := range []string{"remote error:", "tls:", "x509:"} {
				if i := strings.Index(msg, from); i >= 0 {
					msg = msg[i:]
					break
				}
			}
			return fmt.Errorf("etcd registry: %w: TLS handshake with %s failed: %s", ErrRefused, ep, msg)
		}
		last = err
	}
	if last != nil {
		return fmt.Errorf("etcd registry: no answer from etcd: %v", last)
	}
	return nil
}
