package registry

import (
	"encoding/json"
	"sync"
)

// A fleet is mostly many instances of few kinds of agent: the same name,
// capabilities, intents and declared schemas, registration after
// registration (and, in a cluster, record after record read from etcd).
// NewInstance keeps one copy of each such value, so that an instance
// costs its own fields only: the schemas of an echo agent are 1.4 KB, its
// capability names another 0.8 KB once decoded. The table is bounded: past
// maxShared distinct values, new ones are kept as they came.
var shared struct {
	mu   sync.Mutex
	strs map[string]string
	raws map[string]json.RawMessage
}

const maxShared = 4096

func shareStrings(ss []string) []string {
	if len(ss) == 0 {
		return ss
	}
	out := make([]string, len(ss))
	shared.mu.Lock()
	defer shared.mu.Unlock()
	for i, s := range ss {
		out[i] = shareLocked(s)
	}
	return out
}

func shareLocked(s string) string {
	if v, ok := shared.strs[s]; ok {
		return v
	}
	if shared.strs == nil {
		shared.strs = map[string]string{}
	}
	if len(shared.strs) < maxShared {
		shared.strs[s] = s
	}
	return s
}

func shareString(s string) string {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	return shareLocked(s)
}

// shareRaw returns the shared copy of b (which must not be changed after,
// by anyone: a RawMessage in a Registration is read-only).
func shareRaw(b json.RawMessage) json.RawMessage {
	if len(b) == 0 {
		return b
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if v, ok := shared.raws[string(b)]; ok {
		return v
	}
	if shared.raws == nil {
		shared.raws = map[string]json.RawMessage{}
	}
	if len(shared.raws) < maxShared {
		shared.raws[string(b)] = b
	}
	return b
}
