package auth

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/agentmesh/agentmesh/envelope"
)

// Issuer is the "iss" of every token: Verify refuses JWTs signed with the
// same key for some other purpose.
const Issuer = "agentmesh"

// MaxTokenLen bounds a token; longer strings are refused before parsing.
const MaxTokenLen = 8 << 10

// MinKeyLen is the shortest HMAC key accepted (HS256 wants at least the
// hash size, RFC 7518 §3.2).
const MinKeyLen = 32

// DefaultLeeway is the clock skew Verify tolerates on exp and iat.
const DefaultLeeway = 2 * time.Second

// Claims is what a token says about its holder.
type Claims struct {
	// Subject names the holder: an agent, a caller or a peer hub ("sub").
	Subject string `json:"sub"`
	// Roles the holder has, checked against a method's required roles
	// with Allowed.
	Roles []string `json:"roles,omitempty"`
	// Serve lists the method patterns the holder may register as an agent
	// ("memory.*", "echo.echo", "*"); see MayServe. Empty: serves nothing.
	Serve []string `json:"serve,omitempty"`
	// IssuedAt ("iat") and ExpiresAt ("exp") have one-second precision.
	IssuedAt  time.Time `json:"iat"`
	ExpiresAt time.Time `json:"exp"`
	// ID is the token's unique id ("jti"); safe to log, unlike the token.
	ID string `json:"jti"`
	// Audience names the one party the token is for ("aud"): a hub's
	// peer token names the hub it dials, a peer proof the hub that
	// dialled. Empty: any. A token with several audiences is refused.
	Audience string `json:"aud,omitempty"`
	// Addr is the address the token was sent to ("addr"): a peer token
	// names the host:port its hub dialled, so that the hub that
	// advertises another refuses it.
	Addr string `json:"addr,omitempty"`
	// Nonce ("nonce") binds a peer proof to the token it answers (that
	// token's ID).
	Nonce string `json:"nonce,omitempty"`
}

// ErrExpired is the cause (errors.Is) of the UNAUTHENTICATED error Verify
// returns for an expired token, for a caller that must tell expiry apart
// (to ask for a fresh token) without parsing messages.
var ErrExpired = errors.New("auth: token expired")

// wire is the JSON payload of a token.
type wire struct {
	Roles []string `json:"roles,omitempty"`
	Serve []string `json:"serve,omitempty"`
	Addr  string   `json:"addr,omitempty"`
	Nonce string   `json:"nonce,omitempty"`
	jwt.RegisteredClaims
}

func (c *Claims) check() error {
	if !validSubject(c.Subject) {
		return errors.New("subject must be 1 to 256 printable ASCII bytes without space")
	}
	if len(c.Roles) > 64 || len(c.Serve) > 256 {
		return errors.New("too many roles or serve patterns")
	}
	for _, r := range c.Roles {
		if !validRole(r) {
			return fmt.Errorf("role %q: want 1 to 64 ASCII letters, digits or _-.:", r)
		}
	}
	for _, p := range c.Serve {
		if !ValidPattern(p) {
			return fmt.Errorf("serve pattern %q: want a method name, name.* or *", p)
		}
	}
	for _, f := range []struct{ name, v string }{{"audience", c.Audience}, {"addr", c.Addr}, {"nonce", c.Nonce}} {
		if f.v != "" && !validSubject(f.v) {
			return fmt.Errorf("%s must be 1 to 256 printable ASCII bytes without space", f.name)
		}
	}
	return nil
}

// Issue signs claims with key (HS256) and returns the token. A zero
// IssuedAt becomes now; ExpiresAt becomes IssuedAt + ttl; an empty ID
// becomes 128 random bits. It refuses a key shorter than MinKeyLen, a
// ttl under a second, and claims Verify would refuse (bad subject, role or pattern).
//
// The token's "kid" header is KeyID(key); IssueKID names another.
func Issue(key []byte, claims Claims, ttl time.Duration) (string, error) {
	return IssueKID(key, KeyID(key), claims, ttl)
}

// IssueKID is Issue with the "kid" header kid: the id a verifier knows
// the key by (KeyID, or a label given with the key; see Key).
func IssueKID(key []byte, kid string, claims Claims, ttl time.Duration) (string, error) {
	return issue(key, kid, Issuer, claims, ttl)
}

