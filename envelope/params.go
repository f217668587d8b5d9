package envelope

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
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
		return ParamsError(method, err)
	}
	return nil
}

// ParamsError is the INVALID_PARAMS error for err, what decoding a
// method's params into a Go value returned, said in the caller's terms:
// the field at fault and the JSON type it must be ("memory.get: field
// \"key\" must be a string, not number"), never a Go type or struct name
// (encoding/json's "cannot unmarshal number into Go struct field
// keyParams.key of type string").
func ParamsError(method string, err error) *Error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te) && te.Field != "":
		return Errorf(CodeInvalidParams, "%s: field %q must be %s, not %s", method, te.Field, jsonKind(te.Type), te.Value)
	case errors.As(err, &te):
		return Errorf(CodeInvalidParams, "%s: params must be %s, not %s", method, jsonKind(te.Type), te.Value)
	case errors.As(err, &se):
		return Errorf(CodeInvalidParams, "%s: params are not valid JSON (at byte %d)", method, se.Offset)
	case strings.HasPrefix(err.Error(), "json: unknown field"):
		return Errorf(CodeInvalidParams, "%s: %s", method, strings.TrimPrefix(err.Error(), "json: "))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return Errorf(CodeInvalidParams, "%s: params end too soon", method)
	}
	var ee *Error
	if errors.As(err, &ee) {
		return ee // a field's own UnmarshalJSON said what is wrong, in mesh terms
	}
	if msg := err.Error(); !strings.HasPrefix(msg, "json: ") {
		return Errorf(CodeInvalidParams, "%s: %s", method, msg) // a field's own UnmarshalJSON, in its terms
	}
	return Errorf(CodeInvalidParams, "%s: invalid params", method)
}

// jsonKind names the JSON type a Go type decodes from.
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return kindName(t.Kind().String())
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
	case "float64", "float32", "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "a number"
	}
	return "of another type"
}
