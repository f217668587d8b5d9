package control_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/agents/chat"
	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
)

var rawType = reflect.TypeFor[json.RawMessage]()

// reference is what mesh.SchemaFor computed with jsonschema-go before
// [M10] (mesh/schema.go), plus the one deliberate difference of
// control.SchemaOf: each byte slice that encoding/json really encodes as
// a base64 string (probed by encoding one) is declared as such.
func reference(t reflect.Type) (json.RawMessage, error) {
	if t == rawType || t.Kind() == reflect.Interface {
		return json.RawMessage(`{}`), nil
	}
	ts := map[reflect.Type]*jsonschema.Schema{rawType: {}}
	for _, b := range base64Slices(t, map[reflect.Type]bool{}) {
		ts[b] = &jsonschema.Schema{Types: []string{"null", "string"}, ContentEncoding: "base64"}
	}
	for _, st := range schemers(t, map[reflect.Type]bool{}) {
		var js jsonschema.Schema
		if err := json.Unmarshal(reflect.New(st).Interface().(control.Schemer).JSONSchema(), &js); err != nil {
			return nil, err
		}
		ts[st] = &js
	}
	s, err := jsonschema.ForType(t, &jsonschema.ForOptions{TypeSchemas: ts})
	if err != nil {
		return nil, err
	}
	return json.Marshal(s)
}

// base64Slices lists the slice types reachable from t that encoding/json
// encodes as a JSON string.
func base64Slices(t reflect.Type, seen map[reflect.Type]bool) (out []reflect.Type) {
	if seen[t] {
		return nil
	}
	seen[t] = true
	switch t.Kind() {
	case reflect.Slice:
		if t != rawType && t.Elem().Kind() == reflect.Uint8 {
			v := reflect.MakeSlice(t, 1, 1)
			if j, err := json.Marshal(v.Interface()); err == nil && j[0] == '"' {
				out = append(out, t)
			}
		}
		return append(out, base64Slices(t.Elem(), seen)...)
	case reflect.Pointer, reflect.Array:
		return base64Slices(t.Elem(), seen)
	case reflect.Map:
		return append(base64Slices(t.Key(), seen), base64Slices(t.Elem(), seen)...)
	case reflect.Struct:
		for i := range t.NumField() {
			out = append(out, base64Slices(t.Field(i).Type, seen)...)
		}
	}
	return out
}

// schemers lists the types reachable from t whose schema is their own
// (control.Schemer): the reference takes it as is, as SchemaOf does.
func schemers(t reflect.Type, seen map[reflect.Type]bool) (out []reflect.Type) {
	if seen[t] {
		return nil
	}
	seen[t] = true
	if t.Kind() != reflect.Interface && (t.Implements(reflect.TypeFor[control.Schemer]()) || reflect.PointerTo(t).Implements(reflect.TypeFor[control.Schemer]())) {
		return []reflect.Type{t}
	}
	switch t.Kind() {
	case reflect.Slice, reflect.Pointer, reflect.Array:
		return schemers(t.Elem(), seen)
	case reflect.Map:
		return append(schemers(t.Key(), seen), schemers(t.Elem(), seen)...)
	case reflect.Struct:
		for i := range t.NumField() {
			out = append(out, schemers(t.Field(i).Type, seen)...)
		}
	}
	return out
}

// canonical is j with its objects' keys sorted (the order jsonschema-go
// writes a Schemer's keywords in is its own).
func canonical(j []byte) []byte {
	var v any
	if json.Unmarshal(j, &v) != nil {
		return j
	}
	b, _ := json.Marshal(v)
	return b
}

