package hub

import (
	"context"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/registry"
	"github.com/agentmesh/agentmesh/reliability"
	"github.com/agentmesh/agentmesh/stream"
	"github.com/agentmesh/agentmesh/telemetry"
)

// warmingUp reports whether the hub is within WarmUp of its start or of
// its registry's last listing (a registry that says when it last synced,
// as the etcd one does: LastSync). Only a call to a method no agent has
// registered asks.
func (h *Hub) warmingUp() bool {
	w := h.cfg.WarmUp
	if w <= 0 {
		return false
	}
	since := time.Since(time.Unix(0, h.started.Load()))
	if s, ok := h.reg.(interface{ LastSync() time.Time }); ok {
		if t := s.LastSync(); !t.IsZero() {
			since = min(since, time.Since(t))
		}
	}
	return since < w
}

// dispatch answers built-in methods and routes the rest. It enforces the
// Invoker contract: exactly one of response and error.
func (h *Hub) dispatch(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
	var res *envelope.Response
	var err error
	if b, ok := h.builtins[req.Method]; ok {
		if PrincipalOf(ctx).Peer() {
			// A peer link carries calls for agents only (authorizePeer
			// refuses the hub's namespaces; this covers every built-in,
			// "schema" included).
			return nil, envelope.Errorf(envelope.CodePermissionDenied, "%s: a peer link carries calls for agents only, not for the hub's own methods", req.Method)
		}
		res, err = h.runBuiltin(ctx, req, b)
	} else {
		res, err = h.route(ctx, req)
	}
	if (res == nil) == (err == nil) {
		h.log.Error("invoker broke its contract", "method", req.Method, "response", res != nil, "error", err)
		return nil, envelope.NewError(envelope.CodeInternal, "internal error")
	}
	return res, err
}

// route forwards a call to an instance: the one named by Destination, or
// one picked by the balancer among the ready instances serving the method,
// under the method's policy (bulkhead, retries, breakers per instance).
//
// A call forwarded by a peer hub (Hops > 0) gets one attempt here: the
// origin hub runs the method's policy (retries, budget), so the error must
// reach it without this hub's "gave up after N attempts" mark, free to be
// retried on another instance.
func (h *Hub) route(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
	if req.Stream && stream.From(ctx) != nil {
		return h.streamed(ctx, req)
	}
	if req.Headers.Hops > 0 {
		return h.forwarded(ctx, req)
	}
	return h.routed(ctx, req)
}

// streamed routes a stream, counting its chunks for its span (one per
// stream: chunks, bytes, time to the first chunk, stalls) and metrics.
func (h *Hub) streamed(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
	ctx, cnt := stream.Count(ctx)
	m := h.metrics()
	m.StreamOpened(req.Method)
	var res *envelope.Response
	var err error
	if req.Headers.Hops > 0 {
		res, err = h.forwarded(ctx, req)
	} else {
		res, err = h.routed(ctx, req)
	}
	var st telemetry.StreamStats
	st.Chunks, st.Bytes, st.FirstChunk, st.Stalls = cnt.Stats()
	telemetry.AnnotateStream(ctx, st)
	m.StreamClosed(req.Method, st)
	return res, err
}

// attempt is one try of a routed call. It prefers instances the call has
// not tried yet and skips those whose breaker is open.
func (h *Hub) attempt(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
	tried := reliability.TriedFrom(ctx)
	in, onlyBehindDown, err := h.pick(req, tried)
	if err != nil {
		return nil, err
	}
	tried.Add(in.InstanceID)
	telemetry.AnnotateInstance(ctx, in.InstanceID)
	if telemetry.Recording(ctx) {
		addr := in.HubAddr // a peer hub's
		if b := h.localBinding(in); b != nil {
			addr = b.link.Remote
		}
		telemetry.AnnotateServer(ctx, addr)
	}
	ticket, err := h.breakers.Allow(reliability.BreakerKey{Method: req.Method, Instance: in.InstanceID})
	if err != nil {
		return nil, err
	}
	release := in.Acquire()
	var res *envelope.Response
	outcome := error(nil) // what the breaker is told
	// A binding not ready yet is a registration this hub has not had
	// accepted by the registry: while the registry names another hub for
	// the instance (a stale entry, e.g. during an etcd cut), calls go
	// there, not over the link of a registration that may be refused.
	if b := h.localBinding(in); b != nil {
		res, err = b.link.Call(ctx, req)
		outcome = err
	} else if in.Hub != h.cfg.ID {
		var peerLost bool
		res, peerLost, err = h.forward(ctx, req, in) // attached to another hub of the cluster
		outcome = err
		if peerLost {
			// The link between the hubs failed, not the instance: its
			// breaker is neither tripped nor healed (an excluded outcome).
			outcome = link.UnavailableNotSent("peer link lost")
			if e := envelope.AsError(err); e.NotSent() && onlyBehindDown {
				// Every instance left is behind a down peer: like no
				// responders (S22), answered at once, and no retry loop
				// waits to try again.
				err = e.WithAttempts(1)
			}
		}
	} else {
		err = link.UnavailableNotSent("agent " + in.InstanceID + " is not attached to this hub")
		outcome = err
	}
	release()
	if req.Stream && outcome != nil {
		if e := envelope.AsError(outcome); e.Code == envelope.CodeTimeout && e.Attempts() > 0 {
			// A stream that ran out of time after chunks came: its
			// caller's pace (the credit it held back) or its length, not
			// the instance's health.
			outcome = nil
		}
	}
	ticket.Done(outcome)
	return res, err
}

