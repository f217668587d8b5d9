package hub

import (
	"context"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/telemetry"
)

// WatchCalls calls fn with each user call this hub serves that fails or
// takes slow or longer (built-ins left out), until stop (hub/callwatch).
func (h *Hub) WatchCalls(slow time.Duration, fn func(telemetry.CallRecord)) (stop func()) {
	return h.watches.Add(slow, fn)
}

// noteCall tells the watchers of a user call.
func (h *Hub) noteCall(req *envelope.Request, start time.Time, instance string, err error) {
	if _, builtin := h.builtins[req.Method]; !builtin {
		h.watches.Note(req, start, instance, err)
	}
}

// watchCalls is the ingress stage that notes each call's outcome for the
// watchers (the forward path notes its own in finish).
func (h *Hub) watchCalls(next envelope.Invoker) envelope.Invoker {
	return func(ctx context.Context, req *envelope.Request) (*envelope.Response, error) {
		if !h.watches.Active() {
			return next(ctx, req)
		}
		start := time.Now()
		res, err := next(ctx, req)
		h.noteCall(req, start, "", err)
		return res, err
	}
}
