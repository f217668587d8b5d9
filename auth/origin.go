package auth

import (
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// Origins is an allow-list of browser origins for WebSocket upgrades
// (cross-site WebSocket hijacking, S23). Use its Check as
// websocket.Upgrader.CheckOrigin: gorilla answers 403 before upgrading
// when it returns false. The zero value and nil allow no browser origin.
//
// Rules:
//   - no Origin header: allowed. Browsers always send Origin on a
//     WebSocket upgrade, so its absence means a non-browser client (an
//     agent, meshctl, a peer hub), which must still authenticate.
//   - "null", an empty value, more than one Origin header, or anything
//     that is not scheme://host[:port] with scheme http or https: refused.
//   - otherwise allowed only when it matches an entry: an exact origin
//     "https://console.example" (scheme, host and port; default ports 80
//     and 443 may be written or not; host compared case-insensitively), or
//     a wildcard "https://*.example.com[:port]" that matches any host
//     ending in ".example.com" with at least one label before it (any
//     depth; "example.com" itself needs its own entry).
//
// There is no implicit same-origin rule (gorilla's default compares Origin
// with Host): with DNS rebinding, evil.example can resolve to a loopback
// hub and then Origin and Host agree. Configure the console's origin.
type Origins struct {
	exact map[string]bool // "scheme://host:port"
	wild  []wildOrigin
}

type wildOrigin struct {
	scheme, suffix, port string // suffix starts with "."
}

// NewOrigins parses an allow-list. Each entry is "scheme://host[:port]" or
// "scheme://*.domain[:port]" with scheme http or https; a lone "*" and
// other wildcard positions are refused (allow every origin by not
// configuring a browser console at all, or list the origins).
func NewOrigins(patterns []string) (*Origins, error) {
	o := &Origins{exact: map[string]bool{}}
	for _, p := range patterns {
		scheme, host, port, ok := splitOrigin(strings.TrimSuffix(p, "/"))
		if !ok {
			return nil, fmt.Errorf("auth: origin %q: want scheme://host[:port] with scheme http or https", p)
		}
		if rest, wild := strings.CutPrefix(host, "*."); wild {
			if rest == "" || strings.Contains(rest, "*") {
				return nil, fmt.Errorf("auth: origin %q: a wildcard may only be the whole first label, as in https://*.example.com", p)
			}
			o.wild = append(o.wild, wildOrigin{scheme, "." + rest, port})
			continue
		}
		if strings.Contains(host, "*") {
			return nil, fmt.Errorf("auth: origin %q: a wildcard may only be the whole first label, as in https://*.example.com", p)
		}
		o.exact[scheme+"://"+net.JoinHostPort(host, port)] = true
	}
	return o, nil
}

// splitOrigin parses scheme://host[:port] into lower-case scheme and host
// and an explicit port (the scheme's default when absent).
func splitOrigin(s string) (scheme, host, port string, ok bool) {
	if s == "" || len(s) > 2048 {
		return "", "", "", false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return "", "", "", false // browsers send ASCII (punycode) origins
		}
		switch s[i] {
		case '#', '?', '@', '\\':
			// A serialized origin has no fragment, query or userinfo; an
			// empty one ("https://host#") parses as none and must not pass
			// (found by FuzzOrigins).
			return "", "", "", false
		}
	}
	u, err := url.Parse(s)
	if err != nil || u.Opaque != "" || u.User != nil || u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.ForceQuery || u.OmitHost {
		return "", "", "", false
	}
	scheme = strings.ToLower(u.Scheme)
	host = strings.ToLower(u.Hostname())
	port = u.Port()
	if host == "" || (scheme != "http" && scheme != "https") {
		return "", "", "", false
	}
	if port == "" {
		if strings.HasSuffix(u.Host, ":") {
			return "", "", "", false
		}
		port = "80"
		if scheme == "https" {
			port = "443"
		}
	}
	return scheme, host, port, true
}

// Allowed reports whether the value of an Origin header is on the list.
func (o *Origins) Allowed(origin string) bool {
	if o == nil {
		return false
	}
	scheme, host, port, ok := splitOrigin(origin)
	if !ok || !validHost(host) {
		return false
	}
	if o.exact[scheme+"://"+net.JoinHostPort(host, port)] {
		return true
	}
	for _, w := range o.wild {
		if w.scheme == scheme && w.port == port && len(host) > len(w.suffix) && strings.HasSuffix(host, w.suffix) {
			return true
		}
	}
	return false
}

// Check applies the rules to a request; it has the signature of
// websocket.Upgrader.CheckOrigin.
func (o *Origins) Check(r *http.Request) bool {
	switch vs := r.Header.Values("Origin"); len(vs) {
	case 0:
		return true
	case 1:
		return o.Allowed(vs[0])
	}
	return false
}

// validHost: an IP address, or dot-separated non-empty labels of
// lower-case letters, digits, "-" and "_".
func validHost(h string) bool {
	if net.ParseIP(h) != nil {
		return true
	}
	for l := range strings.SplitSeq(h, ".") {
		if l == "" {
			return false
		}
		for i := 0; i < len(l); i++ {
			if c := l[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}
