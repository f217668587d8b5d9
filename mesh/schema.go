package mesh

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"sort"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/registry"
)

// MaxSchemaBytes bounds the schemas an agent declares when it registers
// (encoded): they travel in every registry record of the instance.
const MaxSchemaBytes = 64 << 10

// MethodSchema is what an agent declares about one of its methods in
// agent.register's "schemas". Params and Result are JSON Schemas (an
// object, or true/false); Errors are code names of the mesh's table
// (envelope.Codes); Roles are the roles the agent expects its callers to
// hold (the hub enforces its own role table; see SchemaMethod.Roles).
type MethodSchema struct {
	Description string          `json:"description,omitempty"`
	Params      json.RawMessage `json:"params,omitempty"`
	Result      json.RawMessage `json:"result,omitempty"`
	Errors      []string        `json:"errors,omitempty"`
	Roles       []string        `json:"roles,omitempty"`
	Idempotent  bool            `json:"idempotent,omitempty"`
}

// SchemaFor derives the JSON Schema of the Go type T as encoding/json
// encodes it (json.RawMessage and interfaces: any JSON value).
func SchemaFor[T any]() (json.RawMessage, error) {
	return schemaOf(reflect.TypeFor[T]())
}

var rawType = reflect.TypeFor[json.RawMessage]()

func schemaOf(t reflect.Type) (json.RawMessage, error) {
	if t == rawType || t.Kind() == reflect.Interface {
		return json.RawMessage(`{}`), nil
	}
	s, err := jsonschema.ForType(t, &jsonschema.ForOptions{TypeSchemas: map[reflect.Type]*jsonschema.Schema{rawType: {}}})
	if err != nil {
		return nil, err
	}
	return json.Marshal(s)
}

func mustSchema[T any]() json.RawMessage {
	s, err := SchemaFor[T]()
	if err != nil {
		panic(err)
	}
	return s
}

