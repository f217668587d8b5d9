// Package control holds the control-plane contract shared by the hub and
// the agent SDK, with no dependency beyond the standard library and
// envelope.
package control

import (
	"bytes"
	"encoding"
	"encoding/json"
	"log/slog"
	"math/big"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
)

// SchemaFor derives the JSON Schema of the Go type T as encoding/json
// encodes it (json.RawMessage and interfaces: any JSON value). See SchemaOf.
func SchemaFor[T any]() (json.RawMessage, error) {
	return SchemaOf(reflect.TypeFor[T]())
}

// Schemer is a type whose JSON is its own (a MarshalJSON that writes
// other fields than its struct's, or a union of shapes): JSONSchema,
// called on a zero value (its pointer receiver allowed), is the schema of what it marshals to, and
// SchemaOf takes it as is instead of deriving one from the fields.
type Schemer interface {
	JSONSchema() json.RawMessage
}

// SchemaOf derives the JSON Schema of t, byte for byte as
// github.com/google/jsonschema-go v0.4.3 (jsonschema.ForType with
// json.RawMessage mapped to {}, then json.Marshal) derives it, with one
// exception: a byte slice that encoding/json encodes as base64 is
// {"type":["null","string"],"contentEncoding":"base64"}, not an array of
// integers.
//
// Structs are closed objects ("additionalProperties":false) whose
// properties, in field order, are the exported fields reflect.VisibleFields
// lists (embedded structs flattened; a "-" json tag skips a field); fields
// without omitempty or omitzero are required; a "jsonschema" tag is the
// property's description (not empty, not starting "WORD="). Pointers also
// allow null, and so do slices. Maps need string (or encoding.TextMarshaler)
// keys. time.Time, slog.Level and math/big's numbers are strings.
//
// A type that contains itself, a channel, a func, a complex number, an
// unsafe pointer or a map with other keys is an INVALID_PARAMS error.
func SchemaOf(t reflect.Type) (json.RawMessage, error) {
	if t == nil {
		return nil, envelope.NewError(envelope.CodeInvalidParams, "control: schema of a nil type")
	}
	if t == rawType || t.Kind() == reflect.Interface {
		return json.RawMessage(`{}`), nil
	}
	n, err := build(t, map[reflect.Type]bool{})
	if err != nil {
		return nil, envelope.Errorf(envelope.CodeInvalidParams, "control: schema of %s: %s", t, err.Message)
	}
	return json.Marshal(n)
}

var (
	rawType     = reflect.TypeFor[json.RawMessage]()
	marshaler   = reflect.TypeFor[json.Marshaler]()
	textMarsh   = reflect.TypeFor[encoding.TextMarshaler]()
	schemerType = reflect.TypeFor[Schemer]()
	stringTypes = map[reflect.Type]bool{ // jsonschema-go's built-in type schemas
		reflect.TypeFor[time.Time](): true, reflect.TypeFor[slog.Level](): true,
		reflect.TypeFor[big.Int](): true, reflect.TypeFor[big.Rat](): true, reflect.TypeFor[big.Float](): true,
	}
)

// node is a schema with the keywords jsonschema-go infers, in the order
// its Schema.MarshalJSON writes them.
type node struct {
	raw      json.RawMessage // the schema a Schemer gave: written as is
	Type     any             `json:"type,omitempty"` // a string, or []string
	Props    *props          `json:"properties,omitempty"`
	Items    *node           `json:"items,omitempty"`
	Desc     string          `json:"description,omitempty"`
	Min      *int64          `json:"minimum,omitempty"`
	Max      *int64          `json:"maximum,omitempty"`
	MinItems *int            `json:"minItems,omitempty"`
	MaxItems *int            `json:"maxItems,omitempty"`
	Required []string        `json:"required,omitempty"`
	Addl     *node           `json:"additionalProperties,omitempty"`
	Encoding string          `json:"contentEncoding,omitempty"`
	never    bool            // the false schema
}

// MarshalJSON writes an empty schema as true, the false schema as false.
func (n node) MarshalJSON() ([]byte, error) {
	if n.never {
		return []byte("false"), nil
	}
	if n.raw != nil {
		return n.raw, nil
	}
	type plain node
	b, err := json.Marshal(plain(n))
	if string(b) == "{}" {
		return []byte("true"), err
	}
	return b, err
}

// props are an object's properties, in order.
type props []prop

type prop struct {
	name string
	s    *node
}

