package chat

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/telemetry"
)

// Config is a Runtime's settings. Zero values take the defaults noted.
type Config struct {
	// DataDir holds the session files (DataDir/sessions/ID.jsonl).
	// Default: DefaultDataDir().
	DataDir string
	// SystemPrompt is the system prompt of agents created without one.
	SystemPrompt string
	// TokenBudget is the context window the runtime keeps the context
	// under (system + tools + messages); past it, it compacts. Default 8000.
	TokenBudget int
	// KeepTokens is what a token compaction keeps (default TokenBudget/2).
	KeepTokens int
	// MaxMessages is the count budget of the context; past it, it
	// compacts. Default 200; negative: no count budget.
	MaxMessages int
	// KeepMessages is what a count compaction keeps (default MaxMessages/2).
	KeepMessages int
	// Summarize replaces the removed messages with a summary (compaction
	// reason "summary") instead of dropping them.
	Summarize bool
	// MaxToolRounds bounds the provider calls of one turn (default 8).
	MaxToolRounds int
	// MaxQueue bounds the sends waiting for an agent's running turn;
	// past it, send fails with OVERLOADED. Default 8.
	MaxQueue int
	// EventBuffer is the size of each agent's event ring (default 1024).
	EventBuffer int
}

// DefaultDataDir is $XDG_STATE_HOME/agentmesh/chat, else
// ~/.local/state/agentmesh/chat, else (no home) the user's config
// directory's agentmesh/chat.
func DefaultDataDir() string {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "agentmesh", "chat")
	}
	if h, err := os.UserHomeDir(); err == nil {
		return filepath.Join(h, ".local", "state", "agentmesh", "chat")
	}
	if d, err := os.UserConfigDir(); err == nil {
		return filepath.Join(d, "agentmesh", "chat")
	}
	return filepath.Join(os.TempDir(), "agentmesh-chat")
}

func (c *Config) defaults() {
	if c.DataDir == "" {
		c.DataDir = DefaultDataDir()
	}
	if c.TokenBudget <= 0 {
		c.TokenBudget = 8000
	}
	if c.KeepTokens <= 0 || c.KeepTokens > c.TokenBudget {
		c.KeepTokens = c.TokenBudget / 2
	}
	if c.MaxMessages == 0 {
		c.MaxMessages = 200
	}
	if c.KeepMessages <= 0 || (c.MaxMessages > 0 && c.KeepMessages > c.MaxMessages) {
		c.KeepMessages = max(c.MaxMessages/2, 1)
	}
	if c.MaxToolRounds <= 0 {
		c.MaxToolRounds = 8
	}
	if c.MaxQueue <= 0 {
		c.MaxQueue = 8
	}
}

// Runtime is the agent pool (NEXUS3's AgentPool).
type Runtime struct {
	cfg      Config
	provider Provider
	tools    *Tools
	genai    atomic.Pointer[telemetry.GenAI] // spans and GenAI metrics (SetTelemetry)

	mu     sync.Mutex
	agents map[string]*Agent
}

// NewRuntime returns a pool of agents whose turns run through p, with the
// tools of tools (nil: none). It does no I/O.
func NewRuntime(cfg Config, p Provider, tools *Tools) *Runtime {
	cfg.defaults()
	if p == nil {
		p = &Scripted{}
	}
	if tools == nil {
		tools = NewTools()
	}
	r := &Runtime{cfg: cfg, provider: p, tools: tools, agents: map[string]*Agent{}}
	r.genai.Store(telemetry.NewGenAI(nil))
	return r
}

// SetTelemetry instruments the runtime's turns after the OpenTelemetry
// GenAI conventions: an invoke_agent span per turn under the RPC that
// asked for it, and under it a chat span per model call (tokens, finish
// reason), an execute_tool span per tool call (a mesh_call's routed call
// is its child) and a compact span per compaction; t's metrics, if any,
// get gen_ai_client_token_usage and
// gen_ai_client_operation_duration_seconds. Without it (or with a t that
// does not trace) the spans are still made under a recording parent (the
// SERVER span of an agent served WithTelemetry), with that span's tracer
// provider. Call it before the runtime serves.
func (r *Runtime) SetTelemetry(t *telemetry.Telemetry) {
	g := telemetry.NewGenAI(t)
	g.InitModel(telemetry.GenAIChat, r.provider.Name(), requestModel(r.provider))
	r.genai.Store(g)
}

