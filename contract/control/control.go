package control

import (
	"encoding/json"
	"time"
)

// RegisterParams are the params of agent.register (the kOS seed's
// handshake). AgentID and Name are extensions: an agent may propose its id
// (kept across reconnects) and its logical name.
type RegisterParams struct {
	AgentID      string          `json:"agentId,omitempty"`
	Name         string          `json:"name,omitempty"`
	Capabilities []string        `json:"capabilities"`
	Intents      []string        `json:"intents,omitempty"`
	Metadata     json.RawMessage `json:"metadata,omitempty"`
	ContractHash string          `json:"contractHash,omitempty"`
	// Schemas describes the agent's methods (exact names it serves):
	// description, params and result JSON Schema, error codes, roles. At
	// most MaxSchemaBytes encoded.
	Schemas map[string]MethodSchema `json:"schemas,omitempty"`
}

// RegisterResult is the answer to agent.register. HeartbeatInterval is in
// seconds, as the seed says (fractions allowed).
type RegisterResult struct {
	AgentID              string   `json:"agentId"`
	Accepted             bool     `json:"accepted"`
	HeartbeatInterval    float64  `json:"heartbeatInterval"`
	AssignedCapabilities []string `json:"assignedCapabilities"`
	Restrictions         []string `json:"restrictions,omitempty"`
	// Liveness "link" says the agent's link is its heartbeat: the hub
	// keeps the registration alive while the link answers its pings
	// (which come at least once per heartbeat interval), and the agent
	// sends agent.heartbeat only to report a change of state or load.
	// Absent: the agent heartbeats every interval, as the seeds say. An
	// agent that heartbeats anyway is served as before.
	Liveness string `json:"liveness,omitempty"`
}

// LivenessLink is RegisterResult.Liveness when the link is the heartbeat.
const LivenessLink = "link"

// HeartbeatParams are the params of agent.heartbeat.
type HeartbeatParams struct {
	AgentID string          `json:"agentId"`
	Status  AgentStatus     `json:"status"`
	Metrics json.RawMessage `json:"metrics,omitempty"`
}

// AgentStatus is the seed's AgentStatus, plus the load the agent reports
// (0..1; the balancer weighs it).
type AgentStatus struct {
	State             string  `json:"state"`
	ActiveConnections int     `json:"activeConnections,omitempty"`
	QueuedRequests    int     `json:"queuedRequests,omitempty"`
	LastActivity      int64   `json:"lastActivity,omitempty"`
	Load              float64 `json:"load,omitempty"`
}

// DeregisterParams are the params of agent.deregister.
type DeregisterParams struct {
	AgentID string `json:"agentId"`
	Reason  string `json:"reason,omitempty"`
}

// AgentInfo describes one registered instance in mesh.agents.
type AgentInfo struct {
	AgentID       string    `json:"agentId"`
	Name          string    `json:"name"`
	Hub           string    `json:"hub"`
	Status        string    `json:"status"`
	Load          float64   `json:"load"`
	InFlight      int64     `json:"inflight"`
	Methods       []string  `json:"methods"`
	LastHeartbeat time.Time `json:"lastHeartbeat"`
	RegisteredAt  time.Time `json:"registeredAt"`
}

// MethodInfo describes one method (or pattern) in mesh.methods.
type MethodInfo struct {
	Method string   `json:"method"`
	Agents []string `json:"agents"`
	Ready  int      `json:"ready"`
	// Count is how many instances serve it, in a page (mesh.methods with
	// params), whose Agents lists at most MaxMethodAgents of them.
	Count int `json:"count,omitempty"`
}

// ListParams page mesh.agents and mesh.methods: with any of them the
// answer is a page ({agents|methods, next}), without them the whole list
// (an array; refused past MaxUnpaged entries).
type ListParams struct {
	Limit  int    `json:"limit,omitempty"`  // 1..1000 (default 500)
	Cursor string `json:"cursor,omitempty"` // the previous page's next
	Method string `json:"method,omitempty"` // agents: serving a method that matches it (a name or a pattern such as "memory.*"); methods: names with this prefix
	State  string `json:"state,omitempty"`  // agents: in this state
	Hub    string `json:"hub,omitempty"`    // agents: attached to this hub
	// Summary answers counts instead of a page: agents by state and by
	// hub, and the number of methods.
	Summary bool `json:"summary,omitempty"`
}

// AgentsPage is a page of mesh.agents.
type AgentsPage struct {
	Agents []AgentInfo `json:"agents"`
	Next   string      `json:"next,omitempty"` // the cursor of the next page; empty on the last
}

// MethodsPage is a page of mesh.methods.
type MethodsPage struct {
	Methods []MethodInfo `json:"methods"`
	Next    string       `json:"next,omitempty"`
}

// AgentsSummary is mesh.agents {"summary": true}.
type AgentsSummary struct {
	Agents  int            `json:"agents"`
	ByState map[string]int `json:"byState"`
	ByHub   map[string]int `json:"byHub"`
	Methods int            `json:"methods"`
}

// Listing bounds.
const (
	MaxUnpaged      = 2000 // entries an unpaged mesh.agents or mesh.methods answers at most
	MaxPage         = 1000 // a page's limit at most
	DefaultPage     = 500
	MaxMethodAgents = 100 // agent ids a page's MethodInfo lists at most
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
	// Streaming: the method answers with a stream of chunks, then its end
	// (agentick's streaming methods; call it as a stream).
	Streaming bool `json:"streaming,omitempty"`
}

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
	Streaming   bool            `json:"streaming,omitempty"` // answered with a stream of chunks
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

// ClusterInfo is one hub's view of its cluster (the console's cluster
// page): its registry and the peer hubs it links to.
type ClusterInfo struct {
	Hub            string     `json:"hub"`
	Registry       string     `json:"registry"`       // the backend: memory, etcd
	RegistrySynced bool       `json:"registrySynced"` // false while an etcd view is not (re)listed
	Draining       bool       `json:"draining"`
	Peers          []PeerInfo `json:"peers"` // the peer hubs this hub dialled
}

// PeerInfo is a peer hub as the hub's link to it stands.
type PeerInfo struct {
	Hub   string `json:"hub"`
	Addr  string `json:"addr"`
	Up    bool   `json:"up"`
	Error string `json:"error,omitempty"` // why it is down
}
