package registry

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Agent states of the kOS seed's AgentStatus. Only ready instances are
// routed to; the others stay registered.
const (
	StateInitializing = "initializing"
	StateReady        = "ready"
	StateBusy         = "busy"
	StateOverloaded   = "overloaded"
	StateError        = "error"
	StateShuttingDown = "shutting_down"
)

// ValidState reports whether s is one of the seed's agent states.
func ValidState(s string) bool {
	switch s {
	case StateInitializing, StateReady, StateBusy, StateOverloaded, StateError, StateShuttingDown:
		return true
	}
	return false
}

// Errors of the registry; the hub maps them to envelope codes.
var (
	ErrNotFound = errors.New("registry: no such instance")
	ErrClosed   = errors.New("registry: closed")
	ErrInvalid  = errors.New("registry: invalid registration")
)

// Registration is what an agent instance declares when it registers.
type Registration struct {
	InstanceID   string          `json:"agentId"`
	Name         string          `json:"name"`              // logical agent name, e.g. "echo" (a safe metric label)
	Hub          string          `json:"hub"`               // the hub the instance is attached to
	HubAddr      string          `json:"hubAddr,omitempty"` // where peers reach that hub (host:port)
	Capabilities []string        `json:"capabilities"`      // method names or patterns ("memory.*", "*")
	Intents      []string        `json:"intents,omitempty"`
	Metadata     json.RawMessage `json:"metadata,omitempty"`
	ContractHash string          `json:"contractHash,omitempty"`
	// Schemas is what the instance declared about its methods (a JSON
	// object: method name -> description, params and result JSON Schema,
	// error codes, roles; see control.MethodSchema). The hub bounds its size.
	Schemas json.RawMessage `json:"schemas,omitempty"`
	// HeartbeatInterval is how often the instance heartbeats; it expires
	// after three intervals without one.
	HeartbeatInterval time.Duration `json:"-"`
}

// Validate checks a registration before it is stored.
func (r *Registration) Validate() error {
	switch {
	case r.InstanceID == "":
		return errors.Join(ErrInvalid, errors.New("instance id is empty"))
	case len(r.Capabilities) == 0:
		return errors.Join(ErrInvalid, errors.New("no capabilities"))
	case r.HeartbeatInterval <= 0:
		return errors.Join(ErrInvalid, errors.New("heartbeat interval must be positive"))
	}
	for _, c := range r.Capabilities {
		if err := ValidCapability(c); err != nil {
			return errors.Join(ErrInvalid, err)
		}
	}
	return nil
}

// ValidCapability checks a method name or pattern: non-empty, at most 256
// bytes, printable without spaces, and "*" only as a whole last segment.
func ValidCapability(c string) error {
	if c == "" || len(c) > 256 {
		return errors.New("capability must be 1 to 256 bytes")
	}
	for i := 0; i < len(c); i++ {
		if c[i] <= ' ' || c[i] == 0x7f {
			return errors.New("capability " + quote(c) + " contains a space or control character")
		}
	}
	if i := strings.IndexByte(c, '*'); i >= 0 && (i != len(c)-1 || (i > 0 && c[i-1] != '.')) {
		return errors.New("capability " + quote(c) + `: "*" may only end a pattern, as in "memory.*"`)
	}
	return nil
}

func quote(s string) string { return `"` + s + `"` }

// Beat is what a heartbeat reports.
type Beat struct {
	State string  // one of the State constants; empty keeps the current one
	Load  float64 // 0..1 as the agent reports it
}

// Registry is implemented by the memory and etcd backends.
// All methods are safe for concurrent use.
type Registry interface {
	// Register stores or replaces an instance; it starts ready.
	Register(ctx context.Context, r Registration) (*Instance, error)
	// Heartbeat records that the instance is alive, with its state and load.
	Heartbeat(ctx context.Context, instanceID string, b Beat) error
	// Deregister removes an instance; ErrNotFound if it is not there.
	Deregister(ctx context.Context, instanceID string) error
	// Snapshot returns the current snapshot without blocking.
	Snapshot() *Snapshot
	// Watch sends the full current snapshot first, then every new one; a
	// slow receiver sees only the newest. The channel closes when ctx ends
	// or the registry closes.
	Watch(ctx context.Context) (<-chan *Snapshot, error)
	// Close stops the registry's goroutines and waits for them.
	Close() error
}

// Instance is one registered agent instance. Its registration is
// immutable; load, in-flight count, state and last heartbeat are atomics
// shared by every snapshot that holds the instance.
type Instance struct {
	Registration
	RegisteredAt time.Time
	st           *instState
}

type instState struct {
	load     atomic.Uint64 // float64 bits
	inflight atomic.Int64
	lastBeat atomic.Int64                     // unix nanoseconds
	heard    atomic.Pointer[func() time.Time] // KeepAliveWhile's
	state    atomic.Pointer[string]
	streams  sync.Once
	streamed []string // StreamingMethods, decoded once
}

