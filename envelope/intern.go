package envelope

import (
	"bytes"
	"sync"
	"sync/atomic"
)

// The strings that repeat on every frame — method names, origins, the
// protocol version — are interned, so decoding them allocates nothing
// after the first time. The table is copy-on-write (a lookup takes no
// lock) and bounded, so a peer sending endless new names only costs it
// the allocation it would have cost anyway.
var interned struct {
	m  atomic.Pointer[map[string]string]
	mu sync.Mutex
}

const maxInterned = 4096

func init() {
	m := map[string]string{}
	interned.m.Store(&m)
}

// internToken returns the JSON string token tok as a string, interned when
// it has no escapes.
func internToken(tok []byte) (string, bool) {
	if len(tok) < 2 || tok[0] != '"' || tok[len(tok)-1] != '"' {
		return "", false
	}
	inner := tok[1 : len(tok)-1]
	if bytes.IndexByte(inner, '\\') >= 0 || len(inner) > 256 {
		return unquote(tok)
	}
	if s, ok := (*interned.m.Load())[string(inner)]; ok { // no allocation for the lookup
		return s, true
	}
	s, ok := unquote(tok)
	if !ok {
		return "", false
	}
	return internNew(s), true
}

// Intern returns b as a string, interned: the string of a binary frame's
// field that repeats (a method, an origin), b valid UTF-8.
func Intern(b []byte) string {
	if len(b) > 256 {
		return string(b)
	}
	if s, ok := (*interned.m.Load())[string(b)]; ok {
		return s
	}
	return internNew(string(b))
}

// internNew adds s to the table while it has room, and returns it.
func internNew(s string) string {
	interned.mu.Lock()
	defer interned.mu.Unlock()
	old := *interned.m.Load()
	if v, ok := old[s]; ok {
		return v
	}
	if len(old) >= maxInterned {
		return s
	}
	m := make(map[string]string, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[s] = s
	interned.m.Store(&m)
	return s
}

// internField is stringField for repeating values.
func internField(name string, v []byte) (string, *Error) {
	if kindOf(v) != '"' {
		return "", Errorf(CodeInvalidRequest, "%s must be a string", name)
	}
	s, ok := internToken(v)
	if !ok {
		return "", Errorf(CodeInvalidRequest, "%s is not a valid string", name)
	}
	return s, nil
}
