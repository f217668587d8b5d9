package hub_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/agents/chat"
	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/registry/etcd"
	"github.com/agentmesh/agentmesh/registry/etcd/etcdtest"
)

type addParams struct {
	A int `json:"a" jsonschema:"first term"`
	B int `json:"b" jsonschema:"second term"`
}

type addResult struct {
	Sum int `json:"sum"`
}

// calcAgent serves calc.add through HandleTyped: its schema is derived
// from addParams and addResult.
func calcAgent(opts ...agents.Option) *agents.Agent {
	a := agents.New("calc", opts...)
	agents.HandleTyped(a, "calc.add", "Add two integers", func(ctx context.Context, p addParams) (addResult, error) {
		return addResult{Sum: p.A + p.B}, nil
	}, agents.Errors(envelope.CodeInvalidParams), agents.Roles("analyst"), agents.Idempotent())
	return a
}

func parseSchema(t *testing.T, what string, raw json.RawMessage) testkit.JSONSchema {
	t.Helper()
	var s testkit.JSONSchema
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatalf("%s: schema %s: %v", what, raw, err)
	}
	return s
}

// TestSchemaDiscovery: schema (and mesh.schema) over /ws and /rpc list the
// built-ins and every agent's methods with the schemas the agents
// declared (by hand for echo.echo, derived from Go types by HandleTyped
// for echo.sleep and calc.add), their error codes and roles, and every
// error code of the mesh with its description; rpc.discover answers an
// OpenRPC document built from the same data.
func TestSchemaDiscovery(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	m.RunAgent(t, agents.NewEcho())
	m.RunAgent(t, agents.NewKV())
	m.RunAgent(t, calcAgent())
	for name, c := range map[string]*mesh.Client{"ws": m.Client(t), "http": m.HTTPClient(t)} {
		t.Run(name, func(t *testing.T) {
			for _, method := range []string{"schema", "mesh.schema"} {
				var s control.SchemaPayload
				if err := c.Call(t.Context(), method, nil, &s); err != nil {
					t.Fatalf("%s: %v", method, err)
				}
				if s.ProtocolVersion != envelope.Version {
					t.Errorf("%s: protocolVersion %q", method, s.ProtocolVersion)
				}
				if len(s.Errors) != len(envelope.Codes()) {
					t.Errorf("%s: %d error codes, want %d", method, len(s.Errors), len(envelope.Codes()))
				}
				for _, code := range envelope.Codes() {
					if s.Errors[code.String()] == "" {
						t.Errorf("%s: error code %s has no description", method, code)
					}
				}
				for _, b := range []string{"agent.register", "mesh.ping", "mesh.agents", "schema", "rpc.discover"} {
					if mm, ok := s.Methods[b]; !ok || !mm.Builtin || mm.Description == "" {
						t.Errorf("%s: built-in %s = %+v, %v; want a described built-in", method, b, mm, ok)
					}
				}
				reg := parseSchema(t, "agent.register params", s.Methods["agent.register"].Params)
				if reg.Properties["capabilities"] == nil || !slices.Contains(reg.Required, "capabilities") {
					t.Errorf("%s: agent.register params %+v; want capabilities required", method, reg)
				}
				sleep := s.Methods["echo.sleep"]
				sp := parseSchema(t, "echo.sleep params", sleep.Params)
				sr := parseSchema(t, "echo.sleep response", sleep.Response)
				if sleep.Builtin || sp.Type != "object" || sp.Properties["ms"] == nil || len(sp.Required) != 0 ||
					!slices.Equal(sr.Required, []string{"slept"}) || !sleep.Idempotent {
					t.Errorf("%s: echo.sleep = %+v; want params {ms?} and response {slept}, idempotent", method, sleep)
				}
				for _, e := range []string{"INVALID_PARAMS", "TIMEOUT", "UNAVAILABLE", "METHOD_NOT_FOUND"} {
					if !slices.Contains(sleep.Errors, e) {
						t.Errorf("%s: echo.sleep errors %v lack %s", method, sleep.Errors, e)
					}
				}
				if !slices.Equal(sleep.Agents, []string{"echo"}) {
					t.Errorf("%s: echo.sleep agents %v", method, sleep.Agents)
				}
				if e := s.Methods["echo.echo"]; e.Description == "" || string(e.Params) != "{}" {
					t.Errorf("%s: echo.echo = %+v; want its declared any-value schema", method, e)
				}
				add := s.Methods["calc.add"]
				ap := parseSchema(t, "calc.add params", add.Params)
				ar := parseSchema(t, "calc.add response", add.Response)
				if add.Description != "Add two integers" || !slices.Equal(ap.Required, []string{"a", "b"}) ||
					!strings.Contains(string(ap.Properties["a"]), `"integer"`) || ar.Properties["sum"] == nil ||
					!slices.Equal(add.Roles, []string{"analyst"}) {
					t.Errorf("%s: calc.add = %+v (params %s); want the schema derived from addParams/addResult, roles [analyst]", method, add, add.Params)
				}
				get := parseSchema(t, "memory.get params", s.Methods["memory.get"].Params)
				if !slices.Equal(get.Required, []string{"key"}) {
					t.Errorf("%s: memory.get params %+v; want key required", method, get)
				}
			}

			var doc struct {
				OpenRPC string `json:"openrpc"`
				Info    struct {
					Title, Version string
				} `json:"info"`
				Methods []struct {
					Name   string `json:"name"`
					Params []struct {
						Name     string          `json:"name"`
						Required bool            `json:"required"`
						Schema   json.RawMessage `json:"schema"`
					} `json:"params"`
					Result *struct {
						Name   string          `json:"name"`
						Schema json.RawMessage `json:"schema"`
					} `json:"result"`
					Errors []struct {
						Code    int    `json:"code"`
						Message string `json:"message"`
					} `json:"errors"`
				} `json:"methods"`
			}
			if err := c.Call(t.Context(), "rpc.discover", nil, &doc); err != nil {
				t.Fatalf("rpc.discover: %v", err)
			}
			if !strings.HasPrefix(doc.OpenRPC, "1.3") || doc.Info.Title == "" || doc.Info.Version == "" {
				t.Errorf("rpc.discover: openrpc %q info %+v", doc.OpenRPC, doc.Info)
			}
			found := 0
			for _, dm := range doc.Methods {
				switch dm.Name {
				case "calc.add":
					found++
					if len(dm.Params) != 2 || dm.Params[0].Name != "a" || !dm.Params[0].Required || dm.Params[1].Name != "b" ||
						dm.Result == nil || !strings.Contains(string(dm.Result.Schema), `"sum"`) {
						t.Errorf("rpc.discover calc.add = %+v", dm)
					}
					if !slices.ContainsFunc(dm.Errors, func(e struct {
						Code    int    `json:"code"`
						Message string `json:"message"`
					}) bool {
						return e.Code == -32602 && e.Message == "INVALID_PARAMS"
					}) {
						t.Errorf("rpc.discover calc.add errors %+v lack -32602 INVALID_PARAMS", dm.Errors)
					}
				case "rpc.discover", "echo.sleep", "memory.put", "mesh.ping":
					found++
				}
			}
			if found != 5 {
				t.Errorf("rpc.discover lists %d of calc.add, rpc.discover, echo.sleep, memory.put, mesh.ping; want 5", found)
			}
		})
	}
	// A typed handler decodes its params: a wrong type is INVALID_PARAMS.
	c := m.Client(t)
	var sum addResult
	if err := c.Call(t.Context(), "calc.add", addParams{A: 2, B: 40}, &sum); err != nil || sum.Sum != 42 {
		t.Errorf("calc.add {2, 40} = %+v, %v; want 42", sum, err)
	}
	testkit.WantCode(t, "calc.add with a string", c.Call(t.Context(), "calc.add", map[string]any{"a": "x"}, nil), envelope.CodeInvalidParams)
}