// ProofIssuer is the "iss" of a peer proof (IssueProof): the answer a hub
// gives a peer that dialled it, to prove it holds the mesh key. It is
// never a credential: Verify refuses it ("wrong token issuer"), as
// VerifyProof refuses every other token.
const ProofIssuer = "agentmesh/peer-proof"

// IssueProof is IssueKID for a peer proof (ProofIssuer).
func IssueProof(key []byte, kid string, claims Claims, ttl time.Duration) (string, error) {
	return issue(key, kid, ProofIssuer, claims, ttl)
}

func issue(key []byte, kid, iss string, claims Claims, ttl time.Duration) (string, error) {
	if !validKID(kid) {
		return "", fmt.Errorf("auth: key id %q: want 1 to 64 ASCII letters, digits or _-.:", kid)
	}
	if len(key) < MinKeyLen {
		return "", fmt.Errorf("auth: key is %d bytes; want at least %d", len(key), MinKeyLen)
	}
	if ttl < time.Second {
		return "", errors.New("auth: ttl must be at least 1s (tokens have one-second precision)")
	}
	if err := claims.check(); err != nil {
		return "", fmt.Errorf("auth: %w", err)
	}
	if claims.IssuedAt.IsZero() {
		claims.IssuedAt = time.Now()
	}
	if claims.ID == "" {
		var b [16]byte
		_, _ = rand.Read(b[:]) // never fails (crypto/rand)
		claims.ID = base64.RawURLEncoding.EncodeToString(b[:])
	}
	w := wire{
		Roles: claims.Roles,
		Serve: claims.Serve,
		Addr:  claims.Addr,
		Nonce: claims.Nonce,
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:    iss,
			Subject:   claims.Subject,
			IssuedAt:  jwt.NewNumericDate(claims.IssuedAt),
			ExpiresAt: jwt.NewNumericDate(claims.IssuedAt.Add(ttl)),
			ID:        claims.ID,
		},
	}
	if claims.Audience != "" {
		w.Audience = jwt.ClaimStrings{claims.Audience}
	}
	t := jwt.NewWithClaims(jwt.SigningMethodHS256, w)
	t.Header["kid"] = kid
	s, err := t.SignedString(key)
	if err != nil {
		return "", fmt.Errorf("auth: signing: %w", err)
	}
	return s, nil
}

// Verifier checks tokens signed with any of its keys. It is safe for
// concurrent use, SetKeys included.
type Verifier struct {
	keys     atomic.Pointer[keySet]
	leeway   time.Duration
	now      func() time.Time
	parser   *jwt.Parser // tokens (Issuer)
	proofs   *jwt.Parser // peer proofs (ProofIssuer)
	keysOnly *jwt.Parser // CheckKey: the signature only
}

// VerifierOption configures a Verifier.
type VerifierOption func(*Verifier)

// WithLeeway sets the clock skew tolerated on exp and iat (DefaultLeeway).
func WithLeeway(d time.Duration) VerifierOption { return func(v *Verifier) { v.leeway = d } }

// WithClock replaces time.Now (tests).
func WithClock(now func() time.Time) VerifierOption { return func(v *Verifier) { v.now = now } }

// NewVerifier returns a Verifier for key; it refuses a key shorter than
// MinKeyLen.
func NewVerifier(key []byte, opts ...VerifierOption) (*Verifier, error) {
	return NewKeySetVerifier([]Key{{Secret: key}}, opts...)
}

// NewKeySetVerifier returns a Verifier for several keys (key rotation):
// a token whose "kid" header names one of them is checked with that key
// only; a token without "kid" is checked against each in turn.
func NewKeySetVerifier(keys []Key, opts ...VerifierOption) (*Verifier, error) {
	v := &Verifier{leeway: DefaultLeeway, now: time.Now}
	if err := v.SetKeys(keys); err != nil {
		return nil, err
	}
	for _, o := range opts {
		o(v)
	}
	parser := func(iss string) *jwt.Parser {
		return jwt.NewParser(
			jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
			jwt.WithLeeway(v.leeway),
			jwt.WithTimeFunc(v.now),
			jwt.WithExpirationRequired(),
			jwt.WithIssuedAt(),
			jwt.WithIssuer(iss),
			jwt.WithStrictDecoding(),
		)
	}
	v.parser, v.proofs = parser(Issuer), parser(ProofIssuer)
	v.keysOnly = jwt.NewParser(
		jwt.WithValidMethods([]string{jwt.SigningMethodHS256.Alg()}),
		jwt.WithoutClaimsValidation(),
		jwt.WithStrictDecoding(),
	)
	return v, nil
}

