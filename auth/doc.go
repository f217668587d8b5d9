// Package auth holds the mesh's credentials and the checks made with them:
// HMAC-signed bearer tokens (JWT, HS256 only), who may serve and who may
// call which method, where a request carries its token, and which browser
// origins may open a WebSocket. It does no I/O except reading and writing
// key files, and keeps no state: the hub wires it in.
//
// # Tokens
//
// A token is a JWT signed with a shared key (LoadKey, NewKeyFile; at least
// 32 bytes) carrying Claims: subject, roles, the method patterns its holder
// may serve as an agent, issued-at, expiry and a token id:
//
//	tok, err := auth.Issue(key, auth.Claims{Subject: "memory-agent", Serve: []string{"memory.*"}}, 24*time.Hour)
//	v, err := auth.NewVerifier(key)
//	claims, err := v.Verify(tok) // err: *envelope.Error, code UNAUTHENTICATED
//
// Verify accepts only HS256 (alg "none", RS256, ES256 … are refused before
// any key is used), requires iss "agentmesh", exp and iat, allows
// DefaultLeeway of clock skew, and refuses tokens over MaxTokenLen bytes
// and tokens whose claims break the grammar below. Expired tokens match
// errors.Is(err, ErrExpired). A hub should also cut an established link at
// Claims.ExpiresAt: a token is checked once per link, not per frame.
//
// # Authorisation
//
// MayServe(claims, capability) decides whether an agent may register a
// capability (a method name or "prefix.*" pattern): one of the token's
// Serve patterns must cover every method the capability could match.
// Method names follow a strict ASCII grammar (ValidMethod: dot-separated
// non-empty segments of letters, digits, "_" and "-"), so aliases such as
// "memory.get.", "memory..get", "memory.get " or a Cyrillic "mеmory.get"
// are not names at all, and names compare byte for byte ("Memory.Get" is
// not "memory.get", and nothing in the mesh folds case). Allowed(roles,
// required) is the per-method role guard: any one required role suffices;
// no required roles means no guard.
//
// # Where the token travels
//
// BearerToken reads "Authorization: Bearer <token>" (agents, CLIs, peer
// hubs, HTTP callers) or a WebSocket subprotocol "bearer.<token>"
// (browsers, which cannot set headers on a WebSocket), never cookies or
// query strings; two credentials in one request are refused. On the
// native WebSocket the first frame's headers.authToken is the third way;
// the hub checks it with the same Verifier before anything else runs and
// strips it before logs and spans.
//
// # Origins
//
// Origins is an allow-list for the Origin header of WebSocket upgrades
// (exact origins and "https://*.example.com"); no Origin header means a
// non-browser client and is allowed, which still has to authenticate.
// Its Check method is a websocket.Upgrader.CheckOrigin.
//
// Rate limits (per connection: hub.Config.ConnRate; per token:
// Security.RatePerToken) use internal/ratelimit.
package auth
