// Package envelope owns the wire of agentmesh: the Request and Response
// envelopes, the closed table of error codes, the Headers that carry trace
// context and deadlines, the Invoker/Middleware call shape, and the dialect
// codecs with their size and depth limits: the native envelope frames,
// JSON-RPC 2.0, and the edge surfaces' own shapes (agentick frames,
// Multica messages, OpenAI chat-completions bodies; see dialect.go), all
// on one scanner: one pass, keys matched exactly, a key given twice
// refused.
//
// It does no I/O and imports no other package of the project: every other
// package builds on it. params, result and ids travel as raw JSON and are
// never decoded here (SetCheckedMember walks the top level of params only,
// to add one member).
package envelope
