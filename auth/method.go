package auth

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// MaxNameLen bounds method names and patterns, as the registry does.
const MaxNameLen = 256

// ValidMethod reports whether m is a method name of the strict grammar the
// auth layer accepts:
//
//	name    = segment *( "." segment )
//	segment = 1*( ALPHA / DIGIT / "_" / "-" )      ; ASCII only
//
// at most MaxNameLen bytes. No empty segment (so no leading, trailing or
// doubled dot), no "*", no white space, no control character and no byte
// above 0x7f: Unicode look-alikes ("mеmory.get" with a Cyrillic е), a
// trailing dot ("memory.get."), "memory.get " or "memory/get" are not
// names at all, so no token can be read as covering them.
//
// Names are compared byte for byte, case included: "Memory.Get" is a
// different method from "memory.get" and is covered only by a pattern
// that covers it as written. Nothing in the mesh folds case, so a case
// variant can never reach the instances of the other spelling.
func ValidMethod(m string) bool {
	if len(m) == 0 || len(m) > MaxNameLen {
		return false
	}
	seg := 0
	for i := 0; i < len(m); i++ {
		c := m[i]
		switch {
		case c == '.':
			if seg == 0 {
				return false
			}
			seg = 0
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '-':
			seg++
		default:
			return false
		}
	}
	return seg > 0
}

// ValidPattern reports whether p is a method name (ValidMethod), a prefix
// pattern "name.*" (every method whose name starts with "name."; any
// depth), or "*" (every method).
func ValidPattern(p string) bool {
	if p == "*" {
		return true
	}
	if name, ok := strings.CutSuffix(p, ".*"); ok {
		return ValidMethod(name)
	}
	return ValidMethod(p)
}

// covers reports whether token pattern t covers capability c: every
// method c matches, t matches too. Both must be valid patterns.
func covers(t, c string) bool {
	if t == "*" {
		return true
	}
	if prefix, ok := strings.CutSuffix(t, "*"); ok { // prefix ends with "."
		if cp, ok := strings.CutSuffix(c, "*"); ok {
			// c = "q.*" is covered when "q." starts with "p.".
			return c != "*" && strings.HasPrefix(cp, prefix)
		}
		return strings.HasPrefix(c, prefix)
	}
	return t == c
}

// MayServe reports whether the token's claims allow its holder to register
// capability, a method name or a pattern ("memory.get", "memory.*", "*").
// It is true only when capability is valid (ValidPattern) and one of the
// claims' Serve patterns covers every method it could match:
//
//	Serve "memory.*" allows "memory.get", "memory.a.b", "memory.*", "memory.a.*";
//	                 refuses "memory", "memory.", "Memory.get", "*", "mem*".
//	Serve "echo.echo" allows exactly "echo.echo".
//	Serve "*"        allows every valid capability.
//
// Invalid Serve patterns in the claims never match (Verify refuses such
// tokens anyway). MayServe does not know the hub's built-in namespaces:
// the hub must keep agents off those whatever the token says.
func MayServe(c *Claims, capability string) bool {
	if c == nil || !ValidPattern(capability) {
		return false
	}
	for _, t := range c.Serve {
		if ValidPattern(t) && covers(t, capability) {
			return true
		}
	}
	return false
}

// Allowed reports whether a caller holding roles may call a method guarded
// by required: true when required is empty (the method has no role guard)
// or when roles and required share at least one role. Role names compare
// exactly; no role (not even RoleAdmin) is implied by another.
func Allowed(roles, required []string) bool {
	if len(required) == 0 {
		return true
	}
	for _, r := range roles {
		for _, q := range required {
			if r == q && r != "" {
				return true
			}
		}
	}
	return false
}

// Well-known roles. The hub's built-in admin methods require RoleAdmin;
// peer hubs present tokens with RolePeer.
const (
	RoleAdmin = "admin"
	RolePeer  = "hub"
)

// CheckRoleTable checks a role table (method pattern → roles that may
// call it): each key a method name, "prefix.*" or "*", each list
// non-empty, each role one a token can carry (1 to 64 bytes of ASCII
// letters, digits, "_", "-", ".", ":"; a role no token can hold would
// lock its methods away). All problems are reported, keys in order.
func CheckRoleTable(roles map[string][]string) error {
	var errs []error
	for _, pat := range slices.Sorted(maps.Keys(roles)) {
		switch {
		case !ValidPattern(pat):
			errs = append(errs, fmt.Errorf("roles[%s]: not a method name, \"prefix.*\" or \"*\"", pat))
		case len(roles[pat]) == 0:
			errs = append(errs, fmt.Errorf("roles[%s]: lists no role (a method open to every caller needs no entry)", pat))
		}
		for _, r := range roles[pat] {
			if !validRole(r) {
				errs = append(errs, fmt.Errorf("roles[%s]: role %q is not 1 to 64 ASCII letters, digits or _-.: (no token could hold it)", pat, r))
			}
		}
	}
	return errors.Join(errs...)
}

// validRole: 1 to 64 bytes of ASCII letters, digits, "_", "-", ".", ":".
func validRole(r string) bool {
	if len(r) == 0 || len(r) > 64 {
		return false
	}
	for i := 0; i < len(r); i++ {
		c := r[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.' || c == ':') {
			return false
		}
	}
	return true
}

// validSubject: 1 to 256 bytes of printable ASCII without space.
func validSubject(s string) bool {
	if len(s) == 0 || len(s) > 256 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}
