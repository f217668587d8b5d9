package control

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"strings"

	"github.com/agentmesh/agentmesh/envelope"
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
func ParamsError(method string, err error) *envelope.Error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te) && te.Field != "":
		return envelope.Errorf(envelope.CodeInvalidParams, "%s: field %q must be %s, not %s", method, te.Field, jsonKind(te.Type), got(te.Value))
	case errors.As(err, &te):
		return envelope.Errorf(envelope.CodeInvalidParams, "%s: params must be %s, not %s", method, jsonKind(te.Type), got(te.Value))
	case errors.As(err, &se):
		return envelope.Errorf(envelope.CodeInvalidParams, "%s: params are not valid JSON (at byte %d)", method, se.Offset)
	case strings.HasPrefix(err.Error(), "json: unknown field"):
		return envelope.Errorf(envelope.CodeInvalidParams, "%s: %s", method, strings.TrimPrefix(err.Error(), "json: "))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return envelope.Errorf(envelope.CodeInvalidParams, "%s: params end too soon", method)
	}
	var ee *envelope.Error
	if errors.As(err, &ee) {
		return ee // a field's own UnmarshalJSON said what is wrong, in mesh terms
	}
	if msg := err.Error(); !strings.HasPrefix(msg, "json: ") {
		// A field's own UnmarshalJSON, in its terms, less the Go method
		// name some prefix it with ("Time.UnmarshalJSON: ").
		return envelope.Errorf(envelope.CodeInvalidParams, "%s: %s", method, unmarshalerPrefix.ReplaceAllString(msg, ""))
	}
	return envelope.Errorf(envelope.CodeInvalidParams, "%s: invalid params", method)
}

var unmarshalerPrefix = regexp.MustCompile(`^[A-Za-z0-9_.*]+\.UnmarshalJSON: `)

// got is what the caller sent, as encoding/json names it: a JSON type
// ("number"), or for a number out of the field's range or not whole, the
// number itself ("number -1" is said "-1").
func got(v string) string {
	if n, ok := strings.CutPrefix(v, "number "); ok {
		return n
	}
	return v
}

// jsonKind names the JSON type a Go type decodes from; for an integer
// type, its range ("a non-negative integer", "an integer from -128 to
// 127").
func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch k := t.Kind(); {
	case k == reflect.Int || k == reflect.Int64:
		return "an integer"
	case k >= reflect.Int8 && k <= reflect.Int32:
		return fmt.Sprintf("an integer from %d to %d", int64(-1)<<(t.Bits()-1), int64(1)<<(t.Bits()-1)-1)
	case k == reflect.Uint || k == reflect.Uint64 || k == reflect.Uintptr:
		return "a non-negative integer"
	case k >= reflect.Uint8 && k <= reflect.Uint32:
		return fmt.Sprintf("an integer from 0 to %d", uint64(1)<<t.Bits()-1)
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
