package chat

import (
	"context"
	"encoding/json"
	"sync"
	"time"

	wire "github.com/agentmesh/agentmesh/contract/chat"
)

// Event types of the Multica client streaming protocol.
const (
	EventMessageStart       = wire.EventMessageStart
	EventMessageUpdate      = wire.EventMessageUpdate
	EventMessageEnd         = wire.EventMessageEnd
	EventToolExecutionStart = wire.EventToolExecutionStart
	EventToolExecutionEnd   = wire.EventToolExecutionEnd
	EventCompactionStart    = wire.EventCompactionStart
	EventCompactionEnd      = wire.EventCompactionEnd
)

type (
	// StreamMessage is the message carried by message_* events.
	StreamMessage = wire.StreamMessage
	// Event is an AgentEvent or a CompactionEvent.
	Event = wire.Event
	// StreamPayload is the envelope of every streamed event.
	StreamPayload = wire.StreamPayload
	// SeqEvent is a StreamPayload with its position in the agent's event log.
	SeqEvent = wire.SeqEvent
	// EventsPage is the answer of chat.events.
	EventsPage = wire.EventsPage
)

// MaxPageBytes bounds the JSON size of one chat.events page. Every
// message_update carries the whole text so far, so a page of a long
// answer's events could otherwise pass a link's 1 MiB message limit, and
// the answer would cost the chat agent its link. A page always holds at
// least one event.
const MaxPageBytes = 256 << 10

// eventLog is an agent's bounded ring of events. Seq numbers start at 1
// and never repeat; a reader that falls behind by more than the ring's
// size is told how many it missed.
type eventLog struct {
	mu      sync.Mutex
	ring    []logged
	start   int    // index of the oldest event in ring
	n       int    // events held
	next    uint64 // seq of the next event
	changed chan struct{}
	closed  bool
	subs    map[int]func(SeqEvent)
	subID   int
}

// logged is an event of the ring with its JSON size, measured once when
// published.
type logged struct {
	SeqEvent
	size int
}

func newEventLog(size int) *eventLog {
	if size <= 0 {
		size = 1024
	}
	return &eventLog{ring: make([]logged, size), next: 1, changed: make(chan struct{}), subs: map[int]func(SeqEvent){}}
}

// publish appends p and wakes the readers; in-process subscribers are
// called synchronously, in order.
func (l *eventLog) publish(p StreamPayload, requestID string) {
	size := 64
	if b, err := json.Marshal(p); err == nil {
		size += len(b)
	}
	l.mu.Lock()
	ev := SeqEvent{Seq: l.next, StreamPayload: p, RequestID: requestID}
	l.next++
	le := logged{ev, size + len(requestID) + 16}
	if l.n < len(l.ring) {
		l.ring[(l.start+l.n)%len(l.ring)] = le
		l.n++
	} else {
		l.ring[l.start] = le
		l.start = (l.start + 1) % len(l.ring)
	}
	close(l.changed)
	l.changed = make(chan struct{})
	subs := make([]func(SeqEvent), 0, len(l.subs))
	for _, f := range l.subs {
		subs = append(subs, f)
	}
	l.mu.Unlock()
	for _, f := range subs {
		f(ev)
	}
}

// subscribe calls f with every event published from now on, until the
// returned function is called. f must not block.
func (l *eventLog) subscribe(f func(SeqEvent)) (cancel func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	id := l.subID
	l.subID++
	l.subs[id] = f
	return func() {
		l.mu.Lock()
		delete(l.subs, id)
		l.mu.Unlock()
	}
}

// close wakes the readers for good.
func (l *eventLog) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.closed = true
		close(l.changed)
	}
}

// read returns the events after afterSeq (at most max), waiting up to
// wait for the first one.
func (l *eventLog) read(ctx context.Context, afterSeq uint64, max int, wait time.Duration) EventsPage {
	if max <= 0 {
		max = 256
	}
	var t *time.Timer
	for {
		l.mu.Lock()
		page := EventsPage{Events: []SeqEvent{}, NextSeq: afterSeq, Closed: l.closed}
		if afterSeq >= l.next {
			// A seq from the future (an earlier process): start over.
			afterSeq = 0
		}
		oldest := l.next - uint64(l.n)
		if afterSeq+1 < oldest {
			page.Dropped = oldest - afterSeq - 1
		}
		bytes := 0
		for i := 0; i < l.n && len(page.Events) < max; i++ {
			ev := l.ring[(l.start+i)%len(l.ring)]
			if ev.Seq > afterSeq {
				if bytes += ev.size; bytes > MaxPageBytes && len(page.Events) > 0 {
					break
				}
				page.Events = append(page.Events, ev.SeqEvent)
			}
		}
		if len(page.Events) > 0 {
			page.NextSeq = page.Events[len(page.Events)-1].Seq
		} else if page.Dropped > 0 || afterSeq == 0 {
			page.NextSeq = l.next - 1
		}
		ch := l.changed
		l.mu.Unlock()
		if len(page.Events) > 0 || page.Closed || wait <= 0 {
			return page
		}
		if t == nil {
			t = time.NewTimer(wait)
			defer t.Stop()
		}
		select {
		case <-ch:
		case <-t.C:
			return page
		case <-ctx.Done():
			return page
		}
	}
}

// tail is where the log stands: no events, next_seq the last seq.
func (l *eventLog) tail() EventsPage {
	l.mu.Lock()
	defer l.mu.Unlock()
	return EventsPage{Events: []SeqEvent{}, NextSeq: l.next - 1, Closed: l.closed}
}

func intPtr(n int) *int { return &n }

func strPtr(s string) *string { return &s }
