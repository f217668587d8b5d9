package envelope_test

import (
	"encoding/hex"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/envelope"
)

func TestNewIDIsUUIDv7(t *testing.T) {
	id := envelope.NewID()
	parts := strings.Split(id, "-")
	if len(id) != 36 || len(parts) != 5 || len(parts[0]) != 8 || len(parts[1]) != 4 || len(parts[2]) != 4 || len(parts[3]) != 4 || len(parts[4]) != 12 {
		t.Fatalf("NewID() = %q; want 8-4-4-4-12 hex groups", id)
	}
	raw, err := hex.DecodeString(strings.ReplaceAll(id, "-", ""))
	if err != nil {
		t.Fatalf("NewID() = %q: %v", id, err)
	}
	if raw[6]>>4 != 7 || raw[8]>>6 != 2 {
		t.Errorf("NewID() = %q: version %d, variant %b; want 7 and 10", id, raw[6]>>4, raw[8]>>6)
	}
	var ms int64
	for _, b := range raw[:6] {
		ms = ms<<8 | int64(b)
	}
	if d := time.Since(time.UnixMilli(ms)); d < -time.Second || d > time.Second {
		t.Errorf("timestamp of %q is %v away from now", id, d)
	}
}

func TestNewIDUnique(t *testing.T) {
	seen := make(map[string]struct{}, 200000)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			local := make([]string, 25000)
			for i := range local {
				local[i] = envelope.NewID()
			}
			mu.Lock()
			defer mu.Unlock()
			for _, id := range local {
				if _, dup := seen[id]; dup {
					t.Errorf("duplicate id %s", id)
				}
				seen[id] = struct{}{}
			}
		})
	}
	wg.Wait()
}

func BenchmarkNewID(b *testing.B) {
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_ = envelope.NewID()
		}
	})
}