// Config returns the runtime's settings, defaults filled in.
func (r *Runtime) Config() Config { return r.cfg }

// Agent is one conversation: its history, context and event log.
type Agent struct {
	rt        *Runtime
	id        string
	createdAt time.Time
	file      *sessionFile
	events    *eventLog
	turn      chan struct{} // holds a token while a turn runs
	turnReq   string        // the running turn's request_id (the turn token held)
	waiting   atomic.Int32  // sends waiting for the turn

	mu             sync.Mutex
	systemPrompt   string
	history        []Message
	firstKept      int
	summary        string
	compactions    int
	conversation   int           // resets of this agent (in this pool)
	resetting      int           // Resets under way; sends that get the turn meanwhile yield it
	resetDone      chan struct{} // closed when resetting is back to 0
	shouldShutdown bool
	closed         bool
	running        map[string]context.CancelFunc // request id → cancel, queued or running
}

func newHexID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func agentNotFound(id string) error {
	return envelope.Errorf(envelope.CodeAgentNotFound, "Agent not found: %s", id)
}

// createdAtLayout is created_at's: UTC to the millisecond, always three
// digits (the session file keeps milliseconds: a resumed agent's time is
// the same instant, written the same way).
const createdAtLayout = "2006-01-02T15:04:05.000Z07:00"

// Create adds an agent. An empty id gets a new 8-hex one; an id whose
// session file exists resumes that history (a new systemPrompt, if given,
// replaces the stored one). An id already in the pool is INVALID_PARAMS.
func (r *Runtime) Create(id, systemPrompt string) (*CreateResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if id == "" {
		for {
			id = newHexID()
			if _, err := os.Stat(sessionPath(r.cfg.DataDir, id)); r.agents[id] == nil && errors.Is(err, os.ErrNotExist) {
				break
			}
		}
	}
	if !ValidAgentID(id) {
		return nil, envelope.Errorf(envelope.CodeInvalidParams, "invalid agent_id %q: want 1 to 128 of A-Z a-z 0-9 . _ -, not starting with . or -", id)
	}
	if r.agents[id] != nil {
		return nil, envelope.Errorf(envelope.CodeInvalidParams, "Agent already exists: %s", id)
	}
	f, st, err := openSession(r.cfg.DataDir, id)
	if err != nil {
		return nil, envelope.WrapError(envelope.CodeInternal, "cannot open the session file", err)
	}
	fresh := false // the session entry is written already
	if st.destroyed {
		// The id of an agent destroyed: a new agent, with a state of its
		// own (NEXUS3's isolation), not the old history resumed. The old
		// file is moved aside as a reset moves it (ID.jsonl.reset-UNIXMS).
		now := time.Now().UTC().Truncate(time.Millisecond)
		if systemPrompt == "" {
			systemPrompt = r.cfg.SystemPrompt
		}
		if _, err := f.moveAside(r.cfg.DataDir, id, now, entry{Type: entrySession, AgentID: id, CreatedAt: now.UnixMilli(), SystemPrompt: &systemPrompt}); err != nil {
			_ = f.close()
			return nil, envelope.WrapError(envelope.CodeInternal, "cannot move the destroyed agent's session file aside", err)
		}
		st, fresh = &state{agentID: id, createdAt: now.UnixMilli(), systemPrompt: systemPrompt}, true
	}
	resumed := st.agentID != "" && !fresh
	a := &Agent{
		rt: r, id: id, file: f, events: newEventLog(r.cfg.EventBuffer), turn: make(chan struct{}, 1),
		systemPrompt: st.systemPrompt, history: st.history, firstKept: st.firstKept, summary: st.summary,
		compactions: st.compactions, running: map[string]context.CancelFunc{},
	}
	if fresh {
		a.createdAt = time.UnixMilli(st.createdAt).UTC()
	} else if !resumed {
		a.createdAt = time.Now().UTC().Truncate(time.Millisecond)
		if systemPrompt == "" {
			systemPrompt = r.cfg.SystemPrompt
		}
		a.systemPrompt = systemPrompt
		err = f.append(entry{Type: entrySession, AgentID: id, CreatedAt: a.createdAt.UnixMilli(), SystemPrompt: &systemPrompt})
	} else {
		a.createdAt = time.UnixMilli(st.createdAt).UTC()
		if systemPrompt != "" && systemPrompt != st.systemPrompt {
			a.systemPrompt = systemPrompt
			err = f.append(entry{Type: entrySession, AgentID: id, SystemPrompt: &systemPrompt})
		}
	}
	if err != nil {
		_ = f.close()
		return nil, envelope.WrapError(envelope.CodeInternal, "cannot write the session file", err)
	}
	r.agents[id] = a
	return &CreateResult{AgentID: id, CreatedAt: a.createdAt.Format(createdAtLayout), Resumed: resumed, MessageCount: len(a.history)}, nil
}