// TestSchemaRPCLiteral: rpc.discover and schema as a plain JSON-RPC
// client sends them over POST /rpc.
func TestSchemaRPCLiteral(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	m.RunAgent(t, agents.NewEcho())
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"rpc.discover"}`,
		`{"jsonrpc":"2.0","id":2,"method":"schema","params":{}}`,
	} {
		res, err := http.Post(m.HTTP+"/rpc", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(res.Body)
		res.Body.Close()
		var out struct {
			Result map[string]json.RawMessage `json:"result"`
			Error  json.RawMessage            `json:"error"`
		}
		if err := json.Unmarshal(data, &out); err != nil || out.Error != nil || res.StatusCode != 200 {
			t.Fatalf("POST /rpc %s: %d %s", body, res.StatusCode, data)
		}
		if !bytes.Contains(out.Result["methods"], []byte(`"echo.sleep"`)) {
			t.Errorf("POST /rpc %s: methods lack echo.sleep: %.300s", body, out.Result["methods"])
		}
	}
	res, err := http.Post(m.HTTP+"/rpc", "application/json", strings.NewReader(`{"jsonrpc":"2.0","id":3,"method":"schema","params":{"x":1}}`))
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !bytes.Contains(data, []byte(`-32602`)) {
		t.Errorf("schema with an unknown param = %s; want INVALID_PARAMS", data)
	}
}

// TestRegisterSchemasChecked: agent.register refuses schemas over 64 KiB,
// for a method the agent does not serve, with a schema that is not one,
// or with an error code the mesh does not have, with INVALID_PARAMS.
func TestRegisterSchemasChecked(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	l, err := link.Dial(t.Context(), m.WS, link.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	register := func(schemas map[string]control.MethodSchema) error {
		raw, _ := json.Marshal(control.RegisterParams{Capabilities: []string{"x.*", "y.y"}, Schemas: schemas})
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		_, err := l.Call(ctx, &envelope.Request{ID: envelope.NewID(), Method: "agent.register", Params: raw, Timestamp: time.Now().UnixMilli(), Version: envelope.Version})
		return err
	}
	big := json.RawMessage(`{"description":"` + strings.Repeat("a", control.MaxSchemaBytes) + `"}`)
	for what, s := range map[string]map[string]control.MethodSchema{
		"over 64 KiB":        {"x.a": {Params: big}},
		"not served":         {"z.z": {Description: "d"}},
		"a pattern":          {"x.*": {Description: "d"}},
		"params not schema":  {"y.y": {Params: json.RawMessage(`"string"`)}},
		"unknown error code": {"y.y": {Errors: []string{"NOT_A_CODE"}}},
	} {
		testkit.WantCode(t, "register with schemas "+what, register(s), envelope.CodeInvalidParams)
	}
	if err := register(map[string]control.MethodSchema{"x.a": {Description: "a method under x.*", Params: json.RawMessage(`{"type":"object"}`)}}); err != nil {
		t.Fatalf("register with a valid schema: %v", err)
	}
}

// TestSchemaOverEtcd: the schemas an agent declares on hub A travel in
// its etcd registry record: hub B's schema and rpc.discover show them.
func TestSchemaOverEtcd(t *testing.T) {
	srv := etcdtest.Start(t)
	var hubs []*meshtest.Mesh
	for _, name := range []string{"A", "B"} {
		reg, err := etcd.New(etcd.Config{Endpoints: []string{srv.Endpoint}, Prefix: "/schema/"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		hubs = append(hubs, meshtest.StartCluster(t, hub.Config{ID: "hub-" + name}, reg))
	}
	hubs[0].RunAgent(t, calcAgent(agents.WithID("calc-on-a")))
	b := hubs[1]
	meshtest.WaitFor(t, 5*time.Second, func() bool { return b.Hub.Registry().Snapshot().Instance("calc-on-a") != nil })
	if got := b.Hub.Registry().Snapshot().Instance("calc-on-a").Schemas; !bytes.Contains(got, []byte(`"calc.add"`)) {
		t.Fatalf("hub B's record of calc-on-a has schemas %s; want calc.add's", got)
	}
	var s control.SchemaPayload
	if err := b.Client(t).Call(t.Context(), "schema", nil, &s); err != nil {
		t.Fatal(err)
	}
	add := s.Methods["calc.add"]
	if p := parseSchema(t, "calc.add params on B", add.Params); add.Description != "Add two integers" || !slices.Equal(p.Required, []string{"a", "b"}) {
		t.Errorf("schema on hub B: calc.add = %+v; want the schema declared on A", add)
	}
	var sum addResult
	if err := b.Client(t).Call(t.Context(), "calc.add", addParams{A: 1, B: 2}, &sum); err != nil || sum.Sum != 3 {
		t.Errorf("calc.add through B = %+v, %v", sum, err)
	}
}

// TestAgentSchemasRefusedStillRegisters: an agent whose schemas the hub
// refuses (over 64 KiB) registers without them and serves.
func TestAgentSchemasRefusedStillRegisters(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	a := agents.NewEcho()
	a.SetSchema("echo.echo", control.MethodSchema{Description: strings.Repeat("x", control.MaxSchemaBytes)})
	m.RunAgent(t, a)
	var got string
	if err := m.Client(t).Call(t.Context(), "echo.echo", "still here", &got); err != nil || got != "still here" {
		t.Fatalf("echo.echo = %q, %v", got, err)
	}
	var s control.SchemaPayload
	if err := m.Client(t).Call(t.Context(), "schema", nil, &s); err != nil {
		t.Fatal(err)
	}
	if e, ok := s.Methods["echo.echo"]; !ok || e.Description != "" || e.Params != nil {
		t.Errorf("schema: echo.echo = %+v, %v; want listed without the refused schema", e, ok)
	}
}

// TestChatSchemas: the chat agent declares the schema of every method it
// serves (chat.send needs content; its response has content and
// request_id), and the schema lists the stream events with categories.
func TestChatSchemas(t *testing.T) {
	m := meshtest.Start(t, hub.Config{})
	rt := chat.NewRuntime(chat.Config{DataDir: t.TempDir()}, &chat.Scripted{}, nil)
	t.Cleanup(func() { rt.Close(context.Background()) })
	m.RunAgent(t, chat.NewService(rt))
	var s control.SchemaPayload
	if err := m.Client(t).Call(t.Context(), "schema", nil, &s); err != nil {
		t.Fatal(err)
	}
	n := 0
	for name, mm := range s.Methods {
		if !strings.HasPrefix(name, "chat.") {
			continue
		}
		n++
		if mm.Description == "" || len(mm.Params) == 0 || len(mm.Response) == 0 {
			t.Errorf("%s: %+v; want a description, params and response", name, mm)
		}
	}
	if n < 13 {
		t.Errorf("%d chat methods in the schema; want the 13 the agent serves", n)
	}
	send := s.Methods["chat.send"]
	p, r := parseSchema(t, "chat.send params", send.Params), parseSchema(t, "chat.send response", send.Response)
	if p.Properties["content"] == nil || p.Properties["agentId"] == nil || !slices.Equal(p.Required, []string{"content"}) ||
		r.Properties["content"] == nil || r.Properties["request_id"] == nil || !slices.Contains(send.Errors, "AGENT_NOT_FOUND") {
		t.Errorf("chat.send = %+v; want params {agentId, content required, request_id?}, response {content, request_id}", send)
	}
	cats := map[string]string{}
	for _, e := range s.Events {
		cats[e.Type] = e.Category
	}
	for _, ev := range []string{"message_start", "message_update", "message_end", "tool_execution_start", "tool_execution_end", "compaction_start", "compaction_end"} {
		if cats[ev] == "" {
			t.Errorf("event %s not in the schema (events %v)", ev, s.Events)
		}
	}
	// OpenRPC carries the params too.
	var doc struct {
		Methods []struct {
			Name   string            `json:"name"`
			Params []json.RawMessage `json:"params"`
		} `json:"methods"`
	}
	if err := m.Client(t).Call(t.Context(), "rpc.discover", nil, &doc); err != nil {
		t.Fatal(err)
	}
	for _, mm := range doc.Methods {
		if mm.Name == "chat.send" && len(mm.Params) < 2 {
			t.Errorf("rpc.discover chat.send params %s; want agentId, content, request_id", mm.Params)
		}
	}
}
