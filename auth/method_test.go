package auth_test

import (
	"strings"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/auth"
)

func TestValidMethod(t *testing.T) {
	good := []string{"memory.get", "echo.echo", "a", "llm_chat.send", "media-gen.v2.render", "getAgentMessages", "Memory.Get", "x.0", strings.Repeat("a", auth.MaxNameLen)}
	bad := []string{
		"", ".", "memory.", ".memory", "memory..get", "memory.get.", "memory.get ", " memory.get",
		"memory get", "memory/get", "memory\\get", "memory.*", "*", "memory.get*", "memory:get",
		"memory.get\x00", "memory.get\n", "memory.get\t", "memory%2eget", "memory@group", "memory.get#q",
		"mеmory.get",       // Cyrillic е
		"memory．get",       // fullwidth full stop
		"memory\u200b.get", // zero-width space
		"ｍemory.get",       // fullwidth m
		"memory.get\u0307",
		"\xff\xfe", "memory.g\xe9t",
		strings.Repeat("a", auth.MaxNameLen+1),
	}
	for _, m := range good {
		if !auth.ValidMethod(m) {
			t.Errorf("ValidMethod(%q) = false; want true", m)
		}
	}
	for _, m := range bad {
		if auth.ValidMethod(m) {
			t.Errorf("ValidMethod(%q) = true; want false", m)
		}
	}
	for _, p := range []string{"*", "memory.*", "memory.a.*", "memory.get"} {
		if !auth.ValidPattern(p) {
			t.Errorf("ValidPattern(%q) = false", p)
		}
	}
	for _, p := range []string{"", "**", "memory*", "memory.**", "*.get", "memory.*.get", "memory.>", ".*", "memory..*", "mеmory.*", "memory.* "} {
		if auth.ValidPattern(p) {
			t.Errorf("ValidPattern(%q) = true", p)
		}
	}
}

// S24 (b)(c): a token for one prefix cannot serve another prefix, the
// built-in admin namespace, or any alias of a method it does not hold.
func TestMayServe(t *testing.T) {
	// The echo token's claims come from a real, verified token.
	echo, err := verifier(t, t0).Verify(issue(t, testKey, auth.Claims{Subject: "y", Serve: []string{"echo.*"}}, time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	media := &auth.Claims{Subject: "y", Serve: []string{"media_gen.*"}}
	memory := &auth.Claims{Subject: "x", Serve: []string{"memory.*"}}
	exact := &auth.Claims{Subject: "z", Serve: []string{"echo.echo"}}
	all := &auth.Claims{Subject: "root", Serve: []string{"*"}}
	none := &auth.Claims{Subject: "caller"}
	aliases := []string{
		"memory.get", "memory.set", "memory.*", "memory.get.*", "*", "Memory.Get", "MEMORY.get",
		"memory.get.", "memory..get", ".memory.get", "memory", "memory.", "memory*", "mem*",
		"mеmory.get", "memory．get", "memory.get ", "memory.get\x00", "memory/get", "memory@q", "memory.get#grp",
		"echo.*.memory", "echo..memory.get", "echo.*memory",
		"admin.*", "admin.shutdown",
	}
	for _, who := range []*auth.Claims{echo, media, exact, none} {
		for _, c := range aliases {
			if auth.MayServe(who, c) {
				t.Errorf("token serving %v may serve %q", who.Serve, c)
			}
		}
	}
	for _, c := range []string{"echo.echo", "echo.sleep", "echo.a.b", "echo.*", "echo.a.*"} {
		if !auth.MayServe(echo, c) {
			t.Errorf("echo.* token may not serve %q", c)
		}
	}
	for _, c := range []string{"echo", "echo.", "echoes.x", "echox.*", "Echo.echo", "*"} {
		if auth.MayServe(echo, c) {
			t.Errorf("echo.* token may serve %q", c)
		}
	}
	if !auth.MayServe(exact, "echo.echo") || auth.MayServe(exact, "echo.*") || auth.MayServe(exact, "echo.echo.x") || auth.MayServe(exact, "echo.sleep") {
		t.Error("exact echo.echo token: wrong coverage")
	}
	for _, c := range []string{"memory.get", "memory.*", "memory.a.b.*"} {
		if !auth.MayServe(memory, c) {
			t.Errorf("memory.* token may not serve %q", c)
		}
	}
	for _, c := range []string{"memory.get", "*", "admin.x", "Memory.Get"} {
		if !auth.MayServe(all, c) {
			t.Errorf("* token may not serve %q", c)
		}
	}
	for _, c := range []string{"memory.get.", "mеmory.get", "", "**"} {
		if auth.MayServe(all, c) {
			t.Errorf("* token may serve invalid %q", c)
		}
	}
	if auth.MayServe(nil, "echo.echo") {
		t.Error("nil claims may serve")
	}
	// Invalid patterns in claims built by hand never match.
	bogus := &auth.Claims{Serve: []string{"", "memory.get.", "mem*", "memory.*.x"}}
	for _, c := range []string{"memory.get", "mem.x", "memory.a.x"} {
		if auth.MayServe(bogus, c) {
			t.Errorf("bogus patterns serve %q", c)
		}
	}
}

// S24 (d): role guards.
func TestAllowed(t *testing.T) {
	for _, tc := range []struct {
		roles, required []string
		want            bool
	}{
		{nil, nil, true},
		{[]string{"reader"}, nil, true},
		{[]string{"reader"}, []string{"reader"}, true},
		{[]string{"reader"}, []string{"writer"}, false},
		{[]string{"reader"}, []string{"writer", "reader"}, true},
		{nil, []string{"reader"}, false},
		{[]string{""}, []string{""}, false},
		{[]string{"Reader"}, []string{"reader"}, false},
		{[]string{"admin"}, []string{"writer"}, false}, // admin implies nothing
		{[]string{"reader", "admin"}, []string{auth.RoleAdmin}, true},
	} {
		if got := auth.Allowed(tc.roles, tc.required); got != tc.want {
			t.Errorf("Allowed(%q, %q) = %v; want %v", tc.roles, tc.required, got, tc.want)
		}
	}
}