// MarshalJSON writes the properties in their order.
func (ps props) MarshalJSON() ([]byte, error) {
	b := []byte{'{'}
	for i, p := range ps {
		if i > 0 {
			b = append(b, ',')
		}
		k, _ := json.Marshal(p.name)
		v, err := json.Marshal(p.s)
		if err != nil {
			return nil, err
		}
		b = append(append(append(b, k...), ':'), v...)
	}
	return append(b, '}'), nil
}

// build mirrors jsonschema-go's forType.
func build(t reflect.Type, seen map[reflect.Type]bool) (*node, *envelope.Error) {
	null := false
	for t.Kind() == reflect.Pointer {
		null = true
		t = t.Elem()
	}
	if t.Name() != "" {
		if seen[t] {
			return nil, errorf("cycle detected for type %v", t)
		}
		seen[t] = true
		defer delete(seen, t)
	}
	s := &node{}
	if t.Kind() != reflect.Interface && (t.Implements(schemerType) || reflect.PointerTo(t).Implements(schemerType)) {
		// Its JSON is its own (a MarshalJSON): the schema is what it
		// says it marshals to, not what its fields would.
		raw := reflect.New(t).Interface().(Schemer).JSONSchema()
		if !json.Valid(raw) {
			return nil, errorf("%v: JSONSchema is not JSON", t)
		}
		if null {
			raw = json.RawMessage(`{"anyOf":[{"type":"null"},` + string(raw) + `]}`)
		}
		s.raw = raw
		return s, nil
	}
	switch k := t.Kind(); {
	case t == rawType: // {}, or {"type":["null"]} behind a pointer
		if null {
			s.Type = []string{"null"}
		}
		return s, nil
	case stringTypes[t]:
		s.Type = "string"
	case isBase64(t):
		s.Type, s.Encoding = []string{"null", "string"}, "base64"
	case k == reflect.Bool:
		s.Type = "boolean"
	case k == reflect.Int || k == reflect.Int64:
		s.Type = "integer"
	case k == reflect.Uint || k == reflect.Uint64 || k == reflect.Uintptr:
		s.Type, s.Min = "integer", new(int64(0))
	case k >= reflect.Int8 && k <= reflect.Int32: // Int8, Int16, Int32
		bits := t.Bits()
		s.Type, s.Min, s.Max = "integer", new(int64(-1)<<(bits-1)), new(int64(1)<<(bits-1)-1)
	case k >= reflect.Uint8 && k <= reflect.Uint32: // Uint8, Uint16, Uint32
		s.Type, s.Min, s.Max = "integer", new(int64(0)), new(int64(1)<<t.Bits()-1)
	case k == reflect.Float32 || k == reflect.Float64:
		s.Type = "number"
	case k == reflect.String:
		s.Type = "string"
	case k == reflect.Interface:
	case k == reflect.Map:
		if t.Key().Kind() != reflect.String && !t.Key().Implements(textMarsh) {
			return nil, errorf("unsupported map key type %v", t.Key().Kind())
		}
		v, err := build(t.Elem(), seen)
		if err != nil {
			return nil, errorf("computing map value schema: %s", err.Message)
		}
		s.Type, s.Addl = "object", v
	case k == reflect.Slice || k == reflect.Array:
		s.Type = []string{"null", "array"}
		if k == reflect.Array {
			s.Type, s.MinItems, s.MaxItems = "array", new(t.Len()), new(t.Len())
		}
		it, err := build(t.Elem(), seen)
		if err != nil {
			return nil, errorf("computing element schema: %s", err.Message)
		}
		s.Items = it
	case k == reflect.Struct:
		if err := s.fields(t, seen); err != nil {
			return nil, err
		}
	default:
		return nil, errorf("type %v has no JSON Schema", t)
	}
	if typ, ok := s.Type.(string); ok && null {
		s.Type = []string{"null", typ}
	}
	return s, nil
}

