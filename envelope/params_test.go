package envelope_test

import (
	"encoding/json"
	"errors"
	"regexp"
	"testing"

	"github.com/agentmesh/agentmesh/envelope"
)

type nested struct {
	Deep int `json:"deep"`
}

type sample struct {
	Key   string   `json:"key"`
	N     *int     `json:"n"`
	List  []string `json:"list"`
	Inner nested   `json:"inner"`
	Flag  bool     `json:"flag"`
	Own   own      `json:"own"`
}

// own refuses anything but "ok", in its own words.
type own struct{}

func (*own) UnmarshalJSON(b []byte) error {
	if string(b) != `"ok"` {
		return errors.New(`own must be "ok"`)
	}
	return nil
}

// goInternals matches what encoding/json says in Go's terms: a Go type
// or struct name, never to reach a caller.
var goInternals = regexp.MustCompile(`Go (struct|value)|envelope_test|sample|nested|\*int|\[\]string|json: `)

// TestParamsError: a decoding error of a method's params is said in the
// caller's terms, naming the field and the JSON type it must be, with
// Go's type and struct names nowhere, lenient decoding (json.Unmarshal,
// as the agents do) and strict (DecodeParams) alike.
func TestParamsError(t *testing.T) {
	for _, c := range []struct{ params, want string }{
		{`{"key":5}`, `m: field "key" must be a string, not number`},
		{`{"n":"x"}`, `m: field "n" must be a number, not string`},
		{`{"list":{}}`, `m: field "list" must be an array, not object`},
		{`{"inner":{"deep":"x"}}`, `m: field "inner.deep" must be a number, not string`},
		{`{"flag":1}`, `m: field "flag" must be a boolean, not number`},
		{`[1]`, `m: params must be an object, not array`},
		{`{"key":`, `m: params are not valid JSON (at byte 7)`},
		{`{"key" 1}`, `m: params are not valid JSON (at byte 8)`},
		{`{"own":"no"}`, `m: own must be "ok"`},
	} {
		var v sample
		err := envelope.ParamsError("m", json.Unmarshal([]byte(c.params), &v))
		if err.Code != envelope.CodeInvalidParams || err.Message != c.want {
			t.Errorf("%s: %v; want INVALID_PARAMS %q", c.params, err, c.want)
		}
		if goInternals.MatchString(err.Message) {
			t.Errorf("%s: %q speaks of Go's types", c.params, err.Message)
		}
	}
	var v sample
	if err := envelope.DecodeParams("m", json.RawMessage(`{"other":1}`), &v); err == nil || err.Error() != `INVALID_PARAMS: m: unknown field "other"` {
		t.Errorf("strict decoding of an unknown field: %v", err)
	}
	if err := envelope.DecodeParams("m", json.RawMessage(`{"key":`), &v); err == nil || err.Error() != `INVALID_PARAMS: m: params end too soon` {
		t.Errorf("strict decoding of truncated params: %v", err)
	}
}