// Leeway returns the clock skew the Verifier tolerates.
func (v *Verifier) Leeway() time.Duration { return v.leeway }

func unauthenticated(msg string, cause error) *envelope.Error {
	return envelope.WrapError(envelope.CodeUnauthenticated, msg, cause)
}

var errNoToken = unauthenticated("missing token", nil)

// Verify parses token, checks its HS256 signature, issuer, expiry (with
// the leeway) and issued-at, and the shape of its claims, and returns
// them. Every failure is an *envelope.Error with code UNAUTHENTICATED and
// a message safe to send to the client ("missing token", "malformed
// token", "unsupported token algorithm", "bad token signature", "token
// expired", "token not valid yet", "wrong token issuer", "invalid token
// claims"); an expired token's error also matches errors.Is(err,
// ErrExpired). Tokens with alg "none" or any algorithm other than HS256,
// and tokens with a "crit" header, are refused. The audience, address and
// nonce are returned, not checked: the party the token is presented to
// checks they name it (a hub: mesh's guard).
func (v *Verifier) Verify(token string) (*Claims, error) {
	return v.verify(v.parser, token)
}

// VerifyProof is Verify for a peer proof (IssueProof): it refuses every
// token that is not one, as Verify refuses proofs.
func (v *Verifier) VerifyProof(token string) (*Claims, error) {
	return v.verify(v.proofs, token)
}

// CheckKey reports whether token's signature (HS256) verifies under the
// verifier's current keys, whatever its times and claims: a peer link
// outlives the short token it was opened with, and is closed when a
// rotation drops the key that signed it (see mesh's Hub.SetAuthKeys).
func (v *Verifier) CheckKey(token string) error {
	if token == "" || len(token) > MaxTokenLen {
		return unauthenticated("malformed token", nil)
	}
	var w wire
	return v.parse(v.keysOnly, token, &w)
}

// parse parses and checks token into w, mapping every failure to its
// UNAUTHENTICATED error.
func (v *Verifier) parse(parser *jwt.Parser, token string, w *wire) error {
	if !compactJWS(token) {
		return unauthenticated("malformed token: a character outside base64url and '.'", nil)
	}
	t, err := parser.ParseWithClaims(token, w, v.keyFunc)
	if err != nil {
		if t != nil && t.Method != jwt.SigningMethodHS256 && !errors.Is(err, jwt.ErrTokenMalformed) {
			// Refused by WithValidMethods (or the key func) before any
			// signature check, or an unknown "alg".
			return unauthenticated("unsupported token algorithm", err)
		}
		return mapErr(err)
	}
	return nil
}

// compactJWS reports whether token has only the characters of a JWS
// compact serialization: base64url (no padding) and the dots between its
// parts. Go's base64 decoders, even in strict mode, skip CR and LF, so
// without this check a signed token with line breaks inserted would verify
// too: a second spelling of one token (found by FuzzVerify).
func compactJWS(token string) bool {
	for i := 0; i < len(token); i++ {
		switch c := token[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_', c == '.':
		default:
			return false
		}
	}
	return true
}

func (v *Verifier) verify(parser *jwt.Parser, token string) (*Claims, error) {
	switch {
	case token == "":
		return nil, errNoToken
	case len(token) > MaxTokenLen:
		return nil, unauthenticated("token too large", nil)
	}
	var w wire
	if err := v.parse(parser, token, &w); err != nil {
		return nil, err
	}
	c := &Claims{Subject: w.Subject, Roles: w.Roles, Serve: w.Serve, ID: w.ID, Addr: w.Addr, Nonce: w.Nonce}
	switch len(w.Audience) {
	case 0:
	case 1:
		c.Audience = w.Audience[0]
	default:
		return nil, unauthenticated("invalid token claims", errors.New("more than one audience"))
	}
	if w.IssuedAt == nil || w.ExpiresAt == nil {
		return nil, unauthenticated("invalid token claims", errors.New("iat and exp are required"))
	}
	c.IssuedAt, c.ExpiresAt = w.IssuedAt.Time, w.ExpiresAt.Time
	if !c.ExpiresAt.After(c.IssuedAt) {
		return nil, unauthenticated("invalid token claims", errors.New("exp is not after iat"))
	}
	if err := c.check(); err != nil {
		return nil, unauthenticated("invalid token claims", err)
	}
	return c, nil
}