// Get returns the agent id, or nil.
func (r *Runtime) Get(id string) *Agent {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.agents[id]
}

func (r *Runtime) agent(id string) (*Agent, error) {
	if id == "" {
		return nil, envelope.NewError(envelope.CodeInvalidParams, "Missing required parameter: agentId")
	}
	if a := r.Get(id); a != nil {
		return a, nil
	}
	return nil, agentNotFound(id)
}

// Destroy removes an agent from the pool: it cancels its turns, waits for
// the running one to end (until ctx ends) and closes its session file,
// which stays on disk. It reports whether the agent was there.
func (r *Runtime) Destroy(ctx context.Context, id string) bool {
	r.mu.Lock()
	a := r.agents[id]
	delete(r.agents, id)
	r.mu.Unlock()
	if a == nil {
		return false
	}
	a.close(ctx, true)
	return true
}

// Close destroys every agent.
func (r *Runtime) Close(ctx context.Context) {
	r.mu.Lock()
	all := make([]*Agent, 0, len(r.agents))
	for _, a := range r.agents {
		all = append(all, a)
	}
	r.agents = map[string]*Agent{}
	r.mu.Unlock()
	for _, a := range all {
		a.close(ctx, false) // the runtime stops: the agents resume with it
	}
}

// List describes the agents in the pool, oldest first.
func (r *Runtime) List() []AgentInfo {
	r.mu.Lock()
	all := make([]*Agent, 0, len(r.agents))
	for _, a := range r.agents {
		all = append(all, a)
	}
	r.mu.Unlock()
	sort.Slice(all, func(i, j int) bool {
		if !all[i].createdAt.Equal(all[j].createdAt) {
			return all[i].createdAt.Before(all[j].createdAt)
		}
		return all[i].id < all[j].id
	})
	out := make([]AgentInfo, 0, len(all))
	for _, a := range all {
		a.mu.Lock()
		out = append(out, AgentInfo{AgentID: a.id, CreatedAt: a.createdAt.Format(createdAtLayout), MessageCount: a.contextLen(), ShouldShutdown: a.shouldShutdown})
		a.mu.Unlock()
	}
	return out
}

// ShouldShutdown reports whether the pool has agents and all of them were
// asked to shut down.
func (r *Runtime) ShouldShutdown() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.agents) == 0 {
		return false
	}
	for _, a := range r.agents {
		a.mu.Lock()
		s := a.shouldShutdown
		a.mu.Unlock()
		if !s {
			return false
		}
	}
	return true
}

