package envelope

import (
	"fmt"
)

// Code is one row of the mesh's closed error-code table. The zero value is
// CodeOK and is never carried by an *Error.
type Code uint8

// The code table of DESIGN.md. Every dialect maps to it.
const (
	CodeOK               Code = iota // not an error
	CodeParseError                   // not JSON
	CodeInvalidRequest               // not a valid request object
	CodeMethodNotFound               // no built-in and no registered agent serves it
	CodeInvalidParams                // params missing or malformed
	CodeInternal                     // unexpected failure in the mesh
	CodeRPCError                     // a handler failed
	CodeAgentNotFound                // no such agent or session
	CodeUnavailable                  // instance unreachable, link dropped
	CodeTimeout                      // deadline passed
	CodeCircuitOpen                  // breaker open
	CodeOverloaded                   // bulkhead or rate limit full
	CodeCancelled                    // caller cancelled
	CodeUnauthenticated              // missing or bad credentials
	CodePermissionDenied             // role or guard refused
	numCodes
)

// RetryClass says whether a failed call with that code may be tried again.
type RetryClass uint8

const (
	// RetryNever: the same request would fail the same way.
	RetryNever RetryClass = iota
	// RetryAlways: the request did not run, or failed for a transient reason.
	RetryAlways
	// RetryIdempotent: the request may have run; retry only idempotent methods.
	RetryIdempotent
)

type codeRow struct {
	name    string
	jsonrpc int
	http    int
	retry   RetryClass
	std     string // the JSON-RPC 2.0 specification's message, for its own codes
}

var codeTable = [numCodes]codeRow{
	CodeOK:               {"OK", 0, 200, RetryNever, ""},
	CodeParseError:       {"PARSE_ERROR", -32700, 400, RetryNever, "Parse error"},
	CodeInvalidRequest:   {"INVALID_REQUEST", -32600, 400, RetryNever, "Invalid Request"},
	CodeMethodNotFound:   {"METHOD_NOT_FOUND", -32601, 404, RetryNever, "Method not found"},
	CodeInvalidParams:    {"INVALID_PARAMS", -32602, 400, RetryNever, "Invalid params"},
	CodeInternal:         {"INTERNAL_ERROR", -32603, 500, RetryNever, "Internal error"},
	CodeRPCError:         {"RPC_ERROR", -32000, 500, RetryNever, ""},
	CodeAgentNotFound:    {"AGENT_NOT_FOUND", -32001, 404, RetryNever, ""},
	CodeUnavailable:      {"UNAVAILABLE", -32002, 503, RetryAlways, ""},
	CodeTimeout:          {"TIMEOUT", -32003, 504, RetryIdempotent, ""},
	CodeCircuitOpen:      {"CIRCUIT_OPEN", -32004, 503, RetryAlways, ""},
	CodeOverloaded:       {"OVERLOADED", -32005, 429, RetryAlways, ""},
	CodeCancelled:        {"CANCELLED", -32006, 499, RetryNever, ""},
	CodeUnauthenticated:  {"UNAUTHENTICATED", -32007, 401, RetryNever, ""},
	CodePermissionDenied: {"PERMISSION_DENIED", -32008, 403, RetryNever, ""},
}

// Codes returns every error code of the table, in table order (CodeOK excluded).
func Codes() []Code {
	out := make([]Code, 0, numCodes-1)
	for c := CodeParseError; c < numCodes; c++ {
		out = append(out, c)
	}
	return out
}

func (c Code) row() codeRow {
	if c < numCodes {
		return codeTable[c]
	}
	return codeRow{name: fmt.Sprintf("CODE(%d)", uint8(c)), jsonrpc: -32603, http: 500}
}

// String returns the symbolic name, e.g. "TIMEOUT".
func (c Code) String() string { return c.row().name }

// JSONRPC returns the JSON-RPC 2.0 error number, e.g. -32003.
func (c Code) JSONRPC() int { return c.row().jsonrpc }

// HTTPStatus returns the HTTP status of the code for plain-HTTP surfaces.
func (c Code) HTTPStatus() int { return c.row().http }

// Retry returns the code's retry class.
func (c Code) Retry() RetryClass { return c.row().retry }

// Retryable reports whether a call that failed with c may be retried, given
// whether the method is idempotent.
func (c Code) Retryable(idempotent bool) bool {
	switch c.Retry() {
	case RetryAlways:
		return true
	case RetryIdempotent:
		return idempotent
	}
	return false
}

// MarshalText implements encoding.TextMarshaler.
func (c Code) MarshalText() ([]byte, error) {
	if c >= numCodes {
		return nil, fmt.Errorf("envelope: invalid code %d", uint8(c))
	}
	return []byte(codeTable[c].name), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (c *Code) UnmarshalText(b []byte) error {
	v, ok := ParseCode(string(b))
	if !ok {
		return fmt.Errorf("envelope: unknown error code %q", b)
	}
	*c = v
	return nil
}

// ParseCode maps a symbolic name ("TIMEOUT") to its Code.
func ParseCode(s string) (Code, bool) {
	for c := CodeOK; c < numCodes; c++ {
		if codeTable[c].name == s {
			return c, true
		}
	}
	return 0, false
}

// CodeFromJSONRPC maps a JSON-RPC error number to its Code. A number outside
// the table (an application's own code) maps to CodeRPCError, with ok false.
func CodeFromJSONRPC(n int) (c Code, ok bool) {
	for c := CodeParseError; c < numCodes; c++ {
		if codeTable[c].jsonrpc == n {
			return c, true
		}
	}
	return CodeRPCError, false
}
