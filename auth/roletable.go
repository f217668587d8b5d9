package auth

import (
	"slices"
	"strings"
)

// RoleTable maps method patterns to the roles that may call them.
type RoleTable struct {
	exact    map[string][]string
	prefixes []rolePrefix // longest first
	any      []string     // "*"
}

type rolePrefix struct {
	prefix string
	roles  []string
}

// NewRoleTable checks m (CheckRoleTable) and indexes it.
func NewRoleTable(m map[string][]string) (RoleTable, error) {
	t := RoleTable{exact: map[string][]string{}}
	if err := CheckRoleTable(m); err != nil {
		return t, err
	}
	for pat, roles := range m {
		switch {
		case pat == "*":
			t.any = roles
		case strings.HasSuffix(pat, ".*"):
			t.prefixes = append(t.prefixes, rolePrefix{strings.TrimSuffix(pat, "*"), roles})
		default:
			t.exact[pat] = roles
		}
	}
	slices.SortStableFunc(t.prefixes, func(a, b rolePrefix) int { return len(b.prefix) - len(a.prefix) })
	return t, nil
}

// Lookup returns the roles guarding method: exact, then the longest
// prefix, then "*".
func (t RoleTable) Lookup(method string) ([]string, bool) {
	if r, ok := t.exact[method]; ok {
		return r, true
	}
	for _, p := range t.prefixes {
		if strings.HasPrefix(method, p.prefix) {
			return p.roles, true
		}
	}
	return t.any, t.any != nil
}
