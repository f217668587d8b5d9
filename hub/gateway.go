package hub

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub/guard"
	"github.com/agentmesh/agentmesh/hub/sse"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/stream"
)

// serveRPC is POST /rpc: JSON-RPC 2.0, single or batch. JSON-RPC errors are
// answered with HTTP 200, as JSON-RPC clients expect; transport failures
// (wrong HTTP method, body over the limit) get their HTTP status with a
// JSON-RPC error body.
func (h *Hub) serveRPC(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeRPCError(w, http.StatusMethodNotAllowed, envelope.NewError(envelope.CodeInvalidRequest, "use POST for JSON-RPC"))
		return
	}
	ctx, ok := h.authRequest(w, r)
	if !ok {
		return
	}
	limit := h.cfg.Conn.Limits.MaxBytes
	if r.ContentLength > int64(limit) {
		// Declared too big: refused before reading a byte of it.
		writeRPCError(w, http.StatusRequestEntityTooLarge, envelope.Errorf(envelope.CodeInvalidRequest, "body exceeds the limit of %d bytes", limit))
		return
	}
	lim := h.cfg.Conn.Limits
	data, refused, err := link.ReadChecked(http.MaxBytesReader(w, r.Body, int64(limit)), limit,
		func(b []byte) *envelope.Error { return envelope.PrecheckJSONRPC(b, lim) }, 0)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeRPCError(w, http.StatusRequestEntityTooLarge, envelope.Errorf(envelope.CodeInvalidRequest, "body exceeds the limit of %d bytes", limit))
			return
		}
		writeRPCError(w, http.StatusBadRequest, envelope.NewError(envelope.CodeInvalidRequest, "cannot read the request body"))
		return
	}
	if refused != nil { // refused in the read buffer, never copied out
		writeRPCError(w, http.StatusOK, refused)
		return
	}
	calls, batch := envelope.DecodeCheckedJSONRPC(data) // readChecked ran PrecheckJSONRPC
	if k := r.Header.Get("Idempotency-Key"); k != "" {
		// The HTTP header of draft-ietf-httpapi-idempotency-key, for a
		// single call (a batch carries keys per call in meta).
		if batch || len(k) > 255 {
			writeRPCError(w, http.StatusBadRequest, envelope.NewError(envelope.CodeInvalidRequest, "Idempotency-Key: one key of at most 255 bytes, for a single call"))
			return
		}
		if calls[0].Err == nil && calls[0].Request.Headers.IdempotencyKey == "" {
			calls[0].Request.Headers.IdempotencyKey = k
		}
	}
	if hook := h.intercepted(calls, batch); hook != nil {
		hook.serve(w, ctx, &calls[0], r.Header) // a surface's claim (NEXUS3's /rpc alias of /)
		return
	}
	if !batch && !calls[0].Notification && sse.Accepts(r) {
		sse.Serve(w, ctx, &calls[0], h.Streaming(calls[0].Request.Method), h.ingress, h.cfg.Conn.WriteTimeout)
		return
	}
	out := h.answerAll(ctx, calls, batch, nil)
	if out == nil {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	_, _ = w.Write(out)
}

func writeRPCError(w http.ResponseWriter, status int, e *envelope.Error) {
	w.WriteHeader(status)
	_, _ = w.Write(envelope.AppendJSONRPCError(nil, nil, e))
}

// answerAll runs decoded JSON-RPC calls (a batch concurrently) and returns
// the encoded reply, or nil when there is nothing to answer (notifications).
// With emit (a WebSocket), a call to a streaming method is called as a
// stream, its chunks handed to emit before the reply.
func (h *Hub) answerAll(ctx context.Context, calls []RPCCall, batch bool, emit chunkEmitter) []byte {
	if !batch {
		return h.answer(ctx, &calls[0], emit)
	}
	replies := make([][]byte, len(calls))
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() { replies[i] = h.answer(ctx, &calls[i], emit) })
	}
	wg.Wait()
	var out []byte
	for _, r := range replies {
		if r == nil {
			continue
		}
		if out == nil {
			out = append(out, '[')
		} else {
			out = append(out, ',')
		}
		out = append(out, r...)
	}
	if out == nil {
		return nil
	}
	return append(out, ']')
}

// RPCCall is a decoded JSON-RPC request (see envelope.RPCCall).
type RPCCall = envelope.RPCCall

// chunkEmitter sends the n-th chunk of the streaming call id.
type chunkEmitter func(id json.RawMessage, n uint64, data json.RawMessage) error