// encodeSchemas checks an agent's declared schemas and encodes them for
// its registration (nil when there are none).
func encodeSchemas(caps []string, schemas map[string]MethodSchema) (json.RawMessage, error) {
	if len(schemas) == 0 {
		return nil, nil
	}
	for m, s := range schemas {
		served := false
		for _, c := range caps {
			served = served || registry.Match(c, m)
		}
		if strings.Contains(m, "*") || !served {
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

// codeDescriptions describe the rows of the mesh's error-code table.
var codeDescriptions = map[envelope.Code]string{
	envelope.CodeParseError:       "The request is not valid JSON",
	envelope.CodeInvalidRequest:   "The request is not a valid request object",
	envelope.CodeMethodNotFound:   "No built-in method and no registered agent serves the method",
	envelope.CodeInvalidParams:    "Params are missing or malformed",
	envelope.CodeInternal:         "Unexpected failure in the mesh",
	envelope.CodeRPCError:         "The method's handler failed",
	envelope.CodeAgentNotFound:    "No such agent or session",
	envelope.CodeUnavailable:      "No instance reachable (link dropped, none ready, hub draining); safe to retry",
	envelope.CodeTimeout:          "The deadline passed before an answer; the call may have run",
	envelope.CodeCircuitOpen:      "The circuit breaker is open for every instance serving the method",
	envelope.CodeOverloaded:       "A bulkhead or rate limit is full; retry later",
	envelope.CodeCancelled:        "The caller cancelled the call",
	envelope.CodeUnauthenticated:  "Missing, invalid or expired credentials",
	envelope.CodePermissionDenied: "The caller's roles or token do not allow the call",
}

// ErrorCodes returns every error code of the mesh with its description.
func ErrorCodes() map[string]string {
	out := map[string]string{}
	for _, c := range envelope.Codes() {
		out[c.String()] = codeDescriptions[c]
	}
	return out
}

// builtinSchemas describe the hub's own methods.
var builtinSchemas = func() map[string]MethodSchema {
	none := json.RawMessage(`{"type":"object","additionalProperties":false}`)
	link := []string{"INVALID_PARAMS", "INVALID_REQUEST", "AGENT_NOT_FOUND", "UNAVAILABLE"}
	return map[string]MethodSchema{
		"agent.register": {Description: "Register this WebSocket link as an agent instance serving methods",
			Params: mustSchema[RegisterParams](), Result: mustSchema[RegisterResult](),
			Errors: append(link, "PERMISSION_DENIED")},
		"agent.heartbeat": {Description: "Report that the agent is alive, with its state and load",
			Params: mustSchema[HeartbeatParams](), Result: json.RawMessage(`{"type":"object","properties":{"acknowledged":{"type":"boolean"}}}`),
			Errors: link},
		"agent.deregister": {Description: "Deregister the agent before it leaves",
			Params: mustSchema[DeregisterParams](), Result: json.RawMessage(`{"type":"object","properties":{"acknowledged":{"type":"boolean"},"gracePeriod":{"type":"number"}}}`),
			Errors: link},
		"mesh.ping": {Description: "Liveness of the hub", Idempotent: true,
			Result: json.RawMessage(`{"type":"object","properties":{"pong":{"type":"boolean"},"hub":{"type":"string"},"time":{"type":"integer"}}}`)},
		"mesh.agents":   {Description: "List the registered agent instances", Params: none, Result: mustSchema[[]AgentInfo](), Errors: []string{"INVALID_PARAMS"}, Idempotent: true},
		"mesh.methods":  {Description: "List the methods served by agents, with their instances", Params: none, Result: mustSchema[[]MethodInfo](), Errors: []string{"INVALID_PARAMS"}, Idempotent: true},
		"mesh.breakers": {Description: "List the circuit breakers per (method, instance)", Params: none, Errors: []string{"INVALID_PARAMS"}, Idempotent: true},
		"mesh.schema":   {Description: "Protocol discovery: every method with its schemas, error codes and roles, and every error code", Params: none, Result: mustSchema[SchemaPayload](), Errors: []string{"INVALID_PARAMS"}, Idempotent: true},
		"schema":        {Description: "Protocol discovery (the agentick name of mesh.schema)", Params: none, Result: mustSchema[SchemaPayload](), Errors: []string{"INVALID_PARAMS"}, Idempotent: true},
		"rpc.discover":  {Description: "The mesh's methods as an OpenRPC 1.3 document", Params: none, Result: json.RawMessage(`{"type":"object","required":["openrpc","info","methods"]}`), Errors: []string{"INVALID_PARAMS"}, Idempotent: true},
	}
}()

// SchemaPayload is the answer of schema (the agentick seed's shape).
type SchemaPayload struct {
	ProtocolVersion string                  `json:"protocolVersion"`
	Methods         map[string]SchemaMethod `json:"methods"`
	Events          []SchemaEvent           `json:"events"`
	Errors          map[string]string       `json:"errors"`
}

// SchemaMethod is one method of schema. Roles are those the hub's role
// table requires (admin for the admin built-ins) when the hub
// authenticates; otherwise those the agent declared.
type SchemaMethod struct {
	Description string          `json:"description,omitempty"`
	Builtin     bool            `json:"builtin"`
	Params      json.RawMessage `json:"params,omitempty"`
	Response    json.RawMessage `json:"response,omitempty"`
	Errors      []string        `json:"errors,omitempty"`
	Roles       []string        `json:"roles,omitempty"`
	Idempotent  bool            `json:"idempotent,omitempty"`
	// Pattern marks a capability such as "memory.*": no single method.
	Pattern bool `json:"pattern,omitempty"`
	// Agents are the names of the agents serving it.
	Agents []string `json:"agents,omitempty"`
}

// SchemaEvent is an event type with its category.
type SchemaEvent struct {
	Type     string `json:"type"`
	Category string `json:"category"`
}

// chatStreamEvents are the stream events of chat agents (chat.events, and
// Multica's "stream" messages: StreamPayload {streamId, agentId, event}),
// as the Multica streaming seed names them, with their categories.
var chatStreamEvents = []SchemaEvent{
	{"message_start", "model"},
	{"message_update", "model"},
	{"message_end", "model"},
	{"tool_execution_start", "orchestration"},
	{"tool_execution_end", "orchestration"},
	{"compaction_start", "orchestration"},
	{"compaction_end", "orchestration"},
}

// agentErrors are the codes any routed call may end with, whatever the
// agent declared.
var agentErrors = []string{"METHOD_NOT_FOUND", "UNAVAILABLE", "TIMEOUT", "CIRCUIT_OPEN", "OVERLOADED", "CANCELLED", "RPC_ERROR"}

// Schema returns the mesh's contract as it stands now: the built-ins and
// every method an agent serves (the first instance, by id, that declared
// a schema for it wins).
func (h *Hub) Schema() SchemaPayload {
	out := SchemaPayload{ProtocolVersion: envelope.Version, Methods: map[string]SchemaMethod{}, Events: slices.Clone(chatStreamEvents), Errors: ErrorCodes()}
	for m := range h.builtins {
		s := builtinSchemas[m]
		out.Methods[m] = SchemaMethod{Description: s.Description, Builtin: true, Params: s.Params, Response: s.Result,
			Errors: s.Errors, Roles: h.rolesOf(m, nil), Idempotent: s.Idempotent}
	}
	for _, in := range h.reg.Snapshot().Instances() {
		var decl map[string]MethodSchema
		if len(in.Schemas) > 0 {
			_ = json.Unmarshal(in.Schemas, &decl)
		}
		add := func(m string, s MethodSchema, declared bool) {
			cur, seen := out.Methods[m]
			if seen && (cur.Builtin || cur.Params != nil || cur.Response != nil || !declared) {
				if !slices.Contains(cur.Agents, in.Name) {
					cur.Agents = append(cur.Agents, in.Name)
					out.Methods[m] = cur
				}
				return
			}
			errs := slices.Clone(s.Errors)
			for _, e := range agentErrors {
				if !slices.Contains(errs, e) {
					errs = append(errs, e)
				}
			}
			ms := SchemaMethod{Description: s.Description, Params: s.Params, Response: s.Result, Errors: errs,
				Roles: h.rolesOf(m, s.Roles), Idempotent: s.Idempotent || h.policies.For(m).Idempotent,
				Pattern: strings.HasSuffix(m, "*"), Agents: []string{in.Name}}
			if seen {
				ms.Agents = append(cur.Agents, in.Name)
				slices.Sort(ms.Agents)
				ms.Agents = slices.Compact(ms.Agents)
			}
			out.Methods[m] = ms
		}
		for m, s := range decl {
			add(m, s, true)
		}
		for _, c := range in.Capabilities {
			if _, ok := decl[c]; !ok {
				add(c, MethodSchema{}, false)
			}
		}
	}
	return out
}

// rolesOf returns the roles a call to m needs: the hub's when it
// authenticates, else those declared.
func (h *Hub) rolesOf(m string, declared []string) []string {
	if !h.guard.on() {
		return declared
	}
	if adminMethods[m] {
		return []string{auth.RoleAdmin}
	}
	if r, ok := h.guard.roles.lookup(m); ok {
		return r
	}
	return nil
}

func (h *Hub) meshSchema(ctx context.Context, _ *link.Link, raw json.RawMessage) (any, error) {
	if err := decodeParams("schema", raw, &struct{}{}); err != nil {
		return nil, err
	}
	return h.Schema(), nil
}

// OpenRPC document (https://spec.open-rpc.org, 1.3).
type openRPC struct {
	OpenRPC string          `json:"openrpc"`
	Info    openRPCInfo     `json:"info"`
	Methods []openRPCMethod `json:"methods"`
}

type openRPCInfo struct {
	Title       string `json:"title"`
	Description string `json:"description,omitempty"`
	Version     string `json:"version"`
}

type openRPCMethod struct {
	Name           string              `json:"name"`
	Description    string              `json:"description,omitempty"`
	ParamStructure string              `json:"paramStructure,omitempty"`
	Params         []openRPCDescriptor `json:"params"`
	Result         *openRPCDescriptor  `json:"result,omitempty"`
	Errors         []openRPCError      `json:"errors,omitempty"`
}

type openRPCDescriptor struct {
	Name     string          `json:"name"`
	Required bool            `json:"required,omitempty"`
	Schema   json.RawMessage `json:"schema"`
}

type openRPCError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (h *Hub) rpcDiscover(ctx context.Context, _ *link.Link, raw json.RawMessage) (any, error) {
	if err := decodeParams("rpc.discover", raw, &struct{}{}); err != nil {
		return nil, err
	}
	s := h.Schema()
	doc := openRPC{OpenRPC: "1.3.2", Info: openRPCInfo{Title: "agentmesh", Version: envelope.Version,
		Description: "The methods of an agentmesh hub: its built-ins and those of the agents registered now"}, Methods: []openRPCMethod{}}
	names := make([]string, 0, len(s.Methods))
	for m, ms := range s.Methods {
		if !ms.Pattern {
			names = append(names, m)
		}
	}
	sort.Strings(names)
	for _, m := range names {
		ms := s.Methods[m]
		om := openRPCMethod{Name: m, Description: ms.Description, ParamStructure: "by-name", Params: paramDescriptors(ms.Params)}
		res := ms.Response
		if res == nil {
			res = json.RawMessage(`{}`)
		}
		om.Result = &openRPCDescriptor{Name: "result", Schema: res}
		for _, e := range ms.Errors {
			if c, ok := envelope.ParseCode(e); ok {
				om.Errors = append(om.Errors, openRPCError{Code: c.JSONRPC(), Message: e})
			}
		}
		doc.Methods = append(doc.Methods, om)
	}
	return doc, nil
}

// paramDescriptors turns an object schema into OpenRPC by-name params,
// one per property; a schema without properties (or with definitions its
// properties refer to) becomes an empty list.
func paramDescriptors(schema json.RawMessage) []openRPCDescriptor {
	out := []openRPCDescriptor{}
	var s struct {
		Properties map[string]json.RawMessage `json:"properties"`
		Required   []string                   `json:"required"`
		Defs       json.RawMessage            `json:"$defs"`
	}
	if len(schema) == 0 || json.Unmarshal(schema, &s) != nil || s.Defs != nil {
		return out
	}
	for name, ps := range s.Properties {
		out = append(out, openRPCDescriptor{Name: name, Required: slices.Contains(s.Required, name), Schema: ps})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
