// Package agentick is the agentick surface (seed
// agentick-gateway-protocol): the gateway protocol of @agentick/gateway,
// so that its clients work against a hub.
//
//	GET  / (upgrade), /agentick/ws  WebSocket: {type:"connect", clientId} → {type:"connected", …};
//	                           {type:"req", id, method, params} → {type:"res", id, ok, payload|error};
//	                           pushed {type:"event", event, category, sessionId, data}
//	GET  /events?clientId=ID   the same client's event stream over SSE (numbered events, resumed
//	                           with Last-Event-ID within a grace period: resume.go)
//	POST /invoke               {method, params[, id][, clientId]} → the res envelope
//
// The seed's WebSocket is at the root of the gateway: an upgrade on GET /
// is agentick's (the root's POST is NEXUS3's, /ws the mesh's own
// dialect); /agentick/ws is the same endpoint under an unambiguous name.
//
// It is a dialect at the edge, not a dispatcher: each agentick method is
// translated into calls of the chat agent (package agents/chat; a session
// is a chat agent, its id the session name) or of the mesh, run through
// the hub's ingress like native calls (authentication, authorisation,
// policies, tracing, metrics), and their answers and errors translated
// back. What the gateway keeps itself is only what the protocol has and
// the mesh has not: the clients connected here, their subscriptions, the
// channels, and the order of a send's lifecycle events. A method name the
// seed does not list is a custom method: the mesh method of that name.
//
// Methods and their backing:
//
//	send              chat.get_context (chat.create on first use), then a turn chat.send in the background → {messageId};
//	                  the turn names the conversation it was sent to, so a reset in between cancels it
//	abort             chat.cancel of the turn this gateway started
//	status            mesh.methods, chat.list, chat.get_context
//	history           chat.getAgentMessages (ids "msg-N", N the index in the history)
//	close             chat.destroy
//	apps              mesh.methods: app "chat" when an agent serves chat.send
//	sessions          chat.list
//	subscribe         chat.events (tail, then long polls: surface.FollowChat)
//	unsubscribe       the gateway's own subscription: nothing of the session reaches the client after its answer
//	channel           chat.get_context, then the gateway's own channel fan-out
//	channel-subscribe chat.get_context, then the gateway's own subscription
//	schema            mesh.schema, translated
//	tool-catalog      mesh.schema: the methods agents serve, which a session reaches with its mesh_call tool
//	tool-dispatch     that method, called with input
//	reset             chat.reset: the sends in flight are cancelled (the running turn and those waiting here
//	                  end with result aborted), the session file is moved aside, the history starts empty
//	tool-confirm      NOT_FOUND_RESOURCE: the chat runtime runs tools without confirmation, so no call awaits one
//
// Roles: every mesh call it makes is authorised by the ingress as usual
// (the role table's entry for chat.send guards send, …); on top, the
// role table may guard an agentick method by the name "agentick.<method>"
// ("agentick.*" for all).
//
// It reaches the hub only through surface.Host; Mount mounts it.
package agentick

import (
	"context"
	"sync"
	"time"

	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/surface"
)

const (
	agentickVersion = "1.0"
	agentickApp     = "chat" // the one app: the chat runtime
	// agentickQueue bounds the replies a WebSocket's reader holds back
	// while connected is on its way; a client that sends more is cut
	// off. (A WebSocket's frames wait in its connection's queue, an SSE
	// client's in its ring: resume.go.)
	agentickQueue = 1024
	// agentickInFlight bounds the requests in flight per WebSocket client.
	agentickInFlight = 64
	// agentickMaxTurns bounds the sends of one session started here and
	// not finished (running or waiting for the running one).
	agentickMaxTurns = 16
)

// agentickKeepAlive is how often an idle SSE stream gets a comment line.
var agentickKeepAlive = 15 * time.Second