func (h *Hub) answer(ctx context.Context, c *RPCCall, emit chunkEmitter) []byte {
	if c.Err != nil {
		if c.Notification {
			return nil
		}
		return envelope.AppendJSONRPCError(nil, c.ID, c.Err)
	}
	req := &c.Request
	if req.Timestamp == 0 {
		req.Timestamp = time.Now().UnixMilli()
	}
	var res *envelope.Response
	var err error
	if emit != nil && !c.Notification && h.Streaming(req.Method) {
		res, err = stream.Relay(ctx, h.ingress, req, stream.RelayWindow, func(n uint64, data json.RawMessage) error { return emit(c.ID, n, data) })
	} else {
		res, err = h.ingress(ctx, req)
	}
	if c.Notification {
		return nil
	}
	if err != nil {
		return envelope.AppendJSONRPCError(nil, c.ID, envelope.AsError(err))
	}
	return envelope.AppendJSONRPCResult(nil, c.ID, res.Result)
}

// admit runs the checks every WebSocket upgrade and every edge request
// (agentick's SSE and /invoke) passes first, in one order: the Origin
// before anything else, credential or not, so that a cross-site page
// learns nothing (403, S23); not while draining (503); then the
// credential (401/429). On refusal it has answered.
func (h *Hub) admit(w http.ResponseWriter, r *http.Request) (*Principal, bool) {
	return h.admitAs(w, r, false)
}

// admitAs is admit; with peerOK (serveWS) a hub's peer token is accepted.
func (h *Hub) admitAs(w http.ResponseWriter, r *http.Request, peerOK bool) (*Principal, bool) {
	if !h.guard.Origins.Check(r) {
		h.metrics().Refused("origin")
		http.Error(w, "origin not allowed", http.StatusForbidden)
		return nil, false
	}
	if h.draining.Load() {
		http.Error(w, "hub is draining", http.StatusServiceUnavailable)
		return nil, false
	}
	who, aerr := h.guard.AuthenticateAs(r, peerOK)
	if aerr != nil {
		h.metrics().Refused(refusal(aerr))
		httpRefuse(w, aerr)
		return nil, false
	}
	return who, true
}

// serveWS is GET /ws. With subprotocol agentmesh.v2 (binary frames) or
// agentmesh.v1 (JSON frames) the socket is a native Link (agents and SDK
// clients; v2 is preferred when offered); without one, or with "jsonrpc", it speaks
// plain JSON-RPC 2.0 and the envelope headers ride in "meta". A hub's
// peer token opens a native link only, answered with this hub's proof
// (peerauth.go).
func (h *Hub) serveWS(w http.ResponseWriter, r *http.Request) {
	who, ok := h.admitAs(w, r, true)
	if !ok {
		return
	}
	var hdr http.Header
	if who.Peer() {
		if offered := websocket.Subprotocols(r); !slices.Contains(offered, envelope.Subprotocol) && !slices.Contains(offered, envelope.SubprotocolV2) {
			h.metrics().Refused("unauthenticated")
			httpRefuse(w, guard.ErrHubTokenElsewhere)
			return
		}
		proof, err := h.guard.Peers.Proof(who.Claims)
		if err != nil {
			h.log.Error("cannot sign the peer proof", "error", err)
			httpRefuse(w, envelope.NewError(envelope.CodeInternal, "cannot sign the peer proof"))
			return
		}
		hdr = http.Header{auth.PeerProofHeader: {proof}}
	}
	ws, err := h.upgrader.Upgrade(w, r, hdr)
	if err != nil {
		return // the upgrader has answered with an HTTP error
	}
	if sp := ws.Subprotocol(); sp == envelope.Subprotocol || sp == envelope.SubprotocolV2 {
		h.startLink(ws, who)
		return
	}
	h.startJSONRPC(ws, who)
}

func (h *Hub) startLink(ws *websocket.Conn, who *Principal) {
	lctx, ref := linkContext()
	opts := []link.Option{
		link.WithHandler(h.ingress),
		link.WithLogger(h.log),
		link.WithOwner(who),
		link.WithContext(lctx),
		link.WithMaxServing(h.maxPending),
		link.WithOnClose(func(l *link.Link, err error) { h.linkClosed(l, err) }),
		link.Accepted(),
		func(l *link.Link) { ref.l = l }, // before its reader starts
	}
	if who.Peer() {
		// A peer hub's link carries every caller of that hub, each
		// bounded there: one of them must not refuse the others' calls.
		opts = append(opts, link.WithoutCallBound())
		// Its answers wait for a lost segment's retransmission no longer
		// than the peer's requests do (internal/tcptune).
		link.TuneLink(ws.NetConn())
	} else {
		opts = append(opts, link.WithFast(h.serveFast)) // fast.go
	}
	l := link.NewShared(ws, h.connCfg, opts...)
	if !h.track(l) {
		go l.Close()
		return
	}
	if h.draining.Load() {
		l.SendGoAway() // upgraded while BeginDrain was collecting the links
	}
	expireLink(l, who)
}

