package auth_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/auth"
)

func TestBearerToken(t *testing.T) {
	const tok = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln-_"
	cases := []struct {
		name    string
		hdr     map[string][]string
		want    string
		wantErr string
	}{
		{"none", nil, "", ""},
		{"authorization", map[string][]string{"Authorization": {"Bearer " + tok}}, tok, ""},
		{"lower-case scheme", map[string][]string{"Authorization": {"bearer " + tok}}, tok, ""},
		{"extra spaces", map[string][]string{"Authorization": {"Bearer   " + tok + " "}}, tok, ""},
		{"token68 padding", map[string][]string{"Authorization": {"Bearer abc=="}}, "abc==", ""},
		{"subprotocol", map[string][]string{"Sec-Websocket-Protocol": {"agentmesh.v1, bearer." + tok}}, tok, ""},
		{"subprotocol own line", map[string][]string{"Sec-Websocket-Protocol": {"agentmesh.v1", "bearer." + tok}}, tok, ""},
		{"other subprotocols only", map[string][]string{"Sec-Websocket-Protocol": {"agentmesh.v1, jsonrpc"}}, "", ""},
		{"cookie never authenticates", map[string][]string{"Cookie": {"token=" + tok + "; session=" + tok}}, "", ""},
		{"basic scheme", map[string][]string{"Authorization": {"Basic dXNlcjpwYXNz"}}, "", "unsupported authorization scheme"},
		{"scheme only", map[string][]string{"Authorization": {"Bearer"}}, "", "malformed bearer token"},
		{"empty token", map[string][]string{"Authorization": {"Bearer "}}, "", "malformed bearer token"},
		{"token with space", map[string][]string{"Authorization": {"Bearer a b"}}, "", "malformed bearer token"},
		{"token with comma", map[string][]string{"Authorization": {"Bearer a,b"}}, "", "malformed bearer token"},
		{"bad padding", map[string][]string{"Authorization": {"Bearer =abc"}}, "", "malformed bearer token"},
		{"two headers", map[string][]string{"Authorization": {"Bearer " + tok, "Bearer " + tok}}, "", "more than one Authorization header"},
		{"header and subprotocol", map[string][]string{"Authorization": {"Bearer " + tok}, "Sec-Websocket-Protocol": {"bearer." + tok}}, "", "more than one bearer token"},
		{"two subprotocols", map[string][]string{"Sec-Websocket-Protocol": {"bearer.a, bearer.b"}}, "", "more than one bearer token"},
		{"empty subprotocol token", map[string][]string{"Sec-Websocket-Protocol": {"agentmesh.v1, bearer."}}, "", "malformed bearer subprotocol"},
		{"too long", map[string][]string{"Authorization": {"Bearer " + strings.Repeat("a", auth.MaxTokenLen+1)}}, "", "malformed bearer token"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/ws?access_token=fromquery", nil)
			for k, vs := range tc.hdr {
				for _, v := range vs {
					r.Header.Add(k, v)
				}
			}
			got, err := auth.BearerToken(r)
			if tc.wantErr != "" {
				wantUnauth(t, err, tc.wantErr)
				if got != "" {
					t.Errorf("token %q returned with an error", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("BearerToken = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// S23: the Origin allow-list.
func TestOrigins(t *testing.T) {
	o, err := auth.NewOrigins([]string{"https://console.example", "http://localhost:3000", "https://*.example.com", "https://*.apps.test:8443/"})
	if err != nil {
		t.Fatal(err)
	}
	allowed := []string{
		"https://console.example", "https://console.example:443", "HTTPS://Console.Example",
		"http://localhost:3000",
		"https://a.example.com", "https://a.b.example.com", "https://A.Example.com:443",
		"https://x.apps.test:8443",
	}
	refused := []string{
		"https://evil.example", "http://console.example", "https://console.example:8443",
		"https://console.example.evil.example", "https://evilconsole.example", "https://console.example/",
		"https://console.example/path", "https://user@console.example", "https://console.example?x",
		"http://localhost:3001", "http://localhost", "https://localhost:3000",
		"https://example.com", "https://.example.com", "https://..example.com", "https://a..example.com",
		"https://evilexample.com", "https://a.example.com.evil.net", "http://a.example.com", "https://a.example.com:8443",
		"https://x.apps.test", "https://apps.test:8443",
		"null", "", " ", "file://", "ws://console.example", "chrome-extension://abc",
		"https://cоnsole.example", // Cyrillic о
		"https://*.example.com", "https://a.example.com:", "https://console.example:443:443",
		"https://[::1", "//console.example", "console.example",
	}
	for _, s := range allowed {
		if !o.Allowed(s) {
			t.Errorf("Allowed(%q) = false", s)
		}
	}
	for _, s := range refused {
		if o.Allowed(s) {
			t.Errorf("Allowed(%q) = true", s)
		}
	}

	check := func(origins ...string) bool {
		r := httptest.NewRequest(http.MethodGet, "http://127.0.0.1:8080/ws", nil)
		for _, v := range origins {
			r.Header.Add("Origin", v)
		}
		return o.Check(r)
	}
	if !check() {
		t.Error("no Origin (a non-browser client) refused")
	}
	if !check("https://console.example") || check("https://evil.example") {
		t.Error("Check disagrees with Allowed")
	}
	if check("https://console.example", "https://console.example") {
		t.Error("two Origin headers allowed")
	}
	// No implicit same-origin: a DNS-rebound page whose Origin matches Host.
	r := httptest.NewRequest(http.MethodGet, "http://evil.example:8080/ws", nil)
	r.Header.Set("Origin", "http://evil.example:8080")
	if o.Check(r) {
		t.Error("same-origin request from an unlisted origin allowed")
	}

	// An empty list and a nil *Origins allow no browser at all.
	empty, _ := auth.NewOrigins(nil)
	var nilO *auth.Origins
	for _, x := range []*auth.Origins{empty, nilO} {
		if x.Allowed("https://console.example") {
			t.Error("empty allow-list allowed an origin")
		}
	}
	if !empty.Check(httptest.NewRequest(http.MethodGet, "/ws", nil)) {
		t.Error("empty list refused a client without Origin")
	}
	// IP literals.
	ip, _ := auth.NewOrigins([]string{"http://127.0.0.1:8080", "http://[::1]:8080"})
	if !ip.Allowed("http://127.0.0.1:8080") || !ip.Allowed("http://[::1]:8080") || ip.Allowed("http://127.0.0.2:8080") {
		t.Error("IP origins")
	}

	for _, bad := range []string{"*", "https://*", "https://*.", "https://a.*.com", "https://*example.com", "https://ex*.com", "console.example", "ftp://x", "https://x/path", "https://x?q", ""} {
		if _, err := auth.NewOrigins([]string{bad}); err == nil {
			t.Errorf("NewOrigins(%q) accepted", bad)
		}
	}
}

// S23 against a real gorilla upgrader on a real socket: a cross-origin
// upgrade gets 403 before any WebSocket exists; an allowed origin and a
// client without Origin upgrade.
func TestOriginsUpgrader(t *testing.T) {
	o, err := auth.NewOrigins([]string{"https://console.example"})
	if err != nil {
		t.Fatal(err)
	}
	var upgrades atomic.Int64
	up := websocket.Upgrader{CheckOrigin: o.Check}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		upgrades.Add(1)
		ws.Close()
	}))
	defer srv.Close()
	url := "ws" + strings.TrimPrefix(srv.URL, "http") + "/ws"
	dial := func(origin string) int {
		h := http.Header{}
		if origin != "" {
			h.Set("Origin", origin)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		ws, resp, err := websocket.DefaultDialer.DialContext(ctx, url, h)
		if err == nil {
			ws.Close()
		}
		if resp == nil {
			t.Fatalf("origin %q: no HTTP response: %v", origin, err)
		}
		return resp.StatusCode
	}
	const n = 100
	for i := 0; i < n; i++ {
		if code := dial("https://evil.example"); code != http.StatusForbidden {
			t.Fatalf("evil origin: HTTP %d; want 403", code)
		}
	}
	if got := upgrades.Load(); got != 0 {
		t.Fatalf("%d upgrades happened for refused origins", got)
	}
	if code := dial("https://console.example"); code != http.StatusSwitchingProtocols {
		t.Errorf("allowed origin: HTTP %d", code)
	}
	if code := dial(""); code != http.StatusSwitchingProtocols {
		t.Errorf("no origin: HTTP %d", code)
	}
	// The client reads the 101 as soon as Upgrade has written it, maybe
	// before the handler counts: wait for the count.
	for deadline := time.Now().Add(2 * time.Second); upgrades.Load() < 2 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if got := upgrades.Load(); got != 2 {
		t.Errorf("upgrades = %d; want 2", got)
	}
}
