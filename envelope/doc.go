// Package envelope owns the wire of agentmesh: the Request and Response
// envelopes, the closed table of error codes, the Headers that carry trace
// context and deadlines, the Invoker/Middleware call shape, and the dialect
// codecs (the native envelope frames and JSON-RPC 2.0) with their size and
// depth limits.
//
// It does no I/O and imports no other package of the project: every other
// package builds on it. params, result and ids travel as raw JSON and are
// never decoded here.
package envelope
