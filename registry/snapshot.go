package registry

import (
	"slices"
	"strings"
	"sync"
	"time"

	iradix "github.com/hashicorp/go-immutable-radix/v2"
)

// Snapshot is an immutable view of the registry, read by routers without
// locks. Its owner (Publisher) derives each new one from the last by the
// changes alone: the instances and the capabilities live in persistent
// radix trees (hashicorp/go-immutable-radix, Consul's and Nomad's state
// store), so that a registration, a departure or a state change costs
// the paths and the ready lists of that instance's capabilities, not the
// registry's size.
type Snapshot struct {
	Rev      uint64
	byID     *iradix.Tree[*Instance]
	caps     *iradix.Tree[*capEntry]
	streams  *iradix.Tree[int] // method → instances whose schemas declare it streaming
	patterns []string          // the pattern capabilities in caps ("memory.*", "*")
	prefixes []prefixEntry     // ready instances per pattern, longest first
	removed  *removal          // departures, newest first (Removed)
	floor    uint64            // departures up to this seq were dropped from the log

	listOnce sync.Once
	list     []*Instance
}

type prefixEntry struct {
	prefix    string // "memory." for "memory.*", "" for "*"
	instances []*Instance
}

// capEntry is one capability: how many instances serve it, which of them
// are ready, and, once none does, when the last left (it stays known for
// RecentTTL). An entry is never changed once in a published snapshot.
type capEntry struct {
	count int
	ready []*Instance
	left  time.Time
}

// removal is one departure in the log of departures.
type removal struct {
	seq  uint64
	in   *Instance
	next *removal
}

// NewSnapshot builds a snapshot of instances. recent lists capabilities
// whose last instance left not long ago: a call to them is answered
// UNAVAILABLE rather than METHOD_NOT_FOUND.
func NewSnapshot(rev uint64, instances []*Instance, recent []string) *Snapshot {
	b := newBuilder(empty, time.Now())
	instances = slices.Clone(instances)
	slices.SortFunc(instances, func(a, b *Instance) int { return strings.Compare(a.InstanceID, b.InstanceID) })
	for _, in := range instances { // in id order: the ready lists are too
		b.put(in)
	}
	for _, c := range recent {
		if b.touched[c] == nil {
			b.entry(c).left = b.now
		}
	}
	s, _ := b.commit(rev, nil, 0)
	return s
}

// Lookup returns the ready instances that serve method: exact names and
// every matching pattern. The result must not be modified.
func (s *Snapshot) Lookup(method string) []*Instance {
	var out []*Instance
	if e, ok := s.caps.Get([]byte(method)); ok {
		out = e.ready
	}
	shared := true
	for _, p := range s.prefixes {
		if !strings.HasPrefix(method, p.prefix) {
			continue
		}
		if len(out) == 0 {
			out = p.instances
			continue
		}
		if shared {
			out = slices.Clone(out)
			shared = false
		}
		for _, in := range p.instances {
			if !slices.Contains(out, in) {
				out = append(out, in)
			}
		}
	}
	return out
}

// Known reports whether any instance serves method now, in any state, or
// served it recently.
func (s *Snapshot) Known(method string) bool {
	if _, ok := s.caps.Get([]byte(method)); ok {
		return true
	}
	for _, c := range s.patterns {
		if Match(c, method) {
			return true
		}
	}
	return false
}

// Streaming reports whether an instance of the snapshot, in any state,
// declares method streaming in its schemas (Instance.StreamingMethods).
func (s *Snapshot) Streaming(method string) bool {
	if s.streams == nil {
		return false
	}
	n, _ := s.streams.Get([]byte(method))
	return n > 0
}

// Instance returns the instance with that id, or nil.
func (s *Snapshot) Instance(id string) *Instance {
	in, _ := s.byID.Get([]byte(id))
	return in
}

// Len is how many instances the snapshot holds.
func (s *Snapshot) Len() int { return s.byID.Len() }

// Instances returns every instance, in any state, sorted by id (made once
// per snapshot, on first use: listings and scrapes, not routing). The
// result must not be modified.
func (s *Snapshot) Instances() []*Instance {
	s.listOnce.Do(func() {
		s.list = make([]*Instance, 0, s.byID.Len())
		it := s.byID.Root().Iterator()
		for _, in, ok := it.Next(); ok; _, in, ok = it.Next() {
			s.list = append(s.list, in)
		}
	})
	return s.list
}

// Methods returns every capability (name or pattern) served by an instance
// in any state, with the instances serving it.
func (s *Snapshot) Methods() map[string][]*Instance {
	m := map[string][]*Instance{}
	for _, in := range s.Instances() {
		for _, c := range in.Capabilities {
			m[c] = append(m[c], in)
		}
	}
	return m
}

// Page returns up to limit instances after the id after (""; from the
// first), in id order, that keep (nil: all) accepts, and the id to pass
// as after for the next page ("" when none is left). It seeks to after
// in the tree: a page costs what it returns (and what keep skips), not
// the registry's size.
func (s *Snapshot) Page(after string, limit int, keep func(*Instance) bool) (page []*Instance, next string) {
	it := s.byID.Root().Iterator()
	it.SeekLowerBound([]byte(after))
	for k, in, ok := it.Next(); ok; k, in, ok = it.Next() {
		if string(k) == after {
			continue
		}
		if len(page) == limit {
			return page, page[len(page)-1].InstanceID
		}
		if keep == nil || keep(in) {
			page = append(page, in)
		}
	}
	return page, ""
}

