package openai

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/surface"
)

// openAITurn is one completion being served.
type openAITurn struct {
	c         *openAICall
	req       *Request
	agentID   string
	transient bool
	content   string // what chat.send sends
	prompt    string // the text the request carried (for the usage estimate)
}

// serveCompletions is POST /v1/chat/completions.
func (s *server) serveCompletions(w http.ResponseWriter, r *http.Request) {
	ctx, ok := s.auth(w, r)
	if !ok {
		return
	}
	lim := s.h.ConnConfig().Limits
	limit := lim.MaxBytes
	tooBig := func() {
		e := envelope.Errorf(envelope.CodeInvalidRequest, "body exceeds the limit of %d bytes", limit)
		_, oe := openAIErrorOf(e)
		writeOpenAIErrorStatus(w, e, http.StatusRequestEntityTooLarge, oe)
	}
	if r.ContentLength > int64(limit) {
		tooBig() // refused before reading a byte of it
		return
	}
	data, err := link.ReadExact(http.MaxBytesReader(w, r.Body, int64(limit)), limit)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			tooBig()
			return
		}
		writeOpenAIError(w, envelope.NewError(envelope.CodeInvalidRequest, "cannot read the request body"))
		return
	}
	// The body is read: a turn may outlast the server's ReadTimeout, whose
	// deadline would otherwise cancel the request's context under it.
	_ = http.NewResponseController(w).SetReadDeadline(time.Time{})
	req, derr := DecodeRequest(data, lim)
	if derr != nil {
		writeOpenAIError(w, derr)
		return
	}
	t := &openAITurn{c: s.newCall(r), req: req}
	if err := t.open(ctx); err != nil {
		writeOpenAIError(w, envelope.AsError(err))
		return
	}
	defer t.close(ctx)
	if req.Stream {
		t.stream(ctx, w)
		return
	}
	res, err := t.send(ctx)
	if err != nil {
		writeOpenAIError(w, envelope.AsError(err))
		return
	}
	out := openAICompletion{ID: "chatcmpl-" + envelope.NewID(), Object: "chat.completion", Created: time.Now().Unix(), Model: req.Model,
		Choices: []openAIChoice{{Message: openAIAnswer{Role: "assistant", Content: res.Content}, FinishReason: "stop"}}}
	out.Usage = t.usage(res.Content)
	b, err := json.Marshal(out)
	if err != nil {
		writeOpenAIError(w, envelope.WrapError(envelope.CodeInternal, "cannot encode the answer", err))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// openAICompletion is a chat.completion object.
type openAICompletion struct {
	ID      string         `json:"id"`
	Object  string         `json:"object"`
	Created int64          `json:"created"`
	Model   string         `json:"model"`
	Choices []openAIChoice `json:"choices"`
	Usage   openAIUsage    `json:"usage"`
}

type openAIChoice struct {
	Index        int          `json:"index"`
	Message      openAIAnswer `json:"message"`
	FinishReason string       `json:"finish_reason"`
}

type openAIAnswer struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type openAIUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func estimateTokens(s string) int { return (len(s) + 3) / 4 }

func (t *openAITurn) usage(answer string) openAIUsage {
	u := openAIUsage{PromptTokens: estimateTokens(t.prompt), CompletionTokens: estimateTokens(answer)}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u
}

// open finds or creates the chat agent the model names and builds what
// is sent to it.
func (t *openAITurn) open(ctx context.Context) error {
	msgs := t.req.Messages
	last := msgs[len(msgs)-1]
	t.content = last.Text
	switch {
	case t.req.Model == Model:
		var system []string
		var transcript strings.Builder
		for _, m := range msgs[:len(msgs)-1] {
			if m.Role == "system" || m.Role == "developer" {
				if m.Text != "" {
					system = append(system, m.Text)
				}
				continue
			}
			transcript.WriteString(m.Role + ": " + m.Text + "\n")
		}
		prompt := strings.Join(system, "\n\n")
		if transcript.Len() > 0 {
			if prompt != "" {
				prompt += "\n\n"
			}
			prompt += "The conversation so far:\n" + strings.TrimSuffix(transcript.String(), "\n")
		}
		t.prompt = prompt + "\n" + t.content
		var b [8]byte
		_, _ = rand.Read(b[:])
		var created struct {
			AgentID string `json:"agent_id"`
		}
		// Not cancelled with the request: an agent created by a call
		// whose caller left would stay in the pool.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), openAIStepTimeout)
		defer cancel()
		if err := t.c.call(cctx, "chat.create", map[string]string{"agent_id": "oai-" + hex.EncodeToString(b[:]), "system_prompt": prompt}, &created); err != nil {
			return err
		}
		if created.AgentID == "" {
			return envelope.NewError(envelope.CodeInternal, "chat.create answered no agent_id")
		}
		t.agentID, t.transient = created.AgentID, true
		return nil
	case strings.HasPrefix(t.req.Model, openAIAgentPrefix) && len(t.req.Model) > len(openAIAgentPrefix):
		t.agentID = strings.TrimPrefix(t.req.Model, openAIAgentPrefix)
		t.prompt = t.content
		return nil
	}
	return envelope.Errorf(envelope.CodeAgentNotFound, "The model '%s' does not exist: use %s or chat/AGENT_ID (GET /v1/models)", t.req.Model, Model)
}

// close destroys a transient agent, even when the caller has gone.
func (t *openAITurn) close(ctx context.Context) {
	if !t.transient {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), openAIStepTimeout)
	defer cancel()
	_ = t.c.call(cctx, "chat.destroy", map[string]string{"agent_id": t.agentID}, nil)
}