// compare checks control.SchemaOf(t) against the reference: the same
// bytes (the same JSON, keys in any order, where t reaches a Schemer), or
// both an error (ours an INVALID_PARAMS one).
func compare(t *testing.T, typ reflect.Type) {
	t.Helper()
	want, werr := reference(typ)
	got, gerr := control.SchemaOf(typ)
	switch {
	case werr != nil && gerr == nil:
		t.Errorf("%v: jsonschema-go fails (%v), SchemaOf gives %s", typ, werr, got)
	case werr == nil && gerr != nil:
		t.Errorf("%v: SchemaOf fails (%v), jsonschema-go gives %s", typ, gerr, want)
	case gerr != nil:
		if envelope.CodeOf(gerr) != envelope.CodeInvalidParams {
			t.Errorf("%v: error %v is not INVALID_PARAMS", typ, gerr)
		}
	case len(schemers(typ, map[reflect.Type]bool{})) > 0 && bytes.Equal(canonical(got), canonical(want)):
	case !bytes.Equal(got, want):
		t.Errorf("%v:\n got  %s\n want %s", typ, got, want)
	}
}

// Types of the edge cases.
type (
	myInt          int8
	myString       string
	textKey        struct{ a, b int }
	generic[T any] struct {
		V  T   `json:"v"`
		VS []T `json:"vs,omitempty"`
	}
	inner struct {
		X int    `json:"x" jsonschema:"inner x"`
		Y string `json:"y,omitempty"`
	}
	innerB struct {
		X float64 `json:"x"`
		Z bool
	}
	hidden struct {
		Shown int `json:"shown"`
	}
	tagged struct {
		Plain      int
		Named      string  `json:"named"`
		Omit       string  `json:"omit,omitempty"`
		Zero       float64 `json:"zero,omitzero"`
		Both       uint8   `json:"both,omitempty,omitzero"`
		Skipped    int     `json:"-"`
		Dash       int     `json:"-,"`
		NoName     int     `json:",omitempty"`
		Str        int64   `json:"str,string"`
		Spaced     int     `json:"has space"`
		Weird      int     `json:"a<b>&c"`
		Desc       string  `jsonschema:"HTML <b>&amp;</b>, unicode é ✓, \u2028 and = after a space"`
		unexported int
		C          chan int `json:"-"`
		f          func()
		Any        any
		Raw        json.RawMessage `json:"raw,omitempty"`
		RawP       *json.RawMessage
		AnyP       *any
		Iface      fmt.Stringer `jsonschema:"an interface"`
		Err        error
	}
	embeds struct {
		inner
		*innerB
		hidden
		Own int `json:"own"`
	}
	embedNamedBasic struct {
		myInt
		myString `json:"s"`
		N        int
	}
	embedIface struct {
		fmt.Stringer
		N int
	}
	embedTimePtr struct {
		*time.Time
		N int
	}
	onlyHidden struct{ a, b int }
	stdTypes   struct {
		T   time.Time
		TP  *time.Time `json:",omitempty"`
		D   time.Duration
		L   slog.Level
		BI  *big.Int
		BR  big.Rat
		BF  *big.Float
		IP  netip.Addr
		Ts  []time.Time
		TM  map[string]time.Time
		Two time.Time // the same named type twice is no cycle
	}
	numbers struct {
		I   int
		I8  int8
		I16 int16
		I32 int32
		I64 int64
		U   uint
		U8  uint8
		U16 uint16
		U32 uint32
		U64 uint64
		UP  uintptr
		F32 float32
		F64 float64
		MI  myInt
		PI  *int16
		PPU **uint32
	}
	collections struct {
		S   []int
		SS  [][]string
		SP  []*int
		PS  *[]int
		A   [3]int
		A0  [0]string
		PA  *[2]bool
		AB  [4]byte
		M   map[string]int
		MS  map[myString][]string
		MT  map[textKey]int
		MA  map[string]any
		MP  map[string]*inner
		SA  []any
		SR  []json.RawMessage
		SIn []inner
	}
	bytesTypes struct {
		B    []byte
		BP   *[]byte
		Blob blob
		Bs   [][]byte
		MB   map[string][]byte
		MyB  []myByte
		TB   []textByte
		Arr  [8]byte
	}
	blob     []byte
	myByte   uint8
	textByte uint8

	node     struct{ Next *node }
	list     []list
	tree     map[string]tree
	mutualA  struct{ B *mutualB }
	mutualB  struct{ As []mutualA }
	wrapNode struct{ N node }

	embedTime  struct{ time.Time }
	embedRaw   struct{ json.RawMessage }
	embedLevel struct{ slog.Level }
	badTag     struct {
		A int `jsonschema:"word=value"`
	}
	emptyTag struct {
		A int `jsonschema:""`
	}
	withChan    struct{ C chan int }
	withFunc    struct{ F func() }
	withComplex struct{ C complex128 }
	badMapVal   struct{ M map[string]chan int }
	intKeys     struct{ M map[int]string }
)