// Removed returns the instances that left the registry after the
// departure numbered since, newest first, and the number of the newest
// departure in this snapshot; complete is false when the log no longer
// reaches back to since (compare with the whole snapshot instead).
func (s *Snapshot) Removed(since uint64) (gone []*Instance, upTo uint64, complete bool) {
	upTo = s.floor
	if s.removed != nil {
		upTo = s.removed.seq
	}
	for r := s.removed; r != nil && r.seq > since; r = r.next {
		gone = append(gone, r.in)
	}
	return gone, upTo, since >= s.floor
}

var empty = &Snapshot{byID: iradix.New[*Instance](), caps: iradix.New[*capEntry](), streams: iradix.New[int]()}

// Empty is the snapshot of an empty registry.
func Empty() *Snapshot { return empty }

// RecentTTL is how long a capability stays "known" after its last instance left.
const RecentTTL = 5 * time.Minute

// builder derives a snapshot from base by changes (a Publisher's batch).
type builder struct {
	base    *Snapshot
	now     time.Time
	byID    *iradix.Txn[*Instance]
	caps    *iradix.Txn[*capEntry]
	streams *iradix.Txn[int]
	touched map[string]*capEntry // entries copied in this batch, private until commit
	gone    []*Instance          // departures of this batch
}

func newBuilder(base *Snapshot, now time.Time) *builder {
	if base.byID == nil {
		base = empty
	}
	return &builder{base: base, now: now, byID: base.byID.Txn(), caps: base.caps.Txn(), streams: base.streams.Txn(), touched: map[string]*capEntry{}}
}

// entry returns capability c's entry for change in this batch.
func (b *builder) entry(c string) *capEntry {
	if e := b.touched[c]; e != nil {
		return e
	}
	e := &capEntry{}
	if old, ok := b.caps.Get([]byte(c)); ok {
		*e = *old
		e.ready = slices.Clone(old.ready)
	}
	b.touched[c] = e
	return e
}

// put adds in, or re-indexes it when it is there already (its state
// changed), replacing another instance of its id.
func (b *builder) put(in *Instance) {
	old, _ := b.byID.Get([]byte(in.InstanceID))
	if old != nil && old != in {
		b.drop(old, false)
	}
	ready := in.State() == StateReady
	for _, c := range in.Capabilities {
		e := b.entry(c)
		if old != in {
			e.count++
			e.left = time.Time{}
		}
		i := slices.Index(e.ready, in)
		switch {
		case ready && i < 0:
			e.ready = append(e.ready, in)
		case !ready && i >= 0:
			e.ready = slices.Delete(e.ready, i, i+1)
		}
	}
	if old != in {
		b.byID.Insert([]byte(in.InstanceID), in)
		b.stream(in, 1)
	}
}

// stream counts in's streaming methods in (d 1) or out (d -1).
func (b *builder) stream(in *Instance, d int) {
	for _, m := range in.StreamingMethods() {
		n, _ := b.streams.Get([]byte(m))
		if n += d; n > 0 {
			b.streams.Insert([]byte(m), n)
		} else {
			b.streams.Delete([]byte(m))
		}
	}
}

// drop removes in; gone: it left the registry (not replaced).
func (b *builder) drop(in *Instance, gone bool) {
	b.byID.Delete([]byte(in.InstanceID))
	b.stream(in, -1)
	for _, c := range in.Capabilities {
		e := b.entry(c)
		e.count--
		if i := slices.Index(e.ready, in); i >= 0 {
			e.ready = slices.Delete(e.ready, i, i+1)
		}
		if e.count <= 0 {
			e.count, e.left = 0, b.now
		}
	}
	if gone {
		b.gone = append(b.gone, in)
	}
}

// commit makes the snapshot: the touched entries go in (an entry no
// instance serves, left before expire, goes out), the patterns and their
// ready lists are made again if one changed, and the batch's departures
// join the log, numbered from seq (a log longer than maxLog is dropped).
func (b *builder) commit(rev uint64, expire func(c string, e *capEntry) bool, seq uint64) (*Snapshot, uint64) {
	patterns := false
	for c, e := range b.touched {
		if e.count == 0 && expire != nil && expire(c, e) {
			b.caps.Delete([]byte(c))
		} else {
			b.caps.Insert([]byte(c), e)
		}
		patterns = patterns || strings.HasSuffix(c, "*")
	}
	s := &Snapshot{Rev: rev, byID: b.byID.CommitOnly(), caps: b.caps.CommitOnly(), streams: b.streams.CommitOnly(), patterns: b.base.patterns,
		prefixes: b.base.prefixes, removed: b.base.removed, floor: b.base.floor}
	if patterns {
		s.patterns, s.prefixes = nil, nil
		it := s.caps.Root().Iterator()
		for k, e, ok := it.Next(); ok; k, e, ok = it.Next() {
			if c := string(k); strings.HasSuffix(c, "*") {
				s.patterns = append(s.patterns, c)
				if len(e.ready) > 0 {
					s.prefixes = append(s.prefixes, prefixEntry{c[:len(c)-1], e.ready})
				}
			}
		}
		slices.SortStableFunc(s.prefixes, func(a, b prefixEntry) int { return len(b.prefix) - len(a.prefix) })
	}
	if s.removed != nil && s.removed.seq-s.floor > maxLog {
		s.removed, s.floor = nil, s.removed.seq
	}
	for _, in := range b.gone {
		seq++
		s.removed = &removal{seq: seq, in: in, next: s.removed}
	}
	return s, seq
}

// maxLog bounds the departures a snapshot's log holds; a reader further
// behind compares with the whole snapshot (Removed's complete).
const maxLog = 4096