func (v *Verifier) keyFunc(t *jwt.Token) (any, error) {
	if t.Method != jwt.SigningMethodHS256 {
		return nil, errAlg
	}
	if _, ok := t.Header["crit"]; ok {
		return nil, errCrit
	}
	ks := v.keys.Load()
	kid, ok := t.Header["kid"]
	if !ok {
		return ks.all, nil
	}
	s, _ := kid.(string)
	if k, found := ks.byID[s]; found && s != "" {
		return k, nil
	}
	return nil, errKID
}

var (
	errAlg  = errors.New("algorithm is not HS256")
	errCrit = errors.New("critical header extensions are not supported")
	errKID  = errors.New("the token's kid names no key of this verifier")
)

func mapErr(err error) *envelope.Error {
	switch {
	case errors.Is(err, jwt.ErrTokenMalformed):
		return unauthenticated("malformed token", err)
	case errors.Is(err, errAlg):
		return unauthenticated("unsupported token algorithm", err)
	case errors.Is(err, errKID):
		return unauthenticated("unknown token key", err)
	case errors.Is(err, jwt.ErrTokenUnverifiable):
		return unauthenticated("unsupported token header", err)
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return unauthenticated("bad token signature", err)
	case errors.Is(err, jwt.ErrTokenExpired):
		return unauthenticated("token expired", errors.Join(ErrExpired, err))
	case errors.Is(err, jwt.ErrTokenUsedBeforeIssued), errors.Is(err, jwt.ErrTokenNotValidYet):
		return unauthenticated("token not valid yet", err)
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return unauthenticated("wrong token issuer", err)
	}
	return unauthenticated("invalid token claims", err)
}

// Key is one key of a Verifier's set.
type Key struct {
	// ID is a label the key is also known by in "kid" headers (meshd
	// --auth-key LABEL=FILE; meshctl token issue --kid LABEL). Optional:
	// every key is known by its KeyID in any case.
	ID     string
	Secret []byte
}

// KeyID is the default id of a key: the first 8 hex digits of its
// SHA-256. It names the key without revealing it.
func KeyID(secret []byte) string {
	sum := sha256.Sum256(secret)
	return hex.EncodeToString(sum[:4])
}

type keySet struct {
	byID map[string][]byte
	all  jwt.VerificationKeySet
	ids  []string // KeyID and label of each key, in order
}

// SetKeys replaces the verifier's keys, atomically: tokens checked from
// then on are checked against these only. It refuses (and keeps the
// current keys) an empty set, a key shorter than MinKeyLen, a malformed
// label, or a label or id that names two different keys.
func (v *Verifier) SetKeys(keys []Key) error {
	if len(keys) == 0 {
		return errors.New("auth: no key")
	}
	ks := &keySet{byID: map[string][]byte{}}
	add := func(id string, secret []byte) error {
		if old, dup := ks.byID[id]; dup && !bytes.Equal(old, secret) {
			return fmt.Errorf("auth: key id %q names two different keys", id)
		}
		if _, dup := ks.byID[id]; !dup {
			ks.ids = append(ks.ids, id)
		}
		ks.byID[id] = secret
		return nil
	}
	for _, k := range keys {
		if len(k.Secret) < MinKeyLen {
			return fmt.Errorf("auth: key is %d bytes; want at least %d", len(k.Secret), MinKeyLen)
		}
		if k.ID != "" && !validKID(k.ID) {
			return fmt.Errorf("auth: key id %q: want 1 to 64 ASCII letters, digits or _-.:", k.ID)
		}
		secret := append([]byte(nil), k.Secret...)
		if err := add(KeyID(secret), secret); err != nil {
			return err
		}
		if k.ID != "" {
			if err := add(k.ID, secret); err != nil {
				return err
			}
		}
		ks.all.Keys = append(ks.all.Keys, secret)
	}
	v.keys.Store(ks)
	return nil
}

// KeyIDs returns the ids the verifier knows its keys by (KeyID of each,
// and their labels), in order.
func (v *Verifier) KeyIDs() []string { return append([]string(nil), v.keys.Load().ids...) }

// validKID: a key id travels in every token header and in logs.
func validKID(s string) bool { return validRole(s) }