// StreamingMethods returns the methods the instance's schemas declare
// streaming ({"method": {"streaming": true, ...}}), decoded once.
func (in *Instance) StreamingMethods() []string {
	if in.st == nil || len(in.Schemas) == 0 {
		return nil
	}
	in.st.streams.Do(func() {
		var decl map[string]struct{ Streaming bool }
		if json.Unmarshal(in.Schemas, &decl) != nil {
			return
		}
		for m, d := range decl {
			if d.Streaming {
				in.st.streamed = append(in.st.streamed, m)
			}
		}
		slices.Sort(in.st.streamed)
	})
	return in.st.streamed
}

// NewInstance makes an instance for r, ready and heartbeated now.
func NewInstance(r Registration, now time.Time) *Instance {
	r.Name, r.Capabilities, r.Intents = shareString(r.Name), shareStrings(r.Capabilities), shareStrings(r.Intents)
	r.Schemas = shareRaw(r.Schemas) // (share.go)
	in := &Instance{Registration: r, RegisteredAt: now, st: &instState{}}
	in.st.lastBeat.Store(now.UnixNano())
	s := StateReady
	in.st.state.Store(&s)
	return in
}

// Load returns the load the instance last reported.
func (in *Instance) Load() float64 { return math.Float64frombits(in.st.load.Load()) }

// InFlight returns the requests the router has sent it and not yet seen answered.
func (in *Instance) InFlight() int64 { return in.st.inflight.Load() }

// Acquire counts a request sent to the instance; call the returned func
// when it is answered.
func (in *Instance) Acquire() (release func()) {
	in.st.inflight.Add(1)
	return in.Release
}

// Hold counts a request sent to the instance, as Acquire does, for a
// caller that calls Release once it is answered (no func is made).
func (in *Instance) Hold() { in.st.inflight.Add(1) }

// Release ends what Hold or Acquire counted.
func (in *Instance) Release() { in.st.inflight.Add(-1) }

// State returns the last reported state.
func (in *Instance) State() string { return *in.st.state.Load() }

// LastHeartbeat returns when the instance last heartbeated, or, for one
// kept alive (KeepAliveWhile), was last heard from, if that is later.
func (in *Instance) LastHeartbeat() time.Time {
	last := time.Unix(0, in.st.lastBeat.Load())
	if h := in.lastHeard(); h.After(last) {
		return h
	}
	return last
}

// KeepAliveWhile keeps the instance registered without beats for as long
// as it is heard from: once three heartbeat intervals have passed since
// its last beat, the registry asks heard when the agent was last heard
// from (zero: it is gone) and counts that as its last beat, expiring it
// only if that too is three intervals old. A hub whose links are its
// agents' heartbeat (control.LivenessLink) sets it to when the agent's
// link last read something: the link's pings prove the agent is there,
// so nothing need beat every agent every interval. heard must be cheap
// and must not block.
func (in *Instance) KeepAliveWhile(heard func() time.Time) { in.st.heard.Store(&heard) }

// lastHeard is KeepAliveWhile's answer (zero: none).
func (in *Instance) lastHeard() time.Time {
	if in.st == nil {
		return time.Time{}
	}
	if f := in.st.heard.Load(); f != nil {
		return (*f)()
	}
	return time.Time{}
}

// kept reports whether the instance, expired by its beats at now, was
// heard from since (KeepAliveWhile), which then counts as its last beat.
func (in *Instance) kept(now time.Time) bool {
	h := in.lastHeard()
	if h.IsZero() || h.UnixNano() <= in.st.lastBeat.Load() {
		return false
	}
	in.st.lastBeat.Store(h.UnixNano())
	return !in.Expired(now)
}

// Beat records a heartbeat; it reports whether the state changed.
func (in *Instance) Beat(b Beat, now time.Time) (stateChanged bool) {
	in.st.lastBeat.Store(now.UnixNano())
	if b.Load >= 0 && !math.IsNaN(b.Load) && !math.IsInf(b.Load, 0) {
		in.st.load.Store(math.Float64bits(b.Load))
	}
	if b.State != "" && b.State != in.State() {
		s := b.State
		in.st.state.Store(&s)
		return true
	}
	return false
}

// Expired reports whether three heartbeat intervals passed without a beat.
func (in *Instance) Expired(now time.Time) bool {
	return now.Sub(time.Unix(0, in.st.lastBeat.Load())) > 3*in.HeartbeatInterval
}

// Serves reports whether the instance serves method.
func (in *Instance) Serves(method string) bool {
	for _, c := range in.Capabilities {
		if Match(c, method) {
			return true
		}
	}
	return false
}

// Match reports whether capability c (a name or a "prefix.*" / "*"
// pattern) covers method.
func Match(c, method string) bool {
	if n := len(c); n > 0 && c[n-1] == '*' {
		return strings.HasPrefix(method, c[:n-1])
	}
	return c == method
}
