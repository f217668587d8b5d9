package control_test

import (
	"encoding/json"
	"errors"
	"regexp"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
)

type nested struct {
	Deep int `json:"deep"`
}

type sample struct {
	Key   string    `json:"key"`
	N     *int      `json:"n"`
	U     uint      `json:"u"`
	Small int8      `json:"small"`
	When  time.Time `json:"when"`
	List  []string  `json:"list"`
	Inner nested    `json:"inner"`
	Flag  bool      `json:"flag"`
	Own   own       `json:"own"`
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
var goInternals = regexp.MustCompile(`Go (struct|value)|control_test|sample|nested|\*int|\[\]string|json: `)

// TestParamsError: a decoding error of a method's params is said in the
// caller's terms, naming the field and the JSON type it must be, with
// Go's type and struct names nowhere, lenient decoding (json.Unmarshal,
// as the agents do) and strict (DecodeParams) alike.
func TestParamsError(t *testing.T) {
	for _, c := range []struct{ params, want string }{
		{`{"key":5}`, `m: field "key" must be a string, not number`},
		{`{"n":"x"}`, `m: field "n" must be an integer, not string`},
		{`{"list":{}}`, `m: field "list" must be an array, not object`},
		{`{"inner":{"deep":"x"}}`, `m: field "inner.deep" must be an integer, not string`},
		{`{"flag":1}`, `m: field "flag" must be a boolean, not number`},
		{`[1]`, `m: params must be an object, not array`},
		{`{"key":`, `m: params are not valid JSON (at byte 7)`},
		{`{"key" 1}`, `m: params are not valid JSON (at byte 8)`},
		{`{"own":"no"}`, `m: own must be "ok"`},
		{`{"n":1.5}`, `m: field "n" must be an integer, not 1.5`},
		{`{"u":-1}`, `m: field "u" must be a non-negative integer, not -1`},
		{`{"small":300}`, `m: field "small" must be an integer from -128 to 127, not 300`},
		{`{"when":5}`, `m: input is not a JSON string`},
	} {
		var v sample
		err := control.ParamsError("m", json.Unmarshal([]byte(c.params), &v))
		if err.Code != envelope.CodeInvalidParams || err.Message != c.want {
			t.Errorf("%s: %v; want INVALID_PARAMS %q", c.params, err, c.want)
		}
		if goInternals.MatchString(err.Message) {
			t.Errorf("%s: %q speaks of Go's types", c.params, err.Message)
		}
	}
	var v sample
	if err := control.DecodeParams("m", json.RawMessage(`{"other":1}`), &v); err == nil || err.Error() != `INVALID_PARAMS: m: unknown field "other"` {
		t.Errorf("strict decoding of an unknown field: %v", err)
	}
	if err := control.DecodeParams("m", json.RawMessage(`{"key":`), &v); err == nil || err.Error() != `INVALID_PARAMS: m: params end too soon` {
		t.Errorf("strict decoding of truncated params: %v", err)
	}
}