type openAISendResult struct {
	Content   string `json:"content"`
	RequestID string `json:"request_id"`
}

type openAISendOutcome struct {
	res *openAISendResult
	err error
}

// send runs chat.send; when ctx ends first (the client went away) it
// cancels the turn and waits for the send to end.
func (t *openAITurn) send(ctx context.Context) (*openAISendResult, error) {
	s := t.newSend(ctx, newOpenAIRequestID())
	select {
	case o := <-s.done:
		s.finish()
		return o.res, o.err
	case <-ctx.Done():
		s.cancel()
		return nil, envelope.NewError(envelope.CodeCancelled, "the client went away")
	}
}

// runningSend is a chat.send in flight.
type runningSend struct {
	t        *openAITurn
	ctx      context.Context
	rid      string
	done     chan openAISendOutcome
	stop     context.CancelFunc
	finished bool
	gone     chan struct{} // closed when the events' reader left (leave)
	goneOnce sync.Once
}

// leave tells a streamed send that nothing reads its events any more.
func (s *runningSend) leave() { s.goneOnce.Do(func() { close(s.gone) }) }

// newSend starts chat.send in a goroutine whose context is detached from
// ctx: a client that goes away cancels the turn by chat.cancel (cancel).
// newOpenAIRequestID is the request_id of one completion's chat.send.
func newOpenAIRequestID() string { return "oai-" + envelope.NewID() }

func (t *openAITurn) newSend(ctx context.Context, rid string) *runningSend {
	return t.startSend(ctx, rid, nil)
}