// fields fills the object schema of struct type t.
func (s *node) fields(t reflect.Type, seen map[reflect.Type]bool) *envelope.Error {
	s.Type, s.Addl = "object", &node{never: true}
	var ps props
	for _, f := range reflect.VisibleFields(t) {
		if s.Props == nil {
			s.Props = &ps
		}
		if f.Anonymous {
			// Its promoted fields follow; jsonschema-go refuses an
			// embedded type it has a fixed schema for (not an object).
			if f.Type == rawType || stringTypes[f.Type] {
				return errorf("embedded field %s.%s: its type has a fixed schema, not an object", t, f.Name)
			}
			continue
		}
		name, opts, omit := jsonField(f)
		if omit {
			continue
		}
		fs, err := build(f.Type, seen)
		if err != nil {
			return err
		}
		if tag, ok := f.Tag.Lookup("jsonschema"); ok {
			if tag == "" {
				return errorf("empty jsonschema tag on struct field %s.%s", t, f.Name)
			}
			if i := strings.IndexByte(tag, '='); i >= 0 && !strings.ContainsAny(tag[:i], " \t\n") {
				return errorf("tag must not begin with 'WORD=': %q", tag)
			}
			fs.Desc = tag
		}
		ps = append(ps, prop{name, fs})
		if !slices.Contains(opts, "omitempty") && !slices.Contains(opts, "omitzero") {
			s.Required = append(s.Required, name)
		}
	}
	// A name met twice keeps its last schema, at its last place.
	last := map[string]int{}
	for i, p := range ps {
		last[p.name] = i
	}
	kept := ps[:0]
	for i, p := range ps {
		if last[p.name] == i {
			kept = append(kept, p)
		}
	}
	ps = kept
	return nil
}

// jsonField is a field's JSON name and tag options as jsonschema-go reads
// them (the tag's name verbatim, whatever encoding/json thinks of it).
func jsonField(f reflect.StructField) (name string, opts []string, omit bool) {
	if !f.IsExported() {
		return "", nil, true
	}
	tag, ok := f.Tag.Lookup("json")
	if !ok {
		return f.Name, nil, false
	}
	name, rest, found := strings.Cut(tag, ",")
	if name == "-" && !found {
		return "", nil, true
	}
	if name == "" {
		name = f.Name
	}
	if rest != "" {
		opts = strings.Split(rest, ",")
	}
	return name, opts, false
}

// isBase64 reports whether encoding/json encodes t as a base64 string.
func isBase64(t reflect.Type) bool {
	if t.Kind() != reflect.Slice || t.Elem().Kind() != reflect.Uint8 {
		return false
	}
	p := reflect.PointerTo(t.Elem())
	return !p.Implements(marshaler) && !p.Implements(textMarsh)
}

func errorf(format string, args ...any) *envelope.Error {
	return envelope.Errorf(envelope.CodeInvalidParams, format, args...)
}

// EncodeSchemas checks the schemas an agent declares in agent.register and
// encodes them for its registration (nil when there are none): each names
// a method the agent serves (serves: its capabilities match it), no
// wildcard; params and result are JSON Schemas; errors are the mesh's
// codes; roles are 1 to 64 bytes; at most MaxSchemaBytes in all.
func EncodeSchemas(schemas map[string]MethodSchema, serves func(method string) bool) (json.RawMessage, error) {
	if len(schemas) == 0 {
		return nil, nil
	}
	for m, s := range schemas {
		if strings.Contains(m, "*") || !serves(m) {
			return nil, envelope.Errorf(envelope.CodeInvalidParams, "agent.register: schemas: %q is not a method this agent serves", m)
		}
		for what, raw := range map[string]json.RawMessage{"params": s.Params, "result": s.Result} {
			if len(raw) == 0 {
				continue
			}
			v := bytes.TrimSpace(raw)
			if !(len(v) > 0 && v[0] == '{') && string(v) != "true" && string(v) != "false" {
				return nil, envelope.Errorf(envelope.CodeInvalidParams, "agent.register: schemas: %s: %s must be a JSON Schema (an object or a boolean)", m, what)
			}
		}
		for _, e := range s.Errors {
			if _, ok := envelope.ParseCode(e); !ok || e == "OK" {
				return nil, envelope.Errorf(envelope.CodeInvalidParams, "agent.register: schemas: %s: %q is not an error code of the mesh", m, e)
			}
		}
		for _, r := range s.Roles {
			if r == "" || len(r) > 64 {
				return nil, envelope.Errorf(envelope.CodeInvalidParams, "agent.register: schemas: %s: roles are 1 to 64 bytes", m)
			}
		}
	}
	raw, err := json.Marshal(schemas)
	if err != nil {
		return nil, envelope.WrapError(envelope.CodeInvalidParams, "agent.register: schemas cannot be encoded", err)
	}
	if len(raw) > MaxSchemaBytes {
		return nil, envelope.Errorf(envelope.CodeInvalidParams, "agent.register: schemas take %d bytes; at most %d", len(raw), MaxSchemaBytes)
	}
	return raw, nil
}
