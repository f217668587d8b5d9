package auth_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
)

var (
	testKey  = []byte("0123456789abcdef0123456789abcdef-test-key")
	otherKey = []byte("fedcba9876543210fedcba9876543210-other-key")
	t0       = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
)

func clock(t time.Time) auth.VerifierOption { return auth.WithClock(func() time.Time { return t }) }

func verifier(t testing.TB, now time.Time) *auth.Verifier {
	t.Helper()
	v, err := auth.NewVerifier(testKey, clock(now))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func issue(t testing.TB, key []byte, c auth.Claims, ttl time.Duration) string {
	t.Helper()
	if c.IssuedAt.IsZero() {
		c.IssuedAt = t0
	}
	tok, err := auth.Issue(key, c, ttl)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func issueKID(t testing.TB, key []byte, kid string, c auth.Claims, ttl time.Duration) string {
	t.Helper()
	if c.IssuedAt.IsZero() {
		c.IssuedAt = t0
	}
	tok, err := auth.IssueKID(key, kid, c, ttl)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// signRaw signs an arbitrary claims map the way an attacker holding some
// key (or a careless issuer) could, bypassing Issue's checks.
func signRaw(t testing.TB, m jwt.SigningMethod, key any, claims jwt.MapClaims, hdr map[string]any) string {
	t.Helper()
	tok := jwt.NewWithClaims(m, claims)
	for k, v := range hdr {
		tok.Header[k] = v
	}
	s, err := tok.SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func goodMap() jwt.MapClaims {
	return jwt.MapClaims{"iss": auth.Issuer, "sub": "x", "iat": t0.Unix(), "exp": t0.Add(time.Hour).Unix(), "jti": "j1", "serve": []string{"echo.*"}}
}

func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

// wantUnauth checks err is an *envelope.Error with code UNAUTHENTICATED
// whose message contains msg.
func wantUnauth(t *testing.T, err error, msg string) {
	t.Helper()
	if err == nil {
		t.Fatalf("verified; want UNAUTHENTICATED %q", msg)
	}
	var e *envelope.Error
	if !errors.As(err, &e) || e.Code != envelope.CodeUnauthenticated {
		t.Fatalf("err = %v (%T); want UNAUTHENTICATED", err, err)
	}
	if envelope.CodeOf(err) != envelope.CodeUnauthenticated {
		t.Fatalf("CodeOf = %v", envelope.CodeOf(err))
	}
	if !strings.Contains(e.Message, msg) {
		t.Fatalf("message %q; want it to contain %q", e.Message, msg)
	}
}

func TestIssueVerifyRoundTrip(t *testing.T) {
	in := auth.Claims{Subject: "agent-x", Roles: []string{"reader", "agent"}, Serve: []string{"memory.*", "echo.echo"}}
	tok := issue(t, testKey, in, time.Hour)
	if strings.Count(tok, ".") != 2 {
		t.Fatalf("token %q is not a compact JWS", tok)
	}
	c, err := verifier(t, t0.Add(30*time.Minute)).Verify(tok)
	if err != nil {
		t.Fatal(err)
	}
	if c.Subject != "agent-x" || strings.Join(c.Roles, ",") != "reader,agent" || strings.Join(c.Serve, ",") != "memory.*,echo.echo" {
		t.Errorf("claims = %+v", c)
	}
	if !c.IssuedAt.Equal(t0) || !c.ExpiresAt.Equal(t0.Add(time.Hour)) {
		t.Errorf("iat %v exp %v; want %v and +1h", c.IssuedAt, c.ExpiresAt, t0)
	}
	if len(c.ID) < 16 {
		t.Errorf("jti %q; want a random id", c.ID)
	}
	// Two tokens for the same claims have different ids.
	c2, err := verifier(t, t0).Verify(issue(t, testKey, in, time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if c2.ID == c.ID {
		t.Errorf("two tokens share jti %q", c.ID)
	}
	// The header says HS256 and JWT and names the key (KeyID), the
	// payload iss agentmesh.
	parts := strings.Split(tok, ".")
	h, _ := base64.RawURLEncoding.DecodeString(parts[0])
	if string(h) != `{"alg":"HS256","kid":"`+auth.KeyID(testKey)+`","typ":"JWT"}` {
		t.Errorf("header %s", h)
	}
}

func TestVerifyRefuses(t *testing.T) {
	good := issue(t, testKey, auth.Claims{Subject: "x", Serve: []string{"echo.*"}}, time.Hour)
	parts := strings.Split(good, ".")
	payload, _ := base64.RawURLEncoding.DecodeString(parts[1])
	tamperedPayload := strings.Replace(string(payload), `"echo.*"`, `"*"`, 1)
	if tamperedPayload == string(payload) {
		t.Fatal("tamper did not change the payload")
	}
	// Flip one signature bit.
	sig, _ := base64.RawURLEncoding.DecodeString(parts[2])
	sig[0] ^= 1
	// A non-canonical last character: same 6-bit prefix, other padding
	// bits, which a lenient decoder maps to the same signature bytes.
	last := parts[2][len(parts[2])-1]
	alphabet := "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	i := strings.IndexByte(alphabet, last)
	nonCanon := parts[2][:len(parts[2])-1] + string(alphabet[i^1])

	noneHeader := b64(`{"alg":"none","typ":"JWT"}`)
	noneTok, err := jwt.NewWithClaims(jwt.SigningMethodNone, goodMap()).SignedString(jwt.UnsafeAllowNoneSignatureType)
	if err != nil {
		t.Fatal(err)
	}
	noIss := goodMap()
	delete(noIss, "iss")
	otherIss := goodMap()
	otherIss["iss"] = "someone-else"
	noExp := goodMap()
	delete(noExp, "exp")
	noIat := goodMap()
	delete(noIat, "iat")
	futureIat := goodMap()
	futureIat["iat"] = t0.Add(time.Minute).Unix()
	expBeforeIat := goodMap()
	expBeforeIat["iat"], expBeforeIat["exp"] = t0.Add(-time.Minute).Unix(), t0.Add(-2*time.Minute).Unix()
	expIsIat := goodMap()
	expIsIat["iat"], expIsIat["exp"] = t0.Add(time.Second).Unix(), t0.Add(time.Second).Unix()
	badServe := goodMap()
	badServe["serve"] = []string{"memory.get."}
	badSub := goodMap()
	badSub["sub"] = ""
	badRole := goodMap()
	badRole["roles"] = []string{"ad min"}
	expired := goodMap()
	expired["iat"], expired["exp"] = t0.Add(-2*time.Hour).Unix(), t0.Add(-time.Hour).Unix()

	cases := []struct {
		name, token, msg string
	}{
		{"unauthenticated (no token)", "", "missing token"},
		{"garbage", "not a token", "malformed token"},
		{"two segments", parts[0] + "." + parts[1], "malformed token"},
		{"four segments", good + ".x", "malformed token"},
		{"too large", good + strings.Repeat("A", auth.MaxTokenLen), "token too large"},
		{"signed with an unknown key", issue(t, otherKey, auth.Claims{Subject: "x", Serve: []string{"echo.*"}}, time.Hour), "unknown token key"},
		{"wrongly signed under the key's kid", issueKID(t, otherKey, auth.KeyID(testKey), auth.Claims{Subject: "x"}, time.Hour), "bad token signature"},
		{"tampered payload", parts[0] + "." + b64(tamperedPayload) + "." + parts[2], "bad token signature"},
		{"tampered signature", parts[0] + "." + parts[1] + "." + base64.RawURLEncoding.EncodeToString(sig), "bad token signature"},
		{"non-canonical signature encoding", parts[0] + "." + parts[1] + "." + nonCanon, "malformed token"},
		{"signature removed", parts[0] + "." + parts[1] + ".", "bad token signature"},
		{"alg none, empty signature", noneTok, "unsupported token algorithm"},
		{"alg none header on a real signature", noneHeader + "." + parts[1] + "." + parts[2], "unsupported token algorithm"},
		{"alg None", b64(`{"alg":"None","typ":"JWT"}`) + "." + parts[1] + ".", "unsupported token algorithm"},
		{"no alg", b64(`{"typ":"JWT"}`) + "." + parts[1] + "." + parts[2], "unsupported token algorithm"},
		{"alg HS512 with the right key", signRaw(t, jwt.SigningMethodHS512, testKey, goodMap(), nil), "unsupported token algorithm"},
		{"alg HS384 with the right key", signRaw(t, jwt.SigningMethodHS384, testKey, goodMap(), nil), "unsupported token algorithm"},
		{"alg RS256 header, HMAC signature", b64(`{"alg":"RS256","typ":"JWT"}`) + "." + parts[1] + "." + parts[2], "unsupported token algorithm"},
		{"crit header", signRaw(t, jwt.SigningMethodHS256, testKey, goodMap(), map[string]any{"crit": []string{"exp"}}), "unsupported token header"},
		{"expired", signRaw(t, jwt.SigningMethodHS256, testKey, expired, nil), "token expired"},
		{"no iss", signRaw(t, jwt.SigningMethodHS256, testKey, noIss, nil), "invalid token claims"},
		{"other iss", signRaw(t, jwt.SigningMethodHS256, testKey, otherIss, nil), "wrong token issuer"},
		{"no exp", signRaw(t, jwt.SigningMethodHS256, testKey, noExp, nil), "invalid token claims"},
		{"no iat", signRaw(t, jwt.SigningMethodHS256, testKey, noIat, nil), "invalid token claims"},
		{"iat in the future", signRaw(t, jwt.SigningMethodHS256, testKey, futureIat, nil), "token not valid yet"},
		{"exp before iat", signRaw(t, jwt.SigningMethodHS256, testKey, expBeforeIat, nil), "token expired"},
		{"exp equal to iat", signRaw(t, jwt.SigningMethodHS256, testKey, expIsIat, nil), "invalid token claims"},
		{"alias serve pattern", signRaw(t, jwt.SigningMethodHS256, testKey, badServe, nil), "invalid token claims"},
		{"empty subject", signRaw(t, jwt.SigningMethodHS256, testKey, badSub, nil), "invalid token claims"},
		{"bad role", signRaw(t, jwt.SigningMethodHS256, testKey, badRole, nil), "invalid token claims"},
		{"claims not an object", parts[0] + "." + b64(`[1]`) + "." + parts[2], "malformed token"},
		{"exp a string", signRaw(t, jwt.SigningMethodHS256, testKey, jwt.MapClaims{"iss": auth.Issuer, "sub": "x", "iat": t0.Unix(), "exp": "tomorrow"}, nil), "malformed token"},
	}
	v := verifier(t, t0)
	if _, err := v.Verify(good); err != nil {
		t.Fatalf("the untampered token: %v", err)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := v.Verify(tc.token)
			if c != nil {
				t.Errorf("claims %+v returned with an error", c)
			}
			wantUnauth(t, err, tc.msg)
		})
	}
}

func TestVerifyExpiry(t *testing.T) {
	tok := issue(t, testKey, auth.Claims{Subject: "x"}, time.Minute)
	exp := t0.Add(time.Minute)
	for _, tc := range []struct {
		at      time.Time
		ok      bool
		expired bool
	}{
		{t0, true, false},
		{exp.Add(-time.Second), true, false},
		{exp.Add(auth.DefaultLeeway - time.Second), true, false}, // within the leeway
		{exp.Add(auth.DefaultLeeway + time.Second), false, true},
		{exp.Add(24 * time.Hour), false, true},
		{t0.Add(-auth.DefaultLeeway + time.Second), true, false}, // issuer's clock slightly ahead
		{t0.Add(-auth.DefaultLeeway - time.Second), false, false},
	} {
		_, err := verifier(t, tc.at).Verify(tok)
		if (err == nil) != tc.ok {
			t.Errorf("at iat%+v: err = %v; want ok=%v", tc.at.Sub(t0), err, tc.ok)
			continue
		}
		if err != nil {
			wantUnauth(t, err, "")
			if got := errors.Is(err, auth.ErrExpired); got != tc.expired {
				t.Errorf("at iat%+v: errors.Is(err, ErrExpired) = %v; want %v (err %v)", tc.at.Sub(t0), got, tc.expired, err)
			}
		}
	}
	// A longer leeway accepts what the default refuses.
	v, _ := auth.NewVerifier(testKey, auth.WithLeeway(time.Minute), clock(exp.Add(30*time.Second)))
	if _, err := v.Verify(tok); err != nil || v.Leeway() != time.Minute {
		t.Errorf("leeway 1m, 30 s after exp: %v", err)
	}
}

func TestIssueRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		key  []byte
		c    auth.Claims
		ttl  time.Duration
	}{
		{"short key", testKey[:31], auth.Claims{Subject: "x"}, time.Hour},
		{"zero ttl", testKey, auth.Claims{Subject: "x"}, 0},
		{"negative ttl", testKey, auth.Claims{Subject: "x"}, -time.Hour},
		{"sub-second ttl", testKey, auth.Claims{Subject: "x"}, 999 * time.Millisecond},
		{"no subject", testKey, auth.Claims{}, time.Hour},
		{"subject with space", testKey, auth.Claims{Subject: "a b"}, time.Hour},
		{"bad role", testKey, auth.Claims{Subject: "x", Roles: []string{""}}, time.Hour},
		{"alias pattern", testKey, auth.Claims{Subject: "x", Serve: []string{"memory.get."}}, time.Hour},
		{"mid wildcard", testKey, auth.Claims{Subject: "x", Serve: []string{"memory.*.get"}}, time.Hour},
		{"unicode pattern", testKey, auth.Claims{Subject: "x", Serve: []string{"mеmory.*"}}, time.Hour},
	} {
		if tok, err := auth.Issue(tc.key, tc.c, tc.ttl); err == nil {
			t.Errorf("%s: issued %q", tc.name, tok)
		}
	}
	if _, err := auth.NewVerifier(testKey[:31]); err == nil {
		t.Error("NewVerifier accepted a 31-byte key")
	}
}

// The Verifier is shared by every connection of a hub.
func TestVerifyConcurrent(t *testing.T) {
	v := verifier(t, t0)
	good := issue(t, testKey, auth.Claims{Subject: "x", Serve: []string{"echo.*"}}, time.Hour)
	bad := issue(t, otherKey, auth.Claims{Subject: "x"}, time.Hour)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Go(func() {
			for i := 0; i < 200; i++ {
				if c, err := v.Verify(good); err != nil || c.Subject != "x" {
					t.Errorf("good: %v", err)
					return
				}
				if _, err := v.Verify(bad); envelope.CodeOf(err) != envelope.CodeUnauthenticated {
					t.Errorf("bad: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// checkSigned recomputes the HS256 signature independently of jwt.
func checkSigned(tok string, key []byte) bool {
	i := strings.LastIndexByte(tok, '.')
	if i < 0 {
		return false
	}
	m := hmac.New(sha256.New, key)
	m.Write([]byte(tok[:i]))
	return tok[i+1:] == base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

func TestCheckSigned(t *testing.T) {
	tok := issue(t, testKey, auth.Claims{Subject: "x"}, time.Hour)
	if !checkSigned(tok, testKey) || checkSigned(tok, otherKey) {
		t.Fatal("checkSigned disagrees with Issue")
	}
	var hdr map[string]any
	h, _ := base64.RawURLEncoding.DecodeString(strings.Split(tok, ".")[0])
	if err := json.Unmarshal(h, &hdr); err != nil || hdr["alg"] != "HS256" {
		t.Fatalf("header %s", h)
	}
}

// TestKeyRotation: a token names its key (kid); the verifier picks that
// key, and tries each of its keys for a token without kid. Rotating from
// key1 to key2: tokens of both are valid while both are loaded, key1's
// are refused once it is dropped.
func TestKeyRotation(t *testing.T) {
	v := verifier(t, t0.Add(time.Minute))
	c := auth.Claims{Subject: "x"}
	tok1 := issue(t, testKey, c, time.Hour)
	if _, err := v.Verify(tok1); err != nil {
		t.Fatalf("key1 token under key1: %v", err)
	}
	// Rotate in key2, labelled (meshd --auth-key next=FILE).
	if err := v.SetKeys([]auth.Key{{Secret: testKey}, {ID: "next", Secret: otherKey}}); err != nil {
		t.Fatal(err)
	}
	tok2 := issue(t, otherKey, c, time.Hour)
	tok2label := issueKID(t, otherKey, "next", c, time.Hour)
	noKID := signRaw(t, jwt.SigningMethodHS256, otherKey, goodMap(), nil)
	for name, tok := range map[string]string{"key1": tok1, "key2": tok2, "key2 by label": tok2label, "key2 without kid": noKID} {
		if _, err := v.Verify(tok); err != nil {
			t.Errorf("%s token under key1+key2: %v", name, err)
		}
	}
	if got, want := v.KeyIDs(), []string{auth.KeyID(testKey), auth.KeyID(otherKey), "next"}; !slices.Equal(got, want) {
		t.Errorf("KeyIDs %v; want %v", got, want)
	}
	// Drop key1.
	if err := v.SetKeys([]auth.Key{{ID: "next", Secret: otherKey}}); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Verify(tok1); envelope.CodeOf(err) != envelope.CodeUnauthenticated || !strings.Contains(err.Error(), "unknown token key") {
		t.Errorf("key1 token after key1 was dropped: %v; want UNAUTHENTICATED unknown token key", err)
	}
	noKID1 := signRaw(t, jwt.SigningMethodHS256, testKey, goodMap(), nil)
	if _, err := v.Verify(noKID1); envelope.CodeOf(err) != envelope.CodeUnauthenticated {
		t.Errorf("key1 token without kid after key1 was dropped: %v; want UNAUTHENTICATED", err)
	}
	for name, tok := range map[string]string{"key2": tok2, "key2 by label": tok2label, "key2 without kid": noKID} {
		if _, err := v.Verify(tok); err != nil {
			t.Errorf("%s token after key1 was dropped: %v", name, err)
		}
	}
	// A forged kid does not help: the key it names must have signed.
	if _, err := v.Verify(issueKID(t, testKey, "next", c, time.Hour)); err == nil || !strings.Contains(err.Error(), "bad token signature") {
		t.Errorf("key1 token claiming kid next: %v; want bad token signature", err)
	}
	// SetKeys refuses bad sets and keeps the current keys.
	for name, ks := range map[string][]auth.Key{
		"empty":          nil,
		"short key":      {{Secret: []byte("short")}},
		"bad label":      {{ID: "a b", Secret: testKey}},
		"label twice":    {{ID: "k", Secret: testKey}, {ID: "k", Secret: otherKey}},
		"label is an id": {{ID: auth.KeyID(otherKey), Secret: testKey}, {Secret: otherKey}},
	} {
		if err := v.SetKeys(ks); err == nil {
			t.Errorf("SetKeys(%s) accepted", name)
		}
	}
	if _, err := v.Verify(tok2); err != nil {
		t.Errorf("after refused SetKeys: %v", err)
	}
	if _, err := auth.IssueKID(testKey, "a b", c, time.Hour); err == nil {
		t.Error("IssueKID accepted a kid with a space")
	}
}

// TestAudienceAddrNonce: the claims that bind a peer token and its proof
// travel, and are checked for shape; several audiences are refused.
func TestAudienceAddrNonce(t *testing.T) {
	in := auth.Claims{Subject: "hub.a", Roles: []string{auth.RolePeer}, Audience: "b", Addr: "10.0.0.2:7700", Nonce: "n1"}
	c, err := verifier(t, t0).Verify(issue(t, testKey, in, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if c.Audience != "b" || c.Addr != "10.0.0.2:7700" || c.Nonce != "n1" {
		t.Errorf("claims = %+v; want aud b, addr 10.0.0.2:7700, nonce n1", c)
	}
	for _, bad := range []auth.Claims{{Subject: "x", Audience: "a b"}, {Subject: "x", Addr: "\n"}, {Subject: "x", Nonce: strings.Repeat("n", 300)}} {
		if _, err := auth.Issue(testKey, bad, time.Minute); err == nil {
			t.Errorf("Issue(%+v) accepted", bad)
		}
	}
	m := goodMap()
	m["aud"] = []string{"a", "b"}
	_, err = verifier(t, t0).Verify(signRaw(t, jwt.SigningMethodHS256, testKey, m, nil))
	wantUnauth(t, err, "invalid token claims")
}

// TestProofIsNoToken: a peer proof verifies with VerifyProof only, a token
// with Verify only.
func TestProofIsNoToken(t *testing.T) {
	v := verifier(t, t0)
	proof, err := auth.IssueProof(testKey, auth.KeyID(testKey), auth.Claims{Subject: "hub.b", Audience: "a", Nonce: "j", IssuedAt: t0}, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c, err := v.VerifyProof(proof)
	if err != nil || c.Subject != "hub.b" || c.Audience != "a" || c.Nonce != "j" {
		t.Errorf("VerifyProof = %+v, %v", c, err)
	}
	_, err = v.Verify(proof)
	wantUnauth(t, err, "wrong token issuer")
	_, err = v.VerifyProof(issue(t, testKey, auth.Claims{Subject: "hub.b", Audience: "a", Nonce: "j"}, 30*time.Second))
	wantUnauth(t, err, "wrong token issuer")
	other, _ := auth.IssueProof(otherKey, auth.KeyID(otherKey), auth.Claims{Subject: "hub.b", IssuedAt: t0}, 30*time.Second)
	_, err = v.VerifyProof(other)
	wantUnauth(t, err, "unknown token key")
}

// TestCheckKey: the signature under the current keys, whatever the times.
func TestCheckKey(t *testing.T) {
	v := verifier(t, t0.Add(time.Hour)) // the token below expired at t0+30s
	tok := issue(t, testKey, auth.Claims{Subject: "hub.a", Roles: []string{auth.RolePeer}}, 30*time.Second)
	if _, err := v.Verify(tok); !errors.Is(err, auth.ErrExpired) {
		t.Fatalf("Verify of the expired token = %v; want expired", err)
	}
	if err := v.CheckKey(tok); err != nil {
		t.Errorf("CheckKey of an expired token signed with a key of the set: %v", err)
	}
	if err := v.SetKeys([]auth.Key{{Secret: otherKey}}); err != nil {
		t.Fatal(err)
	}
	wantUnauth(t, v.CheckKey(tok), "unknown token key")
	wantUnauth(t, v.CheckKey(""), "malformed token")
	wantUnauth(t, v.CheckKey(signRaw(t, jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, goodMap(), nil)), "unsupported token algorithm")
}
