package hub

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub/guard"
	"github.com/agentmesh/agentmesh/hub/listing"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/registry"
)

// builtin is a method the hub answers itself. It gets the link the
// request came over (nil over HTTP) and returns a value to marshal.
type builtin func(ctx context.Context, l *link.Link, params json.RawMessage) (any, error)

type linkKey struct{}

// linkRef names, in the contexts of the requests served on a link the
// hub accepted, the link they came over (set once the link exists).
type linkRef struct{ l *link.Link }

// linkContext is the parent context of a link the hub accepts: every
// request served on it finds the link there (linkFrom) at no cost per
// request; ref.l is set once the link is made.
func linkContext() (context.Context, *linkRef) {
	ref := new(linkRef)
	return context.WithValue(context.Background(), linkKey{}, ref), ref
}

func linkFrom(ctx context.Context) *link.Link {
	if r, _ := ctx.Value(linkKey{}).(*linkRef); r != nil {
		return r.l
	}
	return nil
}

func (h *Hub) builtinMethods() map[string]builtin {
	return map[string]builtin{
		"agent.register":   h.agentRegister,
		"agent.heartbeat":  h.agentHeartbeat,
		"agent.deregister": h.agentDeregister,
		"mesh.ping":        h.meshPing,
		"mesh.agents":      h.meshAgents,
		"mesh.methods":     h.meshMethods,
		"mesh.breakers":    h.meshBreakers,
		"mesh.schema":      h.meshSchema,
		"schema":           h.meshSchema, // the agentick seed's name
		"rpc.discover":     h.rpcDiscover,
	}
}

func (h *Hub) runBuiltin(ctx context.Context, req *envelope.Request, b builtin) (*envelope.Response, error) {
	start := time.Now()
	v, err := b(ctx, linkFrom(ctx), req.Params)
	if err != nil {
		return nil, envelope.AsError(err)
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return nil, envelope.WrapError(envelope.CodeInternal, "cannot encode result", err)
	}
	return &envelope.Response{
		ID: req.ID, Origin: h.cfg.ID, Destination: req.Origin, Timestamp: time.Now().UnixMilli(), Result: raw,
		Metrics: envelope.Metrics{LatencyMs: ms(time.Since(start)), Backend: "hub"},
		Headers: envelope.Headers{TraceID: req.Headers.TraceID, CorrelationID: req.Headers.CorrelationID},
	}, nil
}

var validIntents = map[string]bool{"serve": true, "consume": true, "coordinate": true, "monitor": true, "backup": true}

