// Package agents is the agent SDK: an Agent serves handlers over a hub
// link, registers, heartbeats at the interval the hub assigns, reconnects
// with backoff and registers again, and deregisters on shutdown. It also
// holds the built-in agents (echo, kv, chaos).
//
// It reaches into no hub internals: everything goes over the wire.
package agents