func (k textKey) MarshalText() ([]byte, error)  { return fmt.Appendf(nil, "%d-%d", k.a, k.b), nil }
func (b textByte) MarshalText() ([]byte, error) { return []byte{'t', byte(b)}, nil }

// Exported types, for reflect.StructOf to embed.
type (
	Pub struct {
		X   int    `json:"x" jsonschema:"pub x"`
		Y   string `json:"a"`
		hid int
	}
	PubB struct {
		X float64 `json:"x,omitempty"`
		Z bool
	}
	PubEmbeds struct {
		Pub
		*PubB
		W []string `json:"w"`
	}
	PubInt int
)

// kv* and add* are copies of unexported types of agents/builtin.go and
// mesh/schema_test.go that go to SchemaFor.
type (
	kvKey struct {
		Key string `json:"key" jsonschema:"the key"`
	}
	kvPut struct {
		Key   string          `json:"key" jsonschema:"the key"`
		Value json.RawMessage `json:"value" jsonschema:"any JSON value"`
	}
	kvPutResult struct {
		OK  bool   `json:"ok"`
		Key string `json:"key"`
	}
	kvGetResult struct {
		Key   string          `json:"key"`
		Value json.RawMessage `json:"value" jsonschema:"the value, null when not found"`
		Found bool            `json:"found"`
	}
	kvDeleteResult struct {
		Deleted bool `json:"deleted" jsonschema:"whether the key was there"`
	}
	kvQuery struct {
		Prefix string `json:"prefix,omitempty" jsonschema:"keys starting with this"`
		Q      string `json:"q,omitempty" jsonschema:"substring of the key or of the value's JSON"`
		Limit  int    `json:"limit,omitempty" jsonschema:"at most this many items (1..1000, default 1000)"`
	}
	kvQueryResult struct {
		Items []agents.KVItem `json:"items"`
		Count int             `json:"count"`
	}
	addParams struct {
		A int `json:"a" jsonschema:"first term"`
		B int `json:"b" jsonschema:"second term"`
	}
	addResult struct {
		Sum int `json:"sum"`
	}
)

// projectTypes are the types the project gives SchemaFor (mesh, agents,
// agents/chat), as of [M10].
var projectTypes = []reflect.Type{
	reflect.TypeFor[control.RegisterParams](), reflect.TypeFor[control.RegisterResult](),
	reflect.TypeFor[control.HeartbeatParams](), reflect.TypeFor[control.DeregisterParams](),
	reflect.TypeFor[[]control.AgentInfo](), reflect.TypeFor[[]control.MethodInfo](), reflect.TypeFor[control.SchemaPayload](),
	reflect.TypeFor[agents.SleepParams](), reflect.TypeFor[agents.SleepResult](),
	reflect.TypeFor[kvKey](), reflect.TypeFor[kvPut](), reflect.TypeFor[kvPutResult](), reflect.TypeFor[kvGetResult](),
	reflect.TypeFor[kvDeleteResult](), reflect.TypeFor[kvQuery](), reflect.TypeFor[kvQueryResult](),
	reflect.TypeFor[chat.CreateResult](), reflect.TypeFor[[]chat.AgentInfo](), reflect.TypeFor[chat.SendResult](),
	reflect.TypeFor[chat.ResetResult](), reflect.TypeFor[chat.Tokens](), reflect.TypeFor[chat.ContextInfo](),
	reflect.TypeFor[chat.MessagesPage](), reflect.TypeFor[chat.EventsPage](),
	reflect.TypeFor[addParams](), reflect.TypeFor[addResult](),
}