// localBinding is the binding calls to in go over from this hub: its
// agent's link, when attached here (nil otherwise).
func (h *Hub) localBinding(in *registry.Instance) *binding {
	if v, ok := h.bindings.Load(in.InstanceID); ok && (v.(*binding).ready.Load() || in.Hub == h.cfg.ID) {
		return v.(*binding)
	}
	return nil
}

// pick chooses the instance for one attempt of req (the one its
// Destination names, or the balancer's among those not tried, not behind
// an open breaker or a down peer), or says why there is none.
// onlyBehindDown: the instance is behind a down peer, and was picked
// because nothing else was left.
func (h *Hub) pick(req *envelope.Request, tried *reliability.Tried) (in *registry.Instance, onlyBehindDown bool, _ error) {
	snap := h.reg.Snapshot()
	if req.Destination != "" {
		in = snap.Instance(req.Destination)
		if in == nil && req.Headers.Hops > 0 {
			// The origin hub picked an instance that has just left this
			// one: not sent, so the origin retries elsewhere.
			return nil, false, link.UnavailableNotSent("agent " + req.Destination + " is no longer attached to this hub")
		}
		if in == nil {
			return nil, false, envelope.Errorf(envelope.CodeAgentNotFound, "no agent %q", req.Destination).WithAttempts(1)
		}
		if !in.Serves(req.Method) {
			return nil, false, envelope.Errorf(envelope.CodeMethodNotFound, "agent %q does not serve %q", req.Destination, req.Method).WithAttempts(1)
		}
	} else {
		cands := snap.Lookup(req.Method)
		if len(cands) == 0 {
			// No responders: answered at once (S22). The attempts mark
			// tells every retry loop that another try cannot help.
			if snap.Known(req.Method) {
				return nil, false, link.UnavailableNotSent("no ready instance serves " + req.Method).WithAttempts(1)
			}
			if h.warmingUp() {
				// Just started, or just listed the registry again: the
				// agents serving it may not have registered (again) yet.
				// Retryable, unlike METHOD_NOT_FOUND, which every client
				// takes as final (Config.WarmUp).
				return nil, false, link.UnavailableNotSent("no agent has registered " + req.Method + " yet: the hub has just started or resynced")
			}
			return nil, false, envelope.Errorf(envelope.CodeMethodNotFound, "no agent serves %q", req.Method).WithAttempts(1)
		}
		open := func(in *registry.Instance) bool {
			return h.breakers.IsOpen(reliability.BreakerKey{Method: req.Method, Instance: in.InstanceID})
		}
		// Instances behind a peer link found dead are avoided while others
		// serve the method; when only they are left one is tried, which
		// fails fast (not sent) and kicks a re-dial.
		down := func(in *registry.Instance) bool { return in.Hub != h.cfg.ID && h.peers.IsDown(in.Hub, in.HubAddr) }
		in = registry.Pick(cands, func(in *registry.Instance) bool { return tried.Has(in.InstanceID) || open(in) || down(in) })
		if in == nil {
			in = registry.Pick(cands, func(in *registry.Instance) bool { return tried.Has(in.InstanceID) || open(in) })
		}
		if in == nil && tried != nil {
			in = registry.Pick(cands, open) // every instance tried: any that is not open
		}
		if in == nil {
			// Every instance is behind an open breaker: refused at once.
			// A retry loop tries again when the first of them admits a
			// probe, if that is before the call's deadline; never after a
			// mere backoff (CircuitOpen).
			var probe time.Time
			for _, c := range cands {
				if at, ok := h.breakers.ProbeAt(reliability.BreakerKey{Method: req.Method, Instance: c.InstanceID}); ok && (probe.IsZero() || at.Before(probe)) {
					probe = at
				}
			}
			return nil, false, reliability.CircuitOpen("the circuit is open for every instance serving "+req.Method, probe)
		}
	}
	// Picked although behind a down peer: no instance outside one was left.
	onlyBehindDown = req.Destination == "" && in.Hub != h.cfg.ID && h.peers.IsDown(in.Hub, in.HubAddr)
	return in, onlyBehindDown, nil
}
