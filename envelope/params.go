package envelope

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
)

// DecodeParams decodes the params of a method strictly: an
// object, no unknown fields, and a message naming the field at fault.
func DecodeParams(method string, params json.RawMessage, v any) error {
	if len(params) == 0 || string(params) == "null" {
		params = []byte("{}")
	}
	dec := json.NewDecoder(bytes.NewReader(params))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		switch {
		case errors.As(err, &te) && te.Field != "":
			return Errorf(CodeInvalidParams, "%s: field %q must be %s, not %s", method, te.Field, kindName(te.Type.Kind().String()), te.Value)
		case errors.As(err, &te):
			return Errorf(CodeInvalidParams, "%s: params must be an object, not %s", method, te.Value)
		case strings.HasPrefix(err.Error(), "json: unknown field"):
			return Errorf(CodeInvalidParams, "%s: %s", method, strings.TrimPrefix(err.Error(), "json: "))
		}
		return Errorf(CodeInvalidParams, "%s: invalid params", method)
	}
	return nil
}

func kindName(k string) string {
	switch k {
	case "slice", "array":
		return "an array"
	case "struct", "map":
		return "an object"
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "float64", "int", "int64", "uint64", "uint32", "int32":
		return "a number"
	}
	return k
}