// edgeTypes give a schema.
var edgeTypes = []reflect.Type{
	reflect.TypeFor[bool](), reflect.TypeFor[int](), reflect.TypeFor[int8](), reflect.TypeFor[int16](),
	reflect.TypeFor[int32](), reflect.TypeFor[int64](), reflect.TypeFor[uint](), reflect.TypeFor[uint8](),
	reflect.TypeFor[uint16](), reflect.TypeFor[uint32](), reflect.TypeFor[uint64](), reflect.TypeFor[uintptr](),
	reflect.TypeFor[float32](), reflect.TypeFor[float64](), reflect.TypeFor[string](), reflect.TypeFor[myInt](),
	reflect.TypeFor[*int](), reflect.TypeFor[**string](), reflect.TypeFor[*myInt](),
	reflect.TypeFor[any](), reflect.TypeFor[*any](), reflect.TypeFor[**any](), reflect.TypeFor[fmt.Stringer](),
	reflect.TypeFor[error](), reflect.TypeFor[json.RawMessage](), reflect.TypeFor[*json.RawMessage](),
	reflect.TypeFor[[]json.RawMessage](), reflect.TypeFor[map[string]json.RawMessage](),
	reflect.TypeFor[time.Time](), reflect.TypeFor[*time.Time](), reflect.TypeFor[time.Duration](),
	reflect.TypeFor[slog.Level](), reflect.TypeFor[big.Int](), reflect.TypeFor[*big.Float](),
	reflect.TypeFor[[]int](), reflect.TypeFor[*[]int](), reflect.TypeFor[[2]string](), reflect.TypeFor[*[2]string](),
	reflect.TypeFor[[]any](), reflect.TypeFor[map[string]any](), reflect.TypeFor[map[string]int](),
	reflect.TypeFor[*map[string]int](), reflect.TypeFor[map[myString]bool](), reflect.TypeFor[map[textKey]int](),
	reflect.TypeFor[struct{}](), reflect.TypeFor[*struct{}](), reflect.TypeFor[onlyHidden](),
	reflect.TypeFor[struct {
		A int `json:"a"`
	}](),
	reflect.TypeFor[generic[int]](), reflect.TypeFor[generic[*inner]](), reflect.TypeFor[generic[generic[string]]](),
	reflect.TypeFor[inner](), reflect.TypeFor[*inner](), reflect.TypeFor[[]inner](), reflect.TypeFor[[]*inner](),
	reflect.TypeFor[tagged](), reflect.TypeFor[embeds](), dupNames, shadow,
	sameDepth, reflect.TypeFor[embedNamedBasic](), reflect.TypeFor[embedIface](),
	reflect.TypeFor[embedTimePtr](), reflect.TypeFor[stdTypes](), reflect.TypeFor[numbers](),
	reflect.TypeFor[collections](), reflect.TypeFor[bytesTypes](), reflect.TypeFor[[]byte](),
	reflect.TypeFor[*[]byte](), reflect.TypeFor[blob](), reflect.TypeFor[[4]byte](), reflect.TypeFor[[]textByte](),
	reflect.TypeFor[envelope.Code](), reflect.TypeFor[control.MethodSchema](),
}

// dupNames, shadow and sameDepth repeat JSON names (made with reflect.StructOf, for
// go vet refuses them in source).
var (
	dupNames = reflect.StructOf([]reflect.StructField{
		{Name: "A", Type: reflect.TypeFor[int](), Tag: `json:"same"`},
		{Name: "B", Type: reflect.TypeFor[string](), Tag: `json:"same,omitempty"`},
		{Name: "C", Type: reflect.TypeFor[bool](), Tag: `json:"other"`},
		{Name: "D", Type: reflect.TypeFor[int](), Tag: `json:"same"`},
	})
	shadow = reflect.StructOf([]reflect.StructField{
		{Name: "Pub", Type: reflect.TypeFor[Pub](), Anonymous: true},
		{Name: "X", Type: reflect.TypeFor[string](), Tag: `json:"x"`}, // shadows Pub.X
	})
	sameDepth = reflect.StructOf([]reflect.StructField{ // Pub.X and PubB.X cancel out for Go
		{Name: "Pub", Type: reflect.TypeFor[Pub](), Anonymous: true},
		{Name: "PubB", Type: reflect.TypeFor[PubB](), Anonymous: true},
	})
)

