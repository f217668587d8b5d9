package mono

import (
	"testing"
	"time"
)

// TestClock: Of and Time are inverses, and Now reads the clock Of maps to.
func TestClock(t *testing.T) {
	now := time.Now()
	if got := Time(Of(now)); !got.Equal(now) {
		t.Errorf("Time(Of(%v)) = %v", now, got)
	}
	before := Of(time.Now())
	n := Now()
	after := Of(time.Now())
	if n < before || n > after {
		t.Errorf("Now = %d; want within [%d, %d], the clock read around it", n, before, after)
	}
}
