package envelope

// The strict scanner, for the decoders of the protocol surfaces (the
// dialect codecs: agentick frames, OpenAI bodies, ...). A decoder checks
// a message once (Limits.Check: size, depth, UTF-8, valid JSON; every function here
// expects data that passed it), then
// walks it in the same way the native and JSON-RPC codecs do: keys
// matched exactly, a key given twice refused, values kept as raw bytes.

// Normalized returns l with the defaults in place of zero fields.
func (l Limits) Normalized() Limits { return l.norm() }

// EachMember calls fn for each member of the JSON object obj, in order;
// a key given twice is INVALID_REQUEST. An error from fn stops the walk.
func EachMember(obj []byte, fn func(key string, val []byte) *Error) *Error {
	return eachMember(obj, fn)
}

// EachElement calls fn for each element of the JSON array arr.
func EachElement(arr []byte, fn func(val []byte)) { eachElement(arr, fn) }

// KindOf returns the kind of the JSON value v by its first byte: '{',
// '[', '"', 'n' (null), 't' or 'f' (booleans), '0' (a number), or 0 when
// v is empty.
func KindOf(v []byte) byte { return kindOf(v) }

// TrimValue returns v without surrounding white space.
func TrimValue(v []byte) []byte { return trimValue(v) }

// SkipSpace returns the index of the first byte of data at or after i
// that is not JSON white space.
func SkipSpace(data []byte, i int) int { return skipSpace(data, i) }

// Unquote decodes the JSON string token tok.
func Unquote(tok []byte) (string, bool) { return unquote(tok) }

// InternToken is Unquote, interning a string without escapes (for
// values from a small set, such as roles or types).
func InternToken(tok []byte) (string, bool) { return internToken(tok) }

// StringField decodes the member name's value v as a string
// (INVALID_REQUEST naming name if it is not one).
func StringField(name string, v []byte) (string, *Error) { return stringField(name, v) }

// IntField decodes the member name's value v as an integer within
// [min, max] (INVALID_REQUEST naming name if it is not one).
func IntField(name string, v []byte, min, max int64) (int64, *Error) {
	return intField(name, v, min, max)
}

// RecoverStrings finds, in the head of a message refused as a whole, the
// string values of the top-level members named keys (see
// recoverStrings), so that the refusal can be answered to its request.
func RecoverStrings(head []byte, keys ...string) (vals []string, found []bool) {
	return recoverStrings(head, keys...)
}

// Missingf is a refusal for a required member that is absent: code c,
// ErrMissing its cause.
func Missingf(c Code, format string, args ...any) *Error { return missingf(c, format, args...) }
