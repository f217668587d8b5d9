package etcd

import (
	"context"
	"errors"
	"sync"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// tokenAuth is password authentication to etcd done by the registry
// rather than by clientv3. clientv3 (v3.7) gets a new token when etcd
// refuses the old one (expired: idle for --auth-token-ttl, 5 min by
// default, as during a partition; dropped: the user's password changed)
// by calling Authenticate on the same connection, which still carries the
// refused token; etcd 3.4 (Debian's etcd-server) checks it and refuses
// Authenticate too, so such a client never recovers (measured:
// TestAuthTokenInvalidated). Here the token is fetched on a second
// connection that carries none, and the main connection's calls that etcd
// refuses for their token are tried once more with a new one.
type tokenAuth struct {
	user, password string
	authCli        *clientv3.Client // no credentials: Authenticate only

	refreshMu sync.Mutex // one Authenticate at a time

	mu    sync.RWMutex // guards token, never held over a call to etcd
	token string
}

// newTokenAuth connects the authenticating client and gets the first
// token within ctx.
func newTokenAuth(ctx context.Context, cfg Config, lg *zap.Logger) (*tokenAuth, error) {
	authCli, err := clientv3.New(clientv3.Config{Endpoints: cfg.Endpoints, DialTimeout: cfg.DialTimeout, TLS: cfg.TLS, Logger: lg})
	if err != nil {
		return nil, err
	}
	a := &tokenAuth{user: cfg.Username, password: cfg.Password, authCli: authCli}
	if err := a.refresh(ctx, ""); err != nil {
		_ = authCli.Close()
		return nil, err
	}
	return a, nil
}

// current is the token calls carry now.
func (a *tokenAuth) current() string {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.token
}

// refresh gets a new token unless another call already replaced stale.
func (a *tokenAuth) refresh(ctx context.Context, stale string) error {
	a.refreshMu.Lock()
	defer a.refreshMu.Unlock()
	if a.current() != stale {
		return nil
	}
	token := ""
	res, err := a.authCli.Authenticate(ctx, a.user, a.password)
	switch {
	case errors.Is(err, rpctypes.ErrAuthNotEnabled): // calls go without a token
	case err != nil:
		return err
	default:
		token = res.Token
	}
	a.mu.Lock()
	a.token = token
	a.mu.Unlock()
	return nil
}

// GetRequestMetadata and RequireTransportSecurity make tokenAuth the main
// connection's per-call credentials.
func (a *tokenAuth) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	if t := a.current(); t != "" {
		return map[string]string{rpctypes.TokenFieldNameGRPC: t}, nil
	}
	return nil, nil
}

func (a *tokenAuth) RequireTransportSecurity() bool { return false }

// tokenRefused reports whether etcd refused a call for its token.
func tokenRefused(err error) bool {
	err = rpctypes.Error(err)
	return errors.Is(err, rpctypes.ErrInvalidAuthToken) || errors.Is(err, rpctypes.ErrAuthOldRevision) || errors.Is(err, rpctypes.ErrUserEmpty)
}

// dialOptions attach the token to every call of the main connection, and
// try a unary call whose token etcd refused once more with a new one.
// (Streams need nothing: a watch refused for its token ends, the registry
// lists again, a unary call, and watches anew with the new token.)
func (a *tokenAuth) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithPerRPCCredentials(a),
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			stale := a.current()
			err := invoker(ctx, method, req, reply, cc, opts...)
			if err == nil || !tokenRefused(err) {
				return err
			}
			if rerr := a.refresh(ctx, stale); rerr != nil {
				return rerr
			}
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
	}
}

func (a *tokenAuth) close() { _ = a.authCli.Close() }