// agentickEvents are the event types this gateway emits, with their
// categories.
var agentickEvents = []control.SchemaEvent{
	{Type: "execution_start", Category: "orchestration"},
	{Type: "message_start", Category: "model"},
	{Type: "content_delta", Category: "model"},
	{Type: "message", Category: "model"},
	{Type: "tick_end", Category: "orchestration"},
	{Type: "tool_call_start", Category: "model"},
	{Type: "tool_result", Category: "orchestration"},
	{Type: "compaction_start", Category: "orchestration"},
	{Type: "compaction_end", Category: "orchestration"},
	{Type: "execution_end", Category: "orchestration"},
	{Type: "result", Category: "result"},
	{Type: "channel", Category: "gateway"},
	{Type: "method:chunk", Category: "gateway"},
	{Type: "method:end", Category: "gateway"},
}

func agentickCategory(event string) string {
	for _, e := range agentickEvents {
		if e.Type == event {
			return e.Category
		}
	}
	return "gateway"
}

// ---- the gateway's state ----

// gateway is the surface on one hub: the clients connected here, the
// sessions they follow and the turns started here. Mount makes it.
type gateway struct {
	h      surface.Host
	id     string
	start  time.Time
	ctx    context.Context // ends with the hub
	cancel context.CancelFunc
	wg     sync.WaitGroup // turns, the drain watcher

	mu       sync.Mutex
	closed   bool
	clients  map[string]*agClient
	sessions map[string]*agSession
	activity map[string]time.Time // session → its last send here
}

// agSession is what the gateway keeps about a session: its subscribers
// here, and its turns started here (one at a time, so that each turn's
// execution_start … result … execution_end bracket its events).
type agSession struct {
	subs map[*agSub]struct{}
	// Turns run one at a time, in the order their sends were accepted
	// (under the gateway's mu): busy while one runs, queue the ready
	// channels of those waiting, first to be closed first.
	busy    bool
	queue   []chan struct{}
	running string // messageId of the running turn
	pending int    // turns started or waiting
}

// Mount serves the agentick surface on h: its WebSocket (an upgrade on
// GET /, or GET /agentick/ws), GET /events and POST /invoke. The gateway
// it makes lives with the hub: h closes it at shutdown (Track), and it
// ends its clients once the hub drains.
func Mount(h surface.Host) {
	gw := newGateway(h)
	gw.routes()
}

func newGateway(h surface.Host) *gateway {
	ctx, cancel := context.WithCancel(context.Background())
	gw := &gateway{h: h, id: "gw-" + h.ID(), start: time.Now(), ctx: ctx, cancel: cancel,
		clients: map[string]*agClient{}, sessions: map[string]*agSession{}, activity: map[string]time.Time{}}
	if !h.Track(gw) {
		gw.closed = true
		cancel()
	} else {
		gw.wg.Add(1)
		go gw.watchDrain()
	}
	return gw
}

// watchDrain closes the clients once the hub drains: their long polls
// would otherwise hold the drain up.
func (gw *gateway) watchDrain() {
	defer gw.wg.Done()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-gw.ctx.Done():
			return
		case <-t.C:
			if gw.h.Draining() {
				gw.killAll()
				return
			}
		}
	}
}

func (gw *gateway) killAll() {
	gw.mu.Lock()
	cs := make([]*agClient, 0, len(gw.clients))
	for _, c := range gw.clients {
		cs = append(cs, c)
	}
	gw.mu.Unlock()
	for _, c := range cs {
		if c.sse != nil && c.sse.idle() {
			// In its grace period: no connection whose end detaches it.
			c.cancel()
			gw.detach(c)
			continue
		}
		c.kill()
	}
}

// Close ends the clients and the turns, and waits for them.
func (gw *gateway) Close() {
	gw.mu.Lock()
	gw.closed = true
	gw.mu.Unlock()
	gw.cancel()
	gw.killAll()
	gw.wg.Wait()
}

