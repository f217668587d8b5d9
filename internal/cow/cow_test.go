package cow_test

import (
	"sync"
	"testing"

	"github.com/agentmesh/agentmesh/internal/cow"
)

func TestMap(t *testing.T) {
	var m cow.Map[string, int]
	if _, ok := m.Load("a"); ok || m.Len() != 0 {
		t.Fatal("zero map not empty")
	}
	var wg sync.WaitGroup
	var created sync.Map
	for range 16 {
		wg.Go(func() {
			v := m.LoadOrCreate("a", func() int { created.Store(1, true); return 7 })
			if v != 7 {
				t.Errorf("LoadOrCreate = %d", v)
			}
		})
	}
	wg.Wait()
	m.LoadOrCreate("b", func() int { return 8 })
	sum := 0
	m.Range(func(_ string, v int) { sum += v })
	if sum != 15 || m.Len() != 2 {
		t.Errorf("sum %d len %d", sum, m.Len())
	}
	m.DeleteFunc(func(k string, _ int) bool { return k == "a" })
	if _, ok := m.Load("a"); ok || m.Len() != 1 {
		t.Error("DeleteFunc kept a")
	}
	if n := testing.AllocsPerRun(100, func() { m.Load("b") }); n != 0 {
		t.Errorf("Load allocates %v", n)
	}
}
