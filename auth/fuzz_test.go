package auth_test

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
)

// FuzzVerify feeds arbitrary strings to the token parser. It must never
// panic, must answer every refusal with UNAUTHENTICATED, and must accept
// only tokens that really are HS256-signed with the key (checked here
// without the jwt library), whose header says HS256, that are within
// their validity window, and whose claims pass the grammar.
func FuzzVerify(f *testing.F) {
	good := issue(f, testKey, auth.Claims{Subject: "agent-x", Roles: []string{"reader"}, Serve: []string{"memory.*", "echo.echo"}}, time.Hour)
	parts := strings.Split(good, ".")
	f.Add(good)
	f.Add(issue(f, otherKey, auth.Claims{Subject: "x"}, time.Hour))
	f.Add(issue(f, testKey, auth.Claims{Subject: "x"}, time.Second)) // expired at now
	f.Add(b64(`{"alg":"none","typ":"JWT"}`) + "." + parts[1] + ".")
	f.Add(b64(`{"alg":"HS512"}`) + "." + parts[1] + "." + parts[2])
	f.Add(signRaw(f, jwt.SigningMethodHS384, testKey, goodMap(), nil))
	f.Add(signRaw(f, jwt.SigningMethodHS256, testKey, jwt.MapClaims{"iss": auth.Issuer, "sub": "x", "iat": json.RawMessage(`1e400`), "exp": json.RawMessage(`9007199254740993`)}, nil))
	f.Add(parts[0] + "." + b64(`{"exp":1e400,"iat":-1e400,"aud":[[[[[]]]]],"serve":["`+strings.Repeat("a.", 200)+`*"]}`) + "." + parts[2])
	f.Add(parts[0] + "." + b64(`{"sub":"x","sub":"y","SUB":"z"}`) + "." + parts[2])
	f.Add(parts[0] + "." + b64(strings.Repeat("[", 5000)) + "." + parts[2])
	f.Add("")
	f.Add("..")
	f.Add("a.b.c.d")
	f.Add(good + "=")
	f.Add(strings.Repeat("A", auth.MaxTokenLen+1))
	// kid: the key's id, an unknown id, a label, a non-string, none.
	f.Add(issueKID(f, testKey, "primary", auth.Claims{Subject: "x"}, time.Hour))
	f.Add(issueKID(f, otherKey, auth.KeyID(testKey), auth.Claims{Subject: "x"}, time.Hour)) // forged kid
	f.Add(signRaw(f, jwt.SigningMethodHS256, testKey, goodMap(), map[string]any{"kid": 7}))
	f.Add(signRaw(f, jwt.SigningMethodHS256, testKey, goodMap(), map[string]any{"kid": ""}))
	f.Add(signRaw(f, jwt.SigningMethodHS256, testKey, goodMap(), map[string]any{"kid": []any{auth.KeyID(testKey)}}))
	f.Add(signRaw(f, jwt.SigningMethodHS256, testKey, goodMap(), nil))
	f.Add(signRaw(f, jwt.SigningMethodHS256, otherKey, goodMap(), nil))
	now := t0.Add(time.Minute)
	v := verifier(f, now)
	if err := v.SetKeys([]auth.Key{{ID: "primary", Secret: testKey}}); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, token string) {
		c, err := v.Verify(token)
		if err != nil {
			if c != nil {
				t.Fatalf("claims with error %v", err)
			}
			var e *envelope.Error
			if !errors.As(err, &e) || e.Code != envelope.CodeUnauthenticated || e.Message == "" {
				t.Fatalf("refusal %v (%T) is not a coded UNAUTHENTICATED", err, err)
			}
			return
		}
		if len(token) > auth.MaxTokenLen {
			t.Fatalf("accepted a %d-byte token", len(token))
		}
		if !checkSigned(token, testKey) {
			t.Fatalf("accepted %q, which is not HS256-signed with the key", token)
		}
		var hdr struct {
			Alg string `json:"alg"`
		}
		h, herr := base64.RawURLEncoding.Strict().DecodeString(strings.SplitN(token, ".", 2)[0])
		if herr != nil || json.Unmarshal(h, &hdr) != nil || hdr.Alg != "HS256" {
			t.Fatalf("accepted %q with header %q", token, h)
		}
		if c.ExpiresAt.Add(auth.DefaultLeeway).Before(now) || c.IssuedAt.After(now.Add(auth.DefaultLeeway)) || !c.ExpiresAt.After(c.IssuedAt) {
			t.Fatalf("accepted claims outside their window: %+v at %v", c, now)
		}
		if c.Subject == "" {
			t.Fatalf("accepted empty subject")
		}
		for _, p := range c.Serve {
			if !auth.ValidPattern(p) {
				t.Fatalf("accepted serve pattern %q", p)
			}
		}
	})
}

// FuzzOrigins: Allowed never panics and allows only what the list names,
// whatever the spelling (case, default port) of the header.
func FuzzOrigins(f *testing.F) {
	o, err := auth.NewOrigins([]string{"https://console.example", "https://*.example.com"})
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{"https://console.example", "https://CONSOLE.example:443", "https://a.example.com", "https://evil.example",
		"https://console.example.evil", "null", "https://a.example.com:8443", "https://[::1]:443", "https://%63onsole.example", "https://console.example\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, origin string) {
		if !o.Allowed(origin) {
			return
		}
		s := strings.ToLower(origin)
		s = strings.TrimSuffix(s, ":443")
		host, ok := strings.CutPrefix(s, "https://")
		if !ok || !(host == "console.example" || strings.HasSuffix(host, ".example.com") && len(host) > len(".example.com")) {
			t.Fatalf("allowed %q", origin)
		}
	})
}
