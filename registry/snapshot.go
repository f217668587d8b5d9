package registry

import (
	"slices"
	"strings"
	"time"
)

// Snapshot is an immutable view of the registry, rebuilt by its owner on
// every membership or state change and read by routers without locks.
type Snapshot struct {
	Rev       uint64
	instances []*Instance // sorted by id
	byID      map[string]*Instance
	exact     map[string][]*Instance // ready instances per exact capability
	prefixes  []prefixEntry          // ready instances per pattern, longest first
	known     map[string]struct{}    // every capability registered now or recently
}

type prefixEntry struct {
	prefix    string // "memory." for "memory.*", "" for "*"
	instances []*Instance
}

// NewSnapshot builds a snapshot of instances. recent lists capabilities
// whose last instance left not long ago: a call to them is answered
// UNAVAILABLE rather than METHOD_NOT_FOUND.
func NewSnapshot(rev uint64, instances []*Instance, recent []string) *Snapshot {
	s := &Snapshot{
		Rev:       rev,
		instances: slices.Clone(instances),
		byID:      make(map[string]*Instance, len(instances)),
		exact:     make(map[string][]*Instance),
		known:     make(map[string]struct{}),
	}
	slices.SortFunc(s.instances, func(a, b *Instance) int { return strings.Compare(a.InstanceID, b.InstanceID) })
	pre := map[string][]*Instance{}
	for _, in := range s.instances {
		s.byID[in.InstanceID] = in
		ready := in.State() == StateReady
		for _, c := range in.Capabilities {
			s.known[c] = struct{}{}
			if !ready {
				continue
			}
			if strings.HasSuffix(c, "*") {
				p := c[:len(c)-1]
				pre[p] = append(pre[p], in)
			} else {
				s.exact[c] = append(s.exact[c], in)
			}
		}
	}
	for _, c := range recent {
		s.known[c] = struct{}{}
	}
	for p, ins := range pre {
		s.prefixes = append(s.prefixes, prefixEntry{p, ins})
	}
	slices.SortFunc(s.prefixes, func(a, b prefixEntry) int { return len(b.prefix) - len(a.prefix) })
	return s
}

// Lookup returns the ready instances that serve method: exact names and
// every matching pattern. The result must not be modified.
func (s *Snapshot) Lookup(method string) []*Instance {
	out := s.exact[method]
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
	if _, ok := s.known[method]; ok {
		return true
	}
	for c := range s.known {
		if strings.HasSuffix(c, "*") && Match(c, method) {
			return true
		}
	}
	return false
}

// Instance returns the instance with that id, or nil.
func (s *Snapshot) Instance(id string) *Instance { return s.byID[id] }

// Instances returns every instance, in any state, sorted by id. The result
// must not be modified.
func (s *Snapshot) Instances() []*Instance { return s.instances }

// Methods returns every capability (name or pattern) served by an instance
// in any state, with the instances serving it, sorted by name.
func (s *Snapshot) Methods() map[string][]*Instance {
	m := map[string][]*Instance{}
	for _, in := range s.instances {
		for _, c := range in.Capabilities {
			m[c] = append(m[c], in)
		}
	}
	return m
}

// Empty is the snapshot of an empty registry.
func Empty() *Snapshot { return NewSnapshot(0, nil, nil) }

// recentTTL is how long a capability stays "known" after its last instance left.
const RecentTTL = 5 * time.Minute

// Page returns up to limit instances after the id after (""; from the
// first), in id order, that keep (nil: all) accepts, and the id to pass
// as after for the next page ("" when none is left). It seeks to after
// by binary search: a page costs what it returns (and what keep skips),
// not the registry's size.
func (s *Snapshot) Page(after string, limit int, keep func(*Instance) bool) (page []*Instance, next string) {
	i, _ := slices.BinarySearchFunc(s.instances, after, func(in *Instance, id string) int { return strings.Compare(in.InstanceID, id) })
	if i < len(s.instances) && s.instances[i].InstanceID == after {
		i++
	}
	for ; i < len(s.instances) && len(page) < limit; i++ {
		if keep == nil || keep(s.instances[i]) {
			page = append(page, s.instances[i])
		}
	}
	if i < len(s.instances) && len(page) == limit {
		next = page[len(page)-1].InstanceID
	}
	return page, next
}