func (h *Hub) agentRegister(ctx context.Context, l *link.Link, raw json.RawMessage) (any, error) {
	var p control.RegisterParams
	if err := control.DecodeParams("agent.register", raw, &p); err != nil {
		return nil, err
	}
	if l == nil {
		return nil, envelope.NewError(envelope.CodeInvalidRequest, "agent.register needs a WebSocket link with subprotocol "+envelope.Subprotocol)
	}
	if len(p.Capabilities) == 0 {
		return nil, envelope.NewError(envelope.CodeInvalidParams, "agent.register: capabilities must list at least one method")
	}
	if len(p.Capabilities) > 1024 {
		return nil, envelope.NewError(envelope.CodeInvalidParams, "agent.register: at most 1024 capabilities")
	}
	// The token decides first: a name it does not cover is refused as
	// such, whatever its spelling (S24: aliases get PERMISSION_DENIED).
	who := PrincipalOf(ctx)
	if err := h.guard.MayServe(who, p.Capabilities); err != nil {
		h.metrics().Refused(refusal(err))
		return nil, err
	}
	for _, c := range p.Capabilities {
		if err := registry.ValidCapability(c); err != nil {
			return nil, envelope.Errorf(envelope.CodeInvalidParams, "agent.register: %v", err)
		}
		if _, ok := h.builtins[c]; ok || registry.Match(c, "agent.register") || registry.Match(c, "mesh.ping") {
			return nil, envelope.Errorf(envelope.CodeInvalidParams, "agent.register: capability %q would shadow the hub's built-in methods", c)
		}
	}
	for _, in := range p.Intents {
		if !validIntents[in] {
			return nil, envelope.Errorf(envelope.CodeInvalidParams, "agent.register: intent %q is not one of serve, consume, coordinate, monitor, backup", in)
		}
	}
	if len(p.AgentID) > 128 || len(p.Name) > 128 {
		return nil, envelope.NewError(envelope.CodeInvalidParams, "agent.register: agentId and name are at most 128 bytes")
	}
	schemas, err := control.EncodeSchemas(p.Schemas, func(m string) bool {
		return slices.ContainsFunc(p.Capabilities, func(c string) bool { return registry.Match(c, m) })
	})
	if err != nil {
		return nil, err
	}
	id := p.AgentID
	if id == "" {
		id = envelope.NewID()
	}
	if v, ok := h.bindings.Load(id); ok && h.guard.On() && !guard.SameSubject(linkPrincipal(v.(*binding).link), who) {
		// Only the same holder may take an agent id over.
		h.metrics().Refused("permission_denied")
		return nil, envelope.Errorf(envelope.CodePermissionDenied, "agent.register: agent id %q belongs to another token's holder", id)
	}
	if v, ok := h.bindings.Load(id); ok && v.(*binding).link != l {
		// The same agent reconnected before its old link was found dead:
		// the new link wins, the old one is closed (its calls fail over).
		old := v.(*binding)
		h.bindings.CompareAndDelete(id, old)
		go old.link.Close()
	}
	name := p.Name
	if name == "" {
		name = strings.TrimSuffix(strings.SplitN(p.Capabilities[0], ".", 2)[0], "*")
	}
	b := &binding{link: l, id: id}
	h.bindings.Store(id, b)
	in, err := h.reg.Register(ctx, registry.Registration{
		InstanceID: id, Name: name, Hub: h.cfg.ID, HubAddr: h.cfg.Advertise, Capabilities: p.Capabilities,
		Intents: p.Intents, Metadata: p.Metadata, ContractHash: p.ContractHash, Schemas: schemas,
		HeartbeatInterval: h.cfg.HeartbeatInterval,
	})
	if err != nil {
		h.bindings.CompareAndDelete(id, b)
		if errors.Is(err, registry.ErrInvalid) {
			return nil, envelope.Errorf(envelope.CodeInvalidParams, "agent.register: %v", err)
		}
		return nil, envelope.WrapError(envelope.CodeUnavailable, "registry refused the registration", err)
	}
	b.inst.Store(in)
	b.ready.Store(true)
	if h.linkLiveness() { // its link is its heartbeat: heard from when the link last read something
		in.KeepAliveWhile(func() time.Time {
			if b.link.Err() != nil {
				return time.Time{}
			}
			return b.link.LastHeard()
		})
	}
	h.log.Info("agent registered", "agent", id, "name", name, "capabilities", p.Capabilities, "remote", l.Remote)
	if m := h.metrics(); m != nil {
		for _, c := range p.Capabilities {
			if !strings.Contains(c, "*") { // a pattern names no method to show
				m.InitMethod(c)
			}
		}
	}
	res := control.RegisterResult{
		AgentID: id, Accepted: true,
		HeartbeatInterval:    h.cfg.HeartbeatInterval.Seconds(),
		AssignedCapabilities: p.Capabilities,
	}
	if h.linkLiveness() {
		res.Liveness = control.LivenessLink
	}
	return res, nil
}

// agentOfLink checks that id is attached over l: an agent may speak only
// for itself.
func (h *Hub) agentOfLink(method, id string, l *link.Link) error {
	if id == "" {
		return envelope.Errorf(envelope.CodeInvalidParams, "%s: agentId is required", method)
	}
	v, ok := h.bindings.Load(id)
	if !ok || l == nil || v.(*binding).link != l {
		return envelope.Errorf(envelope.CodeAgentNotFound, "%s: agent %q is not registered on this link", method, id)
	}
	return nil
}