// errorTypes have no schema.
var errorTypes = []reflect.Type{
	reflect.TypeFor[chan int](), reflect.TypeFor[func()](), reflect.TypeFor[complex64](), reflect.TypeFor[complex128](),
	reflect.TypeFor[unsafe.Pointer](), reflect.TypeFor[map[int]string](), reflect.TypeFor[map[float64]int](),
	reflect.TypeFor[[]chan int](), reflect.TypeFor[map[string]func()](), reflect.TypeFor[*complex64](),
	reflect.TypeFor[node](), reflect.TypeFor[*node](), reflect.TypeFor[list](), reflect.TypeFor[tree](),
	reflect.TypeFor[mutualA](), reflect.TypeFor[[]mutualB](), reflect.TypeFor[wrapNode](),
	reflect.TypeFor[embedTime](), reflect.TypeFor[embedRaw](), reflect.TypeFor[embedLevel](),
	reflect.TypeFor[badTag](), reflect.TypeFor[emptyTag](), reflect.TypeFor[withChan](), reflect.TypeFor[withFunc](),
	reflect.TypeFor[withComplex](), reflect.TypeFor[badMapVal](), reflect.TypeFor[intKeys](),
	reflect.TypeFor[generic[chan int]](),
}

func TestSchemaOfMatchesJSONSchemaGo(t *testing.T) {
	for _, typ := range append(append([]reflect.Type{}, projectTypes...), edgeTypes...) {
		t.Run(typ.String(), func(t *testing.T) {
			if _, err := reference(typ); err != nil {
				t.Fatalf("jsonschema-go: %v", err)
			}
			compare(t, typ)
		})
	}
}

func TestSchemaOfErrors(t *testing.T) {
	for _, typ := range errorTypes {
		t.Run(typ.String(), func(t *testing.T) {
			if _, err := reference(typ); err == nil {
				t.Fatalf("jsonschema-go accepts %v", typ)
			}
			got, err := control.SchemaOf(typ)
			var e *envelope.Error
			if err == nil || !errors.As(err, &e) || e.Code != envelope.CodeInvalidParams {
				t.Fatalf("SchemaOf(%v) = %s, %v; want an INVALID_PARAMS error", typ, got, err)
			}
		})
	}
	if _, err := control.SchemaOf(nil); envelope.CodeOf(err) != envelope.CodeInvalidParams {
		t.Errorf("SchemaOf(nil): %v", err)
	}
}

// TestSchemaForExamples pins a few outputs, also the one deliberate
// difference from jsonschema-go: []byte is the base64 string encoding/json
// writes, not an array of integers.
func TestSchemaForExamples(t *testing.T) {
	check := func(name string, got json.RawMessage, err error, want string) {
		t.Helper()
		if err != nil || string(got) != want {
			t.Errorf("%s = %s, %v; want %s", name, got, err, want)
		}
	}
	s, err := control.SchemaFor[kvPut]()
	check("kvPut", s, err, `{"type":"object","properties":{"key":{"type":"string","description":"the key"},"value":{"description":"any JSON value"}},"required":["key","value"],"additionalProperties":false}`)
	s, err = control.SchemaFor[*any]()
	check("*any", s, err, `true`)
	s, err = control.SchemaFor[*json.RawMessage]()
	check("*json.RawMessage", s, err, `{"type":["null"]}`)
	s, err = control.SchemaFor[[]byte]()
	check("[]byte", s, err, `{"type":["null","string"],"contentEncoding":"base64"}`)
	if j, _ := json.Marshal([]byte("hi")); string(j) != `"aGk="` {
		t.Errorf("encoding/json encodes []byte as %s", j)
	}
	js, _ := jsonschema.For[[]byte](nil)
	if j, _ := json.Marshal(js); string(j) != `{"type":["null","array"],"items":{"type":"integer","minimum":0,"maximum":255}}` {
		t.Errorf("jsonschema-go now says %s for []byte: revisit the difference", j)
	}
}

