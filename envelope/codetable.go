package envelope

// codeDescriptions describe the rows of the mesh's error-code table.
var codeDescriptions = map[Code]string{
	CodeParseError:       "The request is not valid JSON",
	CodeInvalidRequest:   "The request is not a valid request object",
	CodeMethodNotFound:   "No built-in method and no registered agent serves the method",
	CodeInvalidParams:    "Params are missing or malformed",
	CodeInternal:         "Unexpected failure in the mesh",
	CodeRPCError:         "The method's handler failed",
	CodeAgentNotFound:    "No such agent or session",
	CodeUnavailable:      "No instance reachable (link dropped, none ready, hub draining); safe to retry",
	CodeTimeout:          "The deadline passed before an answer; the call may have run",
	CodeCircuitOpen:      "The circuit breaker is open for every instance serving the method",
	CodeOverloaded:       "A bulkhead or rate limit is full; retry later",
	CodeCancelled:        "The caller cancelled the call",
	CodeUnauthenticated:  "Missing, invalid or expired credentials",
	CodePermissionDenied: "The caller's roles or token do not allow the call",
}

// CodeTable returns every error code of the mesh with its description.
func CodeTable() map[string]string {
	out := map[string]string{}
	for _, c := range Codes() {
		out[c.String()] = codeDescriptions[c]
	}
	return out
}