// linkClosed removes the instances attached over a lost link from the
// registry. Their pending calls already failed with UNAVAILABLE.
func (h *Hub) linkClosed(l *link.Link, err error) {
	h.untrack(l)
	h.bindings.Range(func(k, v any) bool {
		b := v.(*binding)
		if b.link == l && h.bindings.CompareAndDelete(k, v) {
			h.breakers.Forget(b.id)
			if h.movedAway(b.id) {
				return true // registered on another hub since: not ours to remove
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = h.reg.Deregister(ctx, b.id)
			cancel()
			h.log.Info("agent link lost; deregistered", "agent", b.id, "error", errString(err))
		}
		return true
	})
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// rpcConn is a plain JSON-RPC 2.0 WebSocket client: requests in, responses
// out, many in flight at once.
type rpcConn struct {
	busy   atomic.Int64 // calls in flight
	c      *link.Conn
	ctx    context.Context
	cancel context.CancelFunc
	h      *Hub
	who    *Principal // nil when the hub authenticates nobody
	// workers answer the messages (kept goroutines, not one per message)
	workers *link.Workers[rpcTask]

	mu     sync.Mutex
	fast   map[*fastCall]struct{} // single calls on the forward path (fast.go)
	closed bool                   // set once the connection closed: track no more
	slow   sync.WaitGroup         // answers waiting for room in the send queue
}

func (h *Hub) startJSONRPC(ws *websocket.Conn, who *Principal) {
	rc := &rpcConn{c: link.NewConnShared(ws, h.connCfg), h: h, who: who}
	rc.c.WithBackpressure()
	rc.c.SetCheck(envelope.PrecheckJSONRPC)
	base := context.Background()
	if who != nil {
		base = context.WithValue(base, principalKey{}, who)
	}
	rc.ctx, rc.cancel = context.WithCancel(base)
	rc.workers = link.NewWorkers(rc.ctx.Done(), rc.answer)
	if !h.track(rc) {
		rc.cancel()
		_ = ws.Close()
		return
	}
	rc.c.Start(rc.onMessage, func(error) { rc.cancel(); rc.cancelFast(); h.untrack(rc) })
}

// track holds a call on the forward path until answered (fastOrigin).
func (rc *rpcConn) track(fc *fastCall) bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.closed {
		return false
	}
	if rc.fast == nil {
		rc.fast = map[*fastCall]struct{}{}
	}
	rc.fast[fc] = struct{}{}
	return true
}

// cancelFast cancels the calls on the forward path (the connection closed).
func (rc *rpcConn) cancelFast() {
	rc.mu.Lock()
	rc.closed = true
	calls := rc.fast
	rc.fast = nil
	rc.mu.Unlock()
	for fc := range calls {
		fc.CancelServed()
	}
}

// answerFast answers a call on the forward path (fastOrigin) without
// blocking: when the send queue is full, the answer waits for room on a
// goroutine of its own, as a worker would have.
func (rc *rpcConn) answerFast(fc *fastCall, res *envelope.Response, err error) {
	rc.busy.Add(-1) // free before the caller can see the answer, and send its next call
	rc.mu.Lock()
	delete(rc.fast, fc)
	rc.mu.Unlock()
	if fc.rpcNotify {
		rc.c.Release(1, fc.held)
		return
	}
	b := link.GetBuf()
	if err != nil {
		*b = envelope.AppendJSONRPCError(*b, fc.rpcID, envelope.AsError(err))
	} else {
		*b = envelope.AppendJSONRPCResult(*b, fc.rpcID, res.Result)
	}
	wait := rc.c.TrySendOwed(b)
	if wait == nil {
		rc.c.Release(1, fc.held)
		return
	}
	rc.mu.Lock()
	if rc.closed {
		rc.mu.Unlock()
		wait() // at once: the connection is closed
		rc.c.Release(1, fc.held)
		return
	}
	rc.slow.Add(1)
	rc.mu.Unlock()
	go func() {
		defer rc.slow.Done()
		wait()
		rc.c.Release(1, fc.held)
	}()
}

func (rc *rpcConn) onMessage(data []byte, refused *envelope.Error) {
	if refused != nil {
		// Refused as a whole: no id can be trusted (null, as JSON-RPC 2.0
		// answers a request it cannot parse).
		b := link.GetBuf()
		*b = envelope.AppendJSONRPCError(*b, nil, refused)
		rc.c.Send(b)
		return
	}
	// The reader ran c.check, PrecheckJSONRPC. One call (not a batch)
	// is decoded with no slice: the forward path copies it.
	one, single := envelope.DecodeCheckedJSONRPCSingle(data)
	var calls []envelope.RPCCall
	batch, ncalls := !single, 1
	if batch {
		calls, _ = envelope.DecodeCheckedJSONRPC(data)
		ncalls = len(calls)
	}
	// A bound on the calls in flight per connection: past it the
	// connection's new calls are refused at once, not queued, each under
	// its own id: a batch is answered with an array of refusals (one per
	// call that is not a notification), as JSON-RPC 2.0 answers a batch,
	// so that a client waiting on those ids hears of every one.
	// The same for the connection's bounds on bytes and calls running
	// or owed (link.Config.MaxUnwrittenBytes, MaxUnwrittenCalls); a
	// client that does not read its answers is then paused, not read.
	n := len(data)
	if rc.busy.Add(int64(ncalls)) > int64(rc.h.maxPending) || !rc.c.TryAdmit(ncalls, n) {
		rc.busy.Add(-int64(ncalls))
		if single {
			calls = []envelope.RPCCall{one}
		}
		e := envelope.NewError(envelope.CodeOverloaded, "too many calls in flight on this connection").MarkNotSent()
		b := link.GetBuf()
		if batch {
			*b = append(*b, '[')
		}
		answered := 0
		for i := range calls {
			if calls[i].Notification {
				continue
			}
			if answered > 0 {
				*b = append(*b, ',')
			}
			*b = envelope.AppendJSONRPCError(*b, calls[i].ID, e)
			answered++
		}
		if answered == 0 {
			link.PutBuf(b) // notifications only: nothing to answer
			return
		}
		if batch {
			*b = append(*b, ']')
		}
		rc.c.Send(b)
		return
	}
	// Counted (tryAdmit) until the answer is queued.
	if single && one.Err == nil && !rc.h.Streaming(one.Request.Method) {
		if pol := rc.h.fastPolicy(&one.Request); pol != nil {
			if one.Request.Timestamp == 0 {
				one.Request.Timestamp = time.Now().UnixMilli()
			}
			if rc.h.takeFast(rc, rc.ctx, &fastCall{rpcID: one.ID, rpcNotify: one.Notification, held: n}, &one.Request, pol) {
				return
			}
		}
	}
	if single {
		calls = []envelope.RPCCall{one}
	}
	rc.workers.Go(rpcTask{calls, batch, n})
}

// rpcTask is one message's calls for a worker.
type rpcTask struct {
	calls []envelope.RPCCall
	batch bool
	n     int // the message's size, admitted until answered
}

// answer answers one message's calls and queues the answer.
func (rc *rpcConn) answer(t rpcTask) {
	defer rc.c.Release(len(t.calls), t.n)
	out := rc.h.answerAll(rc.ctx, t.calls, t.batch, rc.emitChunk)
	// Free before the caller can see the answer, and send its next call.
	rc.busy.Add(-int64(len(t.calls)))
	if out == nil {
		return
	}
	rc.c.Send(&out) // not copied: a copy is one more answer's size held
}

// emitChunk sends a streaming call's chunk as a JSON-RPC notification
// tied to its request id (README, "Streams"): waiting while the send
// queue is half full, so that a client slow to read holds the stream
// back and the other half stays for the connection's answers.
func (rc *rpcConn) emitChunk(id json.RawMessage, n uint64, data json.RawMessage) error {
	b := link.GetBuf()
	*b = append(*b, `{"jsonrpc":"2.0","method":"`+stream.ChunkMethod+`","params":{"id":`...)
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	*b = append(*b, id...)
	*b = append(*b, `,"n":`...)
	*b = strconv.AppendUint(*b, n, 10)
	*b = append(*b, `,"data":`...)
	if len(data) == 0 {
		data = json.RawMessage("null")
	}
	*b = append(*b, data...)
	*b = append(*b, "}}"...)
	if !rc.c.SendRoomy(b) {
		return envelope.NewError(envelope.CodeCancelled, "the connection closed")
	}
	return nil
}

// Close closes the connection and waits for its calls to end.
func (rc *rpcConn) Close() {
	rc.c.Close()
	rc.cancel()
	rc.workers.Wait()
	rc.slow.Wait()
}