// Messages pages through an agent's history: from memory for an agent in
// the pool, else from its session file (a closed agent);
// AGENT_NOT_FOUND when there is neither. limit ≤ 0 means 50.
func (r *Runtime) Messages(id string, offset, limit int) (*MessagesPage, error) {
	if id == "" {
		return nil, envelope.NewError(envelope.CodeInvalidParams, "Missing required parameter: agentId")
	}
	if offset < 0 {
		return nil, envelope.NewError(envelope.CodeInvalidParams, "offset must not be negative")
	}
	if limit <= 0 {
		limit = 50
	}
	var hist []Message
	if a := r.Get(id); a != nil {
		a.mu.Lock()
		hist = a.history[:len(a.history):len(a.history)]
		a.mu.Unlock()
	} else {
		st, err := readSession(r.cfg.DataDir, id)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return nil, envelope.Errorf(envelope.CodeAgentNotFound, "No session found for agent: %s", id)
			}
			return nil, envelope.WrapError(envelope.CodeInternal, "cannot read the session file", err)
		}
		hist = st.history
	}
	page := &MessagesPage{Messages: []Message{}, Total: len(hist), Offset: offset, Limit: limit}
	if offset < len(hist) {
		page.Messages = append(page.Messages, hist[offset:min(len(hist), offset+limit)]...)
	}
	return page, nil
}

// ID returns the agent's id.
func (a *Agent) ID() string { return a.id }

// contextLen is the number of messages in the context (a.mu held).
func (a *Agent) contextLen() int {
	n := len(a.history) - a.firstKept
	if a.summary != "" {
		n++
	}
	return n
}

// Subscribe calls f with each event the agent publishes from now on until
// cancel is called; f runs on the turn's goroutine and must not block.
func (a *Agent) Subscribe(f func(SeqEvent)) (cancel func()) { return a.events.subscribe(f) }

// Events returns the events after afterSeq, waiting up to wait for one.
func (a *Agent) Events(ctx context.Context, afterSeq uint64, max int, wait time.Duration) EventsPage {
	return a.events.read(ctx, afterSeq, max, wait)
}

// close stops the agent: its turns cancelled and waited for, its file
// closed; destroyed: the file's last entry says so first.
func (a *Agent) close(ctx context.Context, destroyed bool) {
	a.mu.Lock()
	a.closed = true
	for _, cancel := range a.running {
		cancel()
	}
	a.mu.Unlock()
	// Wait for the running turn, so that the file is not closed under it.
	select {
	case a.turn <- struct{}{}:
		<-a.turn
	case <-ctx.Done():
	}
	if destroyed {
		_ = a.file.closeWith(&entry{Type: entryDestroyed})
	} else {
		_ = a.file.close()
	}
	a.events.close()
}

// Shutdown marks the agent as wanting shutdown: its running turn ends as
// it would, and it takes no more sends (UNAVAILABLE).
func (a *Agent) Shutdown() {
	a.mu.Lock()
	a.shouldShutdown = true
	a.mu.Unlock()
}

// Cancel cancels the send with this request id, running or queued. It
// reports whether there was one.
func (a *Agent) Cancel(requestID string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	cancel, ok := a.running[requestID]
	if ok {
		cancel()
		delete(a.running, requestID)
	}
	return ok
}

// resetWindowHook, set by a test, runs in Reset between cancelling the
// sends in flight and taking the turn.
var resetWindowHook func(*Agent)

