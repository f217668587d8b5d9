// Package openrpc renders the mesh's contract as an OpenRPC 1.3
// document (rpc.discover).
package openrpc

import (
	"encoding/json"
	"slices"
	"sort"

	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/stream"
)

// OpenRPC document (https://spec.open-rpc.org, 1.3).
// Document is an OpenRPC document.
type Document struct {
	OpenRPC string   `json:"openrpc"`
	Info    Info     `json:"info"`
	Methods []Method `json:"methods"`
}

// Info is its info object.
type Info struct {
	Title       string `json:"title"`
	Description string `json:"description,omitempty"`
	Version     string `json:"version"`
}

// Method is one method.
type Method struct {
	Name           string       `json:"name"`
	Description    string       `json:"description,omitempty"`
	ParamStructure string       `json:"paramStructure,omitempty"`
	Params         []Descriptor `json:"params"`
	Result         *Descriptor  `json:"result,omitempty"`
	Errors         []Error      `json:"errors,omitempty"`
	// Stream, on a streaming method (a specification extension), says
	// how its chunks reach a JSON-RPC caller before its result.
	Stream *Stream `json:"x-agentmesh-stream,omitempty"`
}

// Stream is the x-agentmesh-stream extension of a streaming method.
type Stream struct {
	// Notification is the method of the notifications that carry the
	// chunks on a WebSocket, tied to the call by params.id.
	Notification string          `json:"notification"`
	Params       json.RawMessage `json:"params"` // their params' JSON Schema
	// SSE says how to read the stream over HTTP.
	SSE string `json:"sse"`
}

// streamSpec is every streaming method's Stream.
var streamSpec = &Stream{
	Notification: stream.ChunkMethod,
	Params: json.RawMessage(`{"type":"object","required":["id","n","data"],"properties":{` +
		`"id":{"description":"the id of the call the chunk belongs to"},` +
		`"n":{"type":"integer","minimum":1,"description":"the chunk's sequence number, from 1"},` +
		`"data":{"description":"the chunk"}}}`),
	SSE: "POST /rpc with Accept: text/event-stream: an event chunk per chunk (id: its sequence number, data: the chunk), then an event end whose data is the JSON-RPC response",
}

// Descriptor is a content descriptor.
type Descriptor struct {
	Name     string          `json:"name"`
	Required bool            `json:"required,omitempty"`
	Schema   json.RawMessage `json:"schema"`
}

// Error is an error a method may answer.
type Error struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// FromSchema is the OpenRPC 1.3 document of the mesh's contract s (the
// answer of rpc.discover): every method that is not a pattern, by name,
// with its params (by-name, one per property of an object schema), result
// and error codes.
func FromSchema(s control.SchemaPayload) Document {
	doc := Document{OpenRPC: "1.3.2", Info: Info{Title: "agentmesh", Version: envelope.Version,
		Description: "The methods of an agentmesh hub: its built-ins and those of the agents registered now"}, Methods: []Method{}}
	names := make([]string, 0, len(s.Methods))
	for m, ms := range s.Methods {
		if !ms.Pattern {
			names = append(names, m)
		}
	}
	sort.Strings(names)
	for _, m := range names {
		ms := s.Methods[m]
		om := Method{Name: m, Description: ms.Description, ParamStructure: "by-name", Params: paramDescriptors(ms.Params)}
		res := ms.Response
		if res == nil {
			res = json.RawMessage(`{}`)
		}
		om.Result = &Descriptor{Name: "result", Schema: res}
		if ms.Streaming {
			om.Stream = streamSpec
		}
		for _, e := range ms.Errors {
			if c, ok := envelope.ParseCode(e); ok {
				om.Errors = append(om.Errors, Error{Code: c.JSONRPC(), Message: e})
			}
		}
		doc.Methods = append(doc.Methods, om)
	}
	return doc
}

// paramDescriptors turns an object schema into OpenRPC by-name params,
// one per property; a schema without properties (or with definitions its
// properties refer to) becomes an empty list.
func paramDescriptors(schema json.RawMessage) []Descriptor {
	out := []Descriptor{}
	var s struct {
		Properties map[string]json.RawMessage `json:"properties"`
		Required   []string                   `json:"required"`
		Defs       json.RawMessage            `json:"$defs"`
	}
	if len(schema) == 0 || json.Unmarshal(schema, &s) != nil || s.Defs != nil {
		return out
	}
	for name, ps := range s.Properties {
		out = append(out, Descriptor{Name: name, Required: slices.Contains(s.Required, name), Schema: ps})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
