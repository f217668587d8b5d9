// Package control is the mesh's control-plane contract: the params and
// results of agent.register, agent.heartbeat and agent.deregister, the
// answers of the hub's mesh.* built-ins, and the schema an agent declares
// for its methods. The agent SDK and the hub both import it; it holds no
// logic beyond deriving a JSON Schema from a Go type (SchemaFor), and
// imports nothing of the project but envelope.
package control
