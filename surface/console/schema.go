package console

import (
	"encoding/json"
	"net/http"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/agentmesh/agentmesh/envelope"
)

// paramsSchema returns the params schema the mesh declares for method
// (nil when none is declared), as the page shows it.
func (c *console) paramsSchema(method string) (json.RawMessage, string) {
	m, ok := c.h.Schema().Methods[method]
	if !ok {
		return nil, ""
	}
	return m.Params, m.Description
}

// checkParams validates params against method's declared params schema,
// as grpcui checks a form against the method's message: a call the agent
// would refuse is refused before it is made, with the schema's words.
func (c *console) checkParams(method string, params json.RawMessage) *envelope.Error {
	raw, _ := c.paramsSchema(method)
	if len(raw) == 0 {
		return nil
	}
	var s jsonschema.Schema
	if json.Unmarshal(raw, &s) != nil {
		return nil // a schema this validator cannot read: the agent decides
	}
	r, err := s.Resolve(nil)
	if err != nil {
		return nil
	}
	var v any = map[string]any{}
	if len(params) > 0 {
		if err := json.Unmarshal(params, &v); err != nil {
			return envelope.Errorf(envelope.CodeParseError, "params are not valid JSON: %v", err)
		}
	}
	if err := r.Validate(v); err != nil {
		return envelope.Errorf(envelope.CodeInvalidParams, "params do not match %s's declared schema: %v", method, err)
	}
	return nil
}

// schema is GET /ui/api/schema?method=M: the method's description and
// params schema, for the call form.
func (c *console) schema(w http.ResponseWriter, r *http.Request) {
	if _, ok := c.admit(w, r); !ok {
		return
	}
	method := r.URL.Query().Get("method")
	params, desc := c.paramsSchema(method)
	writeJSON(w, map[string]any{"method": method, "description": desc, "params": params})
}
