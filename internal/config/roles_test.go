package config_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/agentmesh/agentmesh/internal/config"
)

// TestLoadRoles: the roles section (agentick's per-method roles) is read
// as written, dots and "*" included, and a table the hub could not
// enforce as meant is refused at load, naming the entry, so that meshd
// --check catches it: a pattern that is not one, an empty role list, a
// role name no token can carry, a role given as a scalar.
func TestLoadRoles(t *testing.T) {
	f, err := config.Load(write(t, `
roles:
  memory.get: [reader, writer]
  "memory.*": [writer]
  "*": ["ops:oncall"]
  Media.Gen: [media-team]
`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"memory.get": {"reader", "writer"},
		"memory.*":   {"writer"},
		"*":          {"ops:oncall"},
		"Media.Gen":  {"media-team"},
	}
	if len(f.Roles) != len(want) {
		t.Errorf("roles = %v; want %v", f.Roles, want)
	}
	for k, v := range want {
		if !slices.Equal(f.Roles[k], v) {
			t.Errorf("roles[%s] = %v; want %v", k, f.Roles[k], v)
		}
	}

	cases := []struct{ name, body, want string }{
		{"trailing dot", `roles: { "memory.get.": [reader] }`, "roles[memory.get.]: not a method name"},
		{"glob", `roles: { "mem*": [reader] }`, "roles[mem*]: not a method name"},
		{"space", `roles: { "memory get": [reader] }`, "roles[memory get]"},
		{"empty list", `roles: { "memory.*": [] }`, "roles[memory.*]: lists no role"},
		{"bad role", `roles: { "memory.*": ["read er"] }`, `role "read er"`},
		{"empty role", `roles: { "memory.*": [""] }`, `role ""`},
		{"scalar", `roles: { "memory.*": writer }`, "roles"},
		{"not a map", `roles: [writer]`, "roles"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Load(write(t, tc.body))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Load: %v; want an error naming %q", err, tc.want)
			}
		})
	}
}