// startSend is newSend; with events, chat.send runs as a stream whose
// chunks (the turn's events) go to events, closed before the answer: a
// client that stops reading holds the stream back (never the turn), and
// one that goes away ends it.
func (t *openAITurn) startSend(ctx context.Context, rid string, events chan<- surface.ChatEvent) *runningSend {
	s := &runningSend{t: t, ctx: ctx, rid: rid, done: make(chan openAISendOutcome, 1), gone: make(chan struct{})}
	var sctx context.Context
	sctx, s.stop = context.WithCancel(context.WithoutCancel(ctx))
	var emit func(uint64, json.RawMessage) error
	if events != nil {
		emit = func(_ uint64, data json.RawMessage) error {
			var e surface.ChatEvent
			if err := json.Unmarshal(data, &e); err != nil {
				return envelope.Errorf(envelope.CodeInternal, "chat.send streamed a chunk that is not an event: %v", err)
			}
			select {
			case events <- e:
				return nil
			case <-ctx.Done():
			case <-sctx.Done():
			case <-s.gone:
			}
			return envelope.NewError(envelope.CodeCancelled, "the completion's client is gone")
		}
	}
	go func() {
		var res openAISendResult
		err := t.c.callStream(sctx, "chat.send", map[string]string{"agentId": t.agentID, "content": t.content, "request_id": s.rid}, &res, emit)
		if events != nil {
			close(events)
		}
		s.done <- openAISendOutcome{&res, err}
	}()
	return s
}

// finish records that the send has answered.
func (s *runningSend) finish() {
	s.finished = true
	s.stop()
}

// cancel cancels a send that has not answered: chat.cancel with its
// request id, then it waits for the answer (at most openAIStepTimeout,
// after which the call itself is cancelled, which the link relays).
func (s *runningSend) cancel() {
	if s.finished {
		return
	}
	cctx, c := context.WithTimeout(context.WithoutCancel(s.ctx), openAIStepTimeout)
	_ = s.t.c.call(cctx, "chat.cancel", map[string]string{"agentId": s.t.agentID, "request_id": s.rid}, nil)
	c()
	timer := time.NewTimer(openAIStepTimeout)
	defer timer.Stop()
	select {
	case <-s.done:
	case <-timer.C:
		s.stop()
		<-s.done
	}
	s.finish()
}

// openAIEvent is the part of a chat event the stream reads.
type openAIEvent struct {
	Type    string `json:"type"`
	Message *struct {
		Content []struct {
			Type     string `json:"type"`
			Text     string `json:"text"`
			Thinking string `json:"thinking"`
		} `json:"content"`
		StopReason string `json:"stopReason"`
	} `json:"message"`
}

// openAIFinish maps a chat stop reason to OpenAI's finish_reason.
func openAIFinish(stop string) string {
	if stop == "max_tokens" {
		return "length"
	}
	return "stop"
}

// sseWriter writes a stream's chunks, the headers with the first one.
type sseWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	started bool
	failed  bool // a write failed: the client is gone
	id      string
	model   string
	created int64
}

func (s *sseWriter) start() {
	if s.started {
		return
	}
	s.started = true
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	s.w.WriteHeader(http.StatusOK)
}

func (s *sseWriter) write(b []byte) {
	s.start()
	if s.failed {
		return
	}
	if _, err := s.w.Write(b); err != nil {
		s.failed = true
		return
	}
	if err := s.rc.Flush(); err != nil {
		s.failed = true
	}
}

// chunk writes one chat.completion.chunk: delta (nil: {}), finish reason
// ("" : null), usage (nil: none; with usage the choices are empty).
func (s *sseWriter) chunk(delta map[string]string, finish string, usage *openAIUsage) {
	type choice struct {
		Index        int               `json:"index"`
		Delta        map[string]string `json:"delta"`
		FinishReason *string           `json:"finish_reason"`
	}
	c := struct {
		ID      string       `json:"id"`
		Object  string       `json:"object"`
		Created int64        `json:"created"`
		Model   string       `json:"model"`
		Choices []choice     `json:"choices"`
		Usage   *openAIUsage `json:"usage,omitempty"`
	}{ID: s.id, Object: "chat.completion.chunk", Created: s.created, Model: s.model, Usage: usage}
	if usage == nil {
		if delta == nil {
			delta = map[string]string{}
		}
		ch := choice{Delta: delta}
		if finish != "" {
			ch.FinishReason = &finish
		}
		c.Choices = []choice{ch}
	} else {
		c.Choices = []choice{}
	}
	b, _ := json.Marshal(c)
	s.write(append(append([]byte("data: "), b...), '\n', '\n'))
}