func (gw *gateway) session(id string) *agSession {
	s := gw.sessions[id]
	if s == nil {
		s = &agSession{subs: map[*agSub]struct{}{}}
		gw.sessions[id] = s
	}
	return s
}

// tidy forgets a session nothing refers to (gw.mu held).
func (gw *gateway) tidy(id string) {
	if s := gw.sessions[id]; s != nil && len(s.subs) == 0 && s.pending == 0 {
		delete(gw.sessions, id)
	}
}

// ---- clients ----

// agClient is one connected client: a WebSocket, or an SSE stream.
type agClient struct {
	gw     *gateway
	id     string
	who    *auth.Principal
	ctx    context.Context // carries who; ends with the connection
	cancel context.CancelFunc
	push   func([]byte) bool // queues a frame without blocking
	// stream queues a streaming method's event, waiting for room (the
	// stream is held back meanwhile); false: the client is gone.
	stream func(ctx context.Context, b []byte) bool
	close  func()         // closes the transport
	wg     sync.WaitGroup // followers, request handlers
	sse    *agSSE         // an SSE client's event log (resume.go); nil on a WebSocket

	mu       sync.Mutex
	subs     map[string]*agSub
	channels map[string]struct{} // session + "\x00" + channel
}

// newClient makes client id of who, arriving on connection conn (its
// remote address, for the per-connection rate limit; "" if unknown).
func (gw *gateway) newClient(conn, id string, who *auth.Principal) *agClient {
	ctx, cancel := context.WithCancel(gw.h.WithCaller(gw.ctx, who, conn))
	return &agClient{gw: gw, id: id, who: who, ctx: ctx, cancel: cancel, subs: map[string]*agSub{}, channels: map[string]struct{}{}}
}

// attach makes c the client of its id. A client of that id already
// connected is replaced (a reconnect that came first) when it is the
// same caller; another caller's id is refused.
func (gw *gateway) attach(c *agClient) *agError {
	gw.mu.Lock()
	if gw.closed {
		gw.mu.Unlock()
		return agErr(agInternalError, "hub is shutting down")
	}
	old := gw.clients[c.id]
	if old != nil && gw.h.AuthOn() && !sameSubject(old.who, c.who) {
		gw.mu.Unlock()
		return agErr(agGuardDenied, "clientId %q is connected as another caller", c.id)
	}
	gw.clients[c.id] = c
	gw.mu.Unlock()
	if old != nil {
		old.kill()
	}
	return nil
}

// kill closes the client's transport; detach follows from it. It does
// not wait: it may run on a WebSocket's reader goroutine.
func (c *agClient) kill() {
	c.cancel()
	if c.close != nil {
		c.close()
	}
}

// detach forgets c and waits for its goroutines (not from one of them).
func (gw *gateway) detach(c *agClient) {
	c.cancel()
	if c.sse != nil {
		c.sse.shut()
	}
	gw.mu.Lock()
	if gw.clients[c.id] == c {
		delete(gw.clients, c.id)
	}
	gw.mu.Unlock()
	c.wg.Wait()
	c.mu.Lock()
	subs := c.subs
	c.subs = map[string]*agSub{}
	c.mu.Unlock()
	gw.mu.Lock()
	for sid, s := range subs {
		if ss := gw.sessions[sid]; ss != nil {
			delete(ss.subs, s)
			gw.tidy(sid)
		}
	}
	gw.mu.Unlock()
}

func (gw *gateway) client(id string) *agClient {
	gw.mu.Lock()
	defer gw.mu.Unlock()
	return gw.clients[id]
}

func (gw *gateway) clientCount() int {
	gw.mu.Lock()
	defer gw.mu.Unlock()
	return len(gw.clients)
}

// sameSubject reports whether a and b are tokens of one subject.
func sameSubject(a, b *auth.Principal) bool {
	return a != nil && b != nil && a.Claims != nil && b.Claims != nil && a.Subject == b.Subject
}