// randomType builds a type from r: nested pointers, slices, arrays, maps
// and structs (made with reflect.StructOf: random JSON names that
// collide, options, descriptions, embedded structs) over leaves that
// include interfaces, json.RawMessage, time.Time, byte slices and, now
// and then, a type with no schema.
func randomType(r *rand.Rand, depth int) reflect.Type {
	leaves := []reflect.Type{
		reflect.TypeFor[bool](), reflect.TypeFor[int](), reflect.TypeFor[int8](), reflect.TypeFor[uint16](),
		reflect.TypeFor[int32](), reflect.TypeFor[uint64](), reflect.TypeFor[float32](), reflect.TypeFor[string](),
		reflect.TypeFor[any](), reflect.TypeFor[json.RawMessage](), reflect.TypeFor[time.Time](),
		reflect.TypeFor[[]byte](), reflect.TypeFor[myInt](), reflect.TypeFor[inner](), reflect.TypeFor[slog.Level](),
	}
	if r.IntN(40) == 0 {
		return []reflect.Type{reflect.TypeFor[chan int](), reflect.TypeFor[complex64](), reflect.TypeFor[map[int]int]()}[r.IntN(3)]
	}
	if depth <= 0 || r.IntN(3) == 0 {
		return leaves[r.IntN(len(leaves))]
	}
	switch r.IntN(6) {
	case 0:
		return reflect.PointerTo(randomType(r, depth-1))
	case 1:
		return reflect.SliceOf(randomType(r, depth-1))
	case 2:
		return reflect.ArrayOf(r.IntN(4), randomType(r, depth-1))
	case 3:
		return reflect.MapOf(reflect.TypeFor[string](), randomType(r, depth-1))
	}
	names := []string{"a", "b", "c", "", "-", "a<b", "\xfe\u2028"}
	var fields []reflect.StructField
	for i := range r.IntN(6) {
		f := reflect.StructField{Name: fmt.Sprintf("F%d", i), Type: randomType(r, depth-1)}
		if r.IntN(6) == 0 { // embedded struct
			f.Type = []reflect.Type{reflect.TypeFor[Pub](), reflect.TypeFor[*PubB](), reflect.TypeFor[PubEmbeds](),
				reflect.TypeFor[PubInt](), reflect.TypeFor[time.Time](), reflect.TypeFor[json.RawMessage]()}[r.IntN(6)]
			f.Name, f.Anonymous = strings.TrimPrefix(f.Type.String(), "*control_test."), true
		}
		var tag []string
		if r.IntN(4) > 0 {
			opts := []string{"", ",omitempty", ",omitzero", ",string", ","}[r.IntN(5)]
			tag = append(tag, fmt.Sprintf("json:%q", names[r.IntN(len(names))]+opts))
		}
		if r.IntN(3) == 0 {
			tag = append(tag, fmt.Sprintf("jsonschema:%q", []string{"a description", "x=y", "with = sign", "", "<&>", "bad \xff byte"}[r.IntN(6)]))
		}
		f.Tag = reflect.StructTag(strings.Join(tag, " "))
		fields = append(fields, f)
	}
	return structOf(fields)
}

// structOf is reflect.StructOf, without the embedded fields it refuses.
func structOf(fields []reflect.StructField) (t reflect.Type) {
	defer func() {
		if recover() != nil {
			for i := range fields {
				if fields[i].Anonymous {
					fields[i].Name, fields[i].Anonymous = fmt.Sprintf("E%d", i), false
				}
			}
			t = reflect.StructOf(fields)
		}
	}()
	return reflect.StructOf(fields)
}

func TestSchemaOfRandomTypes(t *testing.T) {
	n := 3000
	if testing.Short() {
		n = 500
	}
	for seed := range uint64(n) {
		compare(t, randomType(rand.New(rand.NewPCG(seed, 7)), 4))
	}
}

func FuzzSchemaOf(f *testing.F) {
	for _, s := range []uint64{0, 1, 42, 1 << 40} {
		f.Add(s, uint8(3))
	}
	f.Fuzz(func(t *testing.T, seed uint64, depth uint8) {
		compare(t, randomType(rand.New(rand.NewPCG(seed, 7)), int(depth%6)))
	})
}
