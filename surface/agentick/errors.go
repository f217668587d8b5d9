package agentick

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/agentmesh/agentmesh/envelope"
)

// The agentick surface's errors: the seed's codes, and the mesh's codes
// translated into them.

// Error codes of the seed (@agentick/shared).
const (
	agNotFoundResource = "NOT_FOUND_RESOURCE"
	agNotFoundTool     = "NOT_FOUND_TOOL"
	agGuardDenied      = "GUARD_DENIED"
	agValidationReq    = "VALIDATION_REQUIRED"
	agValidationType   = "VALIDATION_TYPE"
	agStateComplete    = "STATE_ALREADY_COMPLETE"
	agMethodError      = "METHOD_ERROR"
	agInternalError    = "INTERNAL_ERROR"
)

// agentickErrors is the schema's errors record (the seed's descriptions).
var agentickErrors = map[string]string{
	agNotFoundResource: "Resource not found (session, method, tool)",
	agNotFoundTool:     "Tool not found",
	agGuardDenied:      "Access denied by guard (role, permission)",
	agValidationReq:    "Required parameter missing",
	agValidationType:   "Parameter type mismatch",
	agStateComplete:    "Operation on closed/completed resource",
	agMethodError:      "Unhandled error in method handler",
	agInternalError:    "Unexpected internal error",
}

// agError is an agentick error object. meshCode, when set, is the mesh's
// code it comes from (its HTTP status answers /invoke).
type agError struct {
	Code     string         `json:"code"`
	Message  string         `json:"message"`
	Details  map[string]any `json:"details,omitempty"`
	meshCode envelope.Code
	fromMesh bool
}

func (e *agError) Error() string { return e.Code + ": " + e.Message }

func agErr(code, format string, args ...any) *agError {
	return &agError{Code: code, Message: fmt.Sprintf(format, args...)}
}

// agentickFromMesh maps a mesh error to the seed's codes; the mesh's code
// rides in details.meshCode (with retryAfterMs when it has one), as the
// seed's table has no room for UNAVAILABLE or TIMEOUT.
func agentickFromMesh(err error, tool bool) *agError {
	var ae *agError
	if errors.As(err, &ae) {
		return ae
	}
	e := envelope.AsError(err)
	code := agInternalError
	switch e.Code {
	case envelope.CodeAgentNotFound:
		code = agNotFoundResource
	case envelope.CodeMethodNotFound:
		code = agNotFoundResource
		if tool {
			code = agNotFoundTool
		}
	case envelope.CodeInvalidParams, envelope.CodeInvalidRequest, envelope.CodeParseError:
		code = agValidationType
		if strings.Contains(e.Message, "Missing required parameter") {
			code = agValidationReq
		}
	case envelope.CodePermissionDenied, envelope.CodeUnauthenticated:
		code = agGuardDenied
	case envelope.CodeRPCError, envelope.CodeCancelled:
		code = agMethodError
	}
	msg := e.Message
	if msg == "" {
		msg = e.Code.String()
	}
	ae = &agError{Code: code, Message: msg, meshCode: e.Code, fromMesh: true}
	switch e.Code {
	case envelope.CodeAgentNotFound, envelope.CodeMethodNotFound, envelope.CodeInvalidParams, envelope.CodePermissionDenied, envelope.CodeRPCError:
		// The seed's code says it all.
	default:
		ae.Details = map[string]any{"meshCode": e.Code.String()}
		if ra := e.RetryAfter(); ra > 0 {
			ae.Details["retryAfterMs"] = ra.Milliseconds()
		}
	}
	return ae
}

// httpStatus is the status of an /invoke answer failing with e.
func (e *agError) httpStatus() int {
	if e.fromMesh && e.meshCode != envelope.CodeOK {
		return e.meshCode.HTTPStatus()
	}
	switch e.Code {
	case agNotFoundResource, agNotFoundTool:
		return http.StatusNotFound
	case agValidationReq, agValidationType:
		return http.StatusBadRequest
	case agGuardDenied:
		return http.StatusForbidden
	case agStateComplete:
		return http.StatusConflict
	}
	return http.StatusInternalServerError
}