// stream serves a streamed completion: it runs chat.send as a stream and
// turns the turn's message events into deltas.
func (t *openAITurn) stream(ctx context.Context, w http.ResponseWriter) {
	sw := &sseWriter{w: w, rc: http.NewResponseController(w), id: "chatcmpl-" + envelope.NewID(), model: t.req.Model, created: time.Now().Unix()}
	rid := newOpenAIRequestID()
	events := make(chan surface.ChatEvent, 64)
	s := t.startSend(ctx, rid, events)
	defer func() {
		s.leave() // a failed write: the stream stops waiting on this loop
		s.cancel()
	}()

	var (
		stream, text, thinking string // the current message's, as sent
		anyText                bool   // some message of the turn had text
		finish                 = "stop"
		sendDone               bool
		res                    *openAISendResult
	)
	keep := time.NewTicker(openAIKeepAlive)
	defer keep.Stop()
	delta := func(e surface.ChatEvent) {
		var ev openAIEvent
		if json.Unmarshal(e.Event, &ev) != nil || ev.Message == nil {
			return
		}
		switch ev.Type {
		case "message_start", "message_update", "message_end":
		default:
			return
		}
		var tx, th strings.Builder
		for _, b := range ev.Message.Content {
			switch b.Type {
			case "text":
				tx.WriteString(b.Text)
			case "thinking":
				th.WriteString(b.Thinking)
			}
		}
		if e.StreamID != stream {
			if !sw.started {
				sw.chunk(map[string]string{"role": "assistant", "content": ""}, "", nil)
			}
			stream, text, thinking = e.StreamID, "", ""
		}
		d := map[string]string{}
		if nt := th.String(); len(nt) > len(thinking) && strings.HasPrefix(nt, thinking) {
			d["reasoning_content"] = nt[len(thinking):]
			thinking = nt
		}
		if nt := tx.String(); len(nt) > len(text) && strings.HasPrefix(nt, text) {
			add := nt[len(text):]
			if text == "" && anyText {
				add = "\n\n" + add // a new message of the same turn
			}
			d["content"] = add
			text, anyText = nt, true
		}
		if len(d) > 0 {
			sw.chunk(d, "", nil)
		}
		if ev.Type == "message_end" {
			finish = openAIFinish(ev.Message.StopReason)
		}
	}
	for events != nil || !sendDone {
		select {
		case e, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			delta(e)
		case o := <-s.done:
			s.finish()
			sendDone = true
			if o.err != nil {
				e := envelope.AsError(o.err)
				if !sw.started {
					writeOpenAIError(w, e)
					return
				}
				_, oe := openAIErrorOf(e)
				b, _ := json.Marshal(map[string]openAIError{"error": oe})
				sw.write(append(append([]byte("data: "), b...), '\n', '\n'))
				return
			}
			res = o.res
		case <-keep.C:
			sw.write([]byte(": keep-alive\n\n"))
		case <-ctx.Done():
			return // the deferred cancel ends the turn
		}
		if sw.failed {
			return
		}
	}
	if !sw.started {
		sw.chunk(map[string]string{"role": "assistant", "content": ""}, "", nil)
	}
	// What the events did not bring (a stream that fell behind the
	// agent's ring) comes from the answer: the rest of its last message.
	if rest, ok := strings.CutPrefix(res.Content, text); ok && rest != "" && utf8.ValidString(rest) {
		sw.chunk(map[string]string{"content": rest}, "", nil)
	}
	sw.chunk(nil, finish, nil)
	if t.req.StreamOptions != nil && t.req.StreamOptions.IncludeUsage {
		u := t.usage(res.Content)
		sw.chunk(nil, "", &u)
	}
	sw.write([]byte("data: [DONE]\n\n"))
}
