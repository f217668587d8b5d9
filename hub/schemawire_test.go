package hub_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/agents/chat"
	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
)

// wireSamples are calls that succeed, in order (a session is created
// before it is used, destroyed last), one or more per method the demo's
// agents serve.
var wireSamples = []struct{ method, params string }{
	{"echo.echo", `{"hello":"wire"}`},
	{"echo.sleep", `{"ms":1}`},
	{"echo.stream", `{"n":2}`},
	{"memory.put", `{"key":"k","value":{"n":1}}`},
	{"memory.get", `{"key":"k"}`},
	{"memory.get", `{"key":"absent"}`},
	{"memory.query", `{"prefix":"k"}`},
	{"memory.delete", `{"key":"k"}`},
	{"chat.create", `{"agentId":"w1"}`},
	{"chat.create_agent", `{"agent_id":"w2"}`},
	{"chat.list", `{}`},
	{"chat.list_agents", `{}`},
	{"chat.send", `{"agentId":"w1","content":"hello"}`},
	{"chat.send", `{"agentId":"w1","content":"/long 3"}`},
	{"chat.getAgentMessages", `{"agentId":"w1"}`},
	{"chat.events", `{"agentId":"w1","after_seq":0,"wait_ms":0}`},
	{"chat.get_tokens", `{"agentId":"w1"}`},
	{"chat.get_context", `{"agentId":"w1"}`},
	{"chat.cancel", `{"agentId":"w1","request_id":"none"}`},
	{"chat.reset", `{"agentId":"w1"}`},
	{"chat.shutdown", `{"agentId":"w2"}`},
	{"chat.destroy_agent", `{"agent_id":"w2"}`},
	{"chat.destroy", `{"agentId":"w1"}`},
}

// TestResultsMatchDeclaredSchemas: every method the demo's agents serve
// (echo, kv, chat) declares a result schema, and the real results of
// calling it validate against that schema (github.com/google/jsonschema-go,
// the MCP SDK's validator): a declared schema cannot drift from the wire
// again (chat.getAgentMessages declared content blocks by the Go field
// names, {Type, Text, ...} all required, while the wire is {"type":"text",
// "text": ...}; the MCP SDK threw on its successful results). A method
// without a sample call here fails the test.
func TestResultsMatchDeclaredSchemas(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	rt := chat.NewRuntime(chat.Config{DataDir: t.TempDir()}, &chat.Scripted{}, nil)
	t.Cleanup(func() { rt.Close(context.Background()) })
	m.RunAgent(t, agents.NewEcho())
	m.RunAgent(t, agents.NewKV())
	m.RunAgent(t, chat.NewService(rt))
	cl := m.Client(t, mesh.WithoutReliability())
	var s control.SchemaPayload
	if err := cl.Call(t.Context(), "schema", nil, &s); err != nil {
		t.Fatal(err)
	}
	resolved := map[string]*jsonschema.Resolved{}
	for name, mm := range s.Methods {
		if mm.Builtin {
			continue
		}
		if len(mm.Response) == 0 {
			t.Errorf("%s declares no result schema", name)
			continue
		}
		var sch jsonschema.Schema
		if err := json.Unmarshal(mm.Response, &sch); err != nil {
			t.Errorf("%s: its result schema does not parse: %v", name, err)
			continue
		}
		r, err := sch.Resolve(nil)
		if err != nil {
			t.Errorf("%s: its result schema does not resolve: %v", name, err)
			continue
		}
		resolved[name] = r
		if !slices.ContainsFunc(wireSamples, func(c struct{ method, params string }) bool { return c.method == name }) {
			t.Errorf("%s declares a result schema but has no sample call in wireSamples: add one", name)
		}
	}
	for _, c := range wireSamples {
		r := resolved[c.method]
		if r == nil {
			t.Errorf("sample %s: no such method with a result schema", c.method)
			continue
		}
		raw, err := wireResult(t, cl, s.Methods[c.method].Streaming, c.method, c.params)
		if err != nil {
			t.Errorf("sample %s %s: %v; want a result to check", c.method, c.params, err)
			continue
		}
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatalf("%s: result %s: %v", c.method, raw, err)
		}
		if err := r.Validate(v); err != nil {
			t.Errorf("%s %s: the result does not match the declared schema: %v\nresult: %.400s\nschema: %.600s", c.method, c.params, err, raw, s.Methods[c.method].Response)
		}
	}
}

// wireResult calls method with params, as a stream when it is declared
// streaming (its chunks read and dropped), and returns its result.
func wireResult(t *testing.T, cl *mesh.Client, streaming bool, method, params string) (json.RawMessage, error) {
	if !streaming {
		var raw json.RawMessage
		err := cl.Call(t.Context(), method, json.RawMessage(params), &raw)
		return raw, err
	}
	st, err := cl.Stream(t.Context(), method, json.RawMessage(params))
	if err != nil {
		return nil, err
	}
	defer st.Close()
	for _, err := range st.All() {
		if err != nil {
			return nil, err
		}
	}
	return st.Result().Result, nil
}
