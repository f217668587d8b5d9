package envelope

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Error is the one error type of the mesh: a Code from the table, a message
// that is safe to send over the wire (no internal detail), optional
// structured details, and an optional cause that stays on this side.
//
// Two *Error values are equal under errors.Is when their codes are equal, so
// errors.Is(err, envelope.ErrTimeout) matches any TIMEOUT.
type Error struct {
	Code    Code
	Message string
	// Data holds structured details as raw JSON (the kOS seed's "details").
	Data json.RawMessage
	// wire is set on errors decoded from a peer: they happened elsewhere.
	wire  bool
	cause error
	// notSent: the request provably never reached a handler, so a retry
	// is safe even for a method that is not idempotent.
	notSent bool
	// attempts made by the retry loop that gave this error up (0: no
	// retry loop decided on it yet); a loop upstream does not retry it again.
	attempts int
}

// Sentinels for errors.Is.
var (
	ErrParse            = &Error{Code: CodeParseError}
	ErrInvalidRequest   = &Error{Code: CodeInvalidRequest}
	ErrMethodNotFound   = &Error{Code: CodeMethodNotFound}
	ErrInvalidParams    = &Error{Code: CodeInvalidParams}
	ErrInternal         = &Error{Code: CodeInternal}
	ErrRPC              = &Error{Code: CodeRPCError}
	ErrAgentNotFound    = &Error{Code: CodeAgentNotFound}
	ErrUnavailable      = &Error{Code: CodeUnavailable}
	ErrTimeout          = &Error{Code: CodeTimeout}
	ErrCircuitOpen      = &Error{Code: CodeCircuitOpen}
	ErrOverloaded       = &Error{Code: CodeOverloaded}
	ErrCancelled        = &Error{Code: CodeCancelled}
	ErrUnauthenticated  = &Error{Code: CodeUnauthenticated}
	ErrPermissionDenied = &Error{Code: CodePermissionDenied}
)

// NewError returns an *Error with the given code and message.
func NewError(c Code, msg string) *Error { return &Error{Code: c, Message: msg} }

// Errorf returns an *Error with a formatted message. A %w verb records the
// cause for errors.Unwrap; its text becomes part of the message, so wrap only
// errors whose text may cross the wire.
func Errorf(c Code, format string, args ...any) *Error {
	err := fmt.Errorf(format, args...)
	return &Error{Code: c, Message: err.Error(), cause: errors.Unwrap(err)}
}

// WrapError returns an *Error with code c and message msg that keeps cause
// for errors.Unwrap without putting its text on the wire.
func WrapError(c Code, msg string, cause error) *Error {
	return &Error{Code: c, Message: msg, cause: cause}
}

// WireError marks err as having been decoded from a peer.
func WireError(c Code, msg string, data json.RawMessage) *Error {
	return &Error{Code: c, Message: msg, Data: data, wire: true}
}

// Error implements error: "CODE: message".
func (e *Error) Error() string {
	if e.Message == "" {
		return e.Code.String()
	}
	return e.Code.String() + ": " + e.Message
}

// Unwrap returns the cause, if any.
func (e *Error) Unwrap() error { return e.cause }

// Is reports whether target is an *Error with the same code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// MarkNotSent records that the request provably never reached a handler
// and returns e. Call it on a fresh error, never on a shared one.
func (e *Error) MarkNotSent() *Error { e.notSent = true; return e }

// NotSent reports whether the request provably never reached a handler.
func (e *Error) NotSent() bool { return e.notSent }

// WithAttempts returns a copy of e recording that a retry loop made n
// attempts and gave up: no retry loop upstream retries it again.
func (e *Error) WithAttempts(n int) *Error {
	cp := *e
	cp.attempts = n
	return &cp
}

// WithMaybeSent returns a copy of e without the not-sent mark: an
// earlier attempt of the same call may have reached a handler, so the
// call as a whole may have run although its last attempt did not.
func (e *Error) WithMaybeSent() *Error {
	cp := *e
	cp.notSent = false
	return &cp
}

// Attempts returns how many attempts the retry loop that gave e up made
// (0 when no retry loop has decided on it).
func (e *Error) Attempts() int { return e.attempts }

// RetryAfter returns the pushback a callee asked for in its details
// ({"retryAfterMs": N}), or 0. A retry loop waits at least that long.
func (e *Error) RetryAfter() time.Duration {
	if len(e.Data) == 0 || !bytes.Contains(e.Data, []byte(`"retryAfterMs"`)) {
		return 0
	}
	var d struct {
		RetryAfterMs int64 `json:"retryAfterMs"`
	}
	if json.Unmarshal(e.Data, &d) != nil || d.RetryAfterMs <= 0 || d.RetryAfterMs > MaxTTL.Milliseconds() {
		return 0
	}
	return time.Duration(d.RetryAfterMs) * time.Millisecond
}

// IsWire reports whether the error was decoded from a peer rather than
// raised on this side.
func (e *Error) IsWire() bool { return e.wire }

// Retryable reports whether the code allows a retry for a method with the
// given idempotency.
func (e *Error) Retryable(idempotent bool) bool { return e.Code.Retryable(idempotent) }

// WithData returns a copy of e with structured details attached.
func (e *Error) WithData(v any) *Error {
	cp := *e
	if b, err := json.Marshal(v); err == nil {
		cp.Data = b
	}
	return &cp
}

// CodeOf returns the code of err: CodeOK for nil, the code of an *Error in
// its chain, CodeTimeout or CodeCancelled for context errors, and
// CodeInternal for anything else. Context errors become codes here and
// nowhere else.
func CodeOf(err error) Code {
	if err == nil {
		return CodeOK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return CodeTimeout
	case errors.Is(err, context.Canceled):
		return CodeCancelled
	}
	return CodeInternal
}

// AsError returns err as an *Error: itself if it is one (or wraps one), a
// TIMEOUT or CANCELLED for context errors, and an INTERNAL_ERROR otherwise,
// whose message does not reveal the cause's text. nil stays nil.
func AsError(err error) *Error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	switch c := CodeOf(err); c {
	case CodeTimeout:
		return WrapError(c, "deadline exceeded", err)
	case CodeCancelled:
		return WrapError(c, "cancelled", err)
	}
	return WrapError(CodeInternal, "internal error", err)
}