// Reset clears the agent's conversation: it cancels the sends in flight
// (the running turn and the queued ones, as Destroy does: a reset is a
// whole-conversation operation, and the mesh has no code for "busy" that
// a caller would not retry blindly), waits for the running turn to end
// (until ctx ends: then CANCELLED, and nothing changed), moves the
// session file aside as ID.jsonl.reset-UNIXMS (so the old conversation,
// the cancelled turn's partial answer included, stays on disk) and starts
// an empty one with the same id, creation time and system prompt: no
// history, no summary, no compactions, so its tokens are those of the
// system prompt and tools alone. The event log goes on (seqs never
// repeat); sends that arrive while it runs wait and then run on the empty
// history, unless they name the conversation before (SendIn).
func (a *Agent) Reset(ctx context.Context) (*ResetResult, error) {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil, agentNotFound(a.id)
	}
	res := &ResetResult{AgentID: a.id}
	for id, cancel := range a.running {
		cancel()
		delete(a.running, id)
		res.Cancelled++
	}
	// From here until it is done, a send that gets the turn first (it
	// registered after the loop above) yields it and waits, so that it
	// runs on the empty history.
	if a.resetting++; a.resetDone == nil {
		a.resetDone = make(chan struct{})
	}
	a.mu.Unlock()
	if h := resetWindowHook; h != nil {
		h(a)
	}
	defer func() {
		a.mu.Lock()
		if a.resetting--; a.resetting == 0 {
			close(a.resetDone)
			a.resetDone = nil
		}
		a.mu.Unlock()
	}()
	select {
	case a.turn <- struct{}{}:
	case <-ctx.Done():
		return nil, envelope.Errorf(envelope.CodeCancelled, "reset of %s: the running turn did not end in time; nothing was reset", a.id)
	}
	defer func() { <-a.turn }()
	a.mu.Lock()
	closed, prompt := a.closed, a.systemPrompt
	res.Removed = len(a.history)
	a.mu.Unlock()
	if closed {
		return nil, agentNotFound(a.id)
	}
	aside, err := a.file.moveAside(a.rt.cfg.DataDir, a.id, time.Now(),
		entry{Type: entrySession, AgentID: a.id, CreatedAt: a.createdAt.UnixMilli(), SystemPrompt: &prompt})
	if err != nil {
		return nil, envelope.WrapError(envelope.CodeInternal, "cannot move the session file aside", err)
	}
	res.MovedTo = filepath.Base(aside)
	a.mu.Lock()
	a.history, a.firstKept, a.summary, a.compactions = nil, 0, "", 0
	a.conversation++
	a.mu.Unlock()
	return res, nil
}

// Tokens estimates the context's tokens.
func (a *Agent) Tokens() Tokens {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.tokens()
}

func (a *Agent) tokens() Tokens {
	t := Tokens{System: EstimateTokens(a.systemPrompt), Tools: toolTokens(a.rt.tools.Specs()), Budget: a.rt.cfg.TokenBudget}
	for i := a.firstKept; i < len(a.history); i++ {
		t.Messages += messageTokens(&a.history[i])
	}
	if a.summary != "" {
		t.Messages += 4 + EstimateTokens(a.summary)
	}
	t.Total = t.System + t.Tools + t.Messages
	t.Available = max(0, t.Budget-t.Total)
	return t
}

// Context describes the agent's context.
func (a *Agent) Context() ContextInfo {
	busy := len(a.turn) > 0
	a.mu.Lock()
	defer a.mu.Unlock()
	return ContextInfo{
		AgentID: a.id, MessageCount: a.contextLen(), HistoryCount: len(a.history), SystemPrompt: a.systemPrompt,
		Summary: a.summary, Compactions: a.compactions, MaxMessages: a.rt.cfg.MaxMessages,
		CreatedAt: a.createdAt.Format(createdAtLayout), ShouldShutdown: a.shouldShutdown, Busy: busy, Tokens: a.tokens(),
		Conversation: a.conversation,
	}
}

// Send runs one turn: it appends the user's message, calls the provider
// (and the tools it asks for, up to MaxToolRounds), streaming events, and
// answers the last assistant message's text. Sends to one agent run one at
// a time, in arrival order; past MaxQueue waiting, OVERLOADED. A cancelled
// send (Cancel, or ctx) fails with CANCELLED; what was streamed so far is
// kept in the history as an assistant message with stopReason "aborted".
func (a *Agent) Send(ctx context.Context, content, requestID string) (*SendResult, error) {
	return a.send(ctx, content, requestID, nil)
}

// SendIn is Send for the conversation conversation (ContextInfo's): if
// the agent was reset since, so that the message would open the new
// conversation instead of going on with the one it was written for, it
// fails with CANCELLED without running (when its turn comes: a reset
// while it waits counts).
func (a *Agent) SendIn(ctx context.Context, conversation int, content, requestID string) (*SendResult, error) {
	return a.send(ctx, content, requestID, &conversation)
}