func (h *Hub) agentHeartbeat(ctx context.Context, l *link.Link, raw json.RawMessage) (any, error) {
	var p control.HeartbeatParams
	if err := control.DecodeParams("agent.heartbeat", raw, &p); err != nil {
		return nil, err
	}
	if err := h.agentOfLink("agent.heartbeat", p.AgentID, l); err != nil {
		return nil, err
	}
	if p.Status.State != "" && !registry.ValidState(p.Status.State) {
		return nil, envelope.Errorf(envelope.CodeInvalidParams, "agent.heartbeat: state %q is not a known agent state", p.Status.State)
	}
	if p.Status.Load < 0 || p.Status.Load > 1 || math.IsNaN(p.Status.Load) {
		return nil, envelope.NewError(envelope.CodeInvalidParams, "agent.heartbeat: status.load must be within 0..1")
	}
	h.metrics().Heartbeat()
	if err := h.reg.Heartbeat(ctx, p.AgentID, registry.Beat{State: p.Status.State, Load: p.Status.Load}); err != nil {
		if errors.Is(err, registry.ErrNotFound) {
			return nil, envelope.Errorf(envelope.CodeAgentNotFound, "agent.heartbeat: agent %q expired; register again", p.AgentID)
		}
		return nil, envelope.WrapError(envelope.CodeUnavailable, "registry unavailable", err)
	}
	return map[string]bool{"acknowledged": true}, nil
}

func (h *Hub) agentDeregister(ctx context.Context, l *link.Link, raw json.RawMessage) (any, error) {
	var p control.DeregisterParams
	if err := control.DecodeParams("agent.deregister", raw, &p); err != nil {
		return nil, err
	}
	if err := h.agentOfLink("agent.deregister", p.AgentID, l); err != nil {
		return nil, err
	}
	h.bindings.Delete(p.AgentID)
	if h.movedAway(p.AgentID) {
		// The agent left a draining hub after registering on another:
		// only the binding here goes; the registration is the other hub's.
		h.log.Info("agent moved to another hub", "agent", p.AgentID, "reason", p.Reason)
		return map[string]any{"acknowledged": true, "gracePeriod": h.cfg.DrainTimeout.Seconds()}, nil
	}
	if err := h.reg.Deregister(ctx, p.AgentID); err != nil && !errors.Is(err, registry.ErrNotFound) {
		return nil, envelope.WrapError(envelope.CodeUnavailable, "registry unavailable", err)
	}
	h.log.Info("agent deregistered", "agent", p.AgentID, "reason", p.Reason)
	return map[string]any{"acknowledged": true, "gracePeriod": h.cfg.DrainTimeout.Seconds()}, nil
}

// movedAway reports whether the registry holds instance id as attached to
// another hub (it re-registered there, e.g. after this hub's goaway).
func (h *Hub) movedAway(id string) bool {
	in := h.reg.Snapshot().Instance(id)
	return in != nil && in.Hub != "" && in.Hub != h.cfg.ID
}

func (h *Hub) meshPing(ctx context.Context, _ *link.Link, raw json.RawMessage) (any, error) {
	return map[string]any{"pong": true, "hub": h.cfg.ID, "time": time.Now().UnixMilli()}, nil
}

func (h *Hub) meshAgents(ctx context.Context, _ *link.Link, raw json.RawMessage) (any, error) {
	return listing.Agents(h.reg.Snapshot(), raw)
}

func (h *Hub) meshMethods(ctx context.Context, _ *link.Link, raw json.RawMessage) (any, error) {
	return listing.Methods(h.reg.Snapshot(), raw)
}

func (h *Hub) meshBreakers(ctx context.Context, _ *link.Link, raw json.RawMessage) (any, error) {
	if err := control.DecodeParams("mesh.breakers", raw, &struct{}{}); err != nil {
		return nil, err
	}
	return h.breakers.List(), nil
}
