package hub

import (
	"time"

	"github.com/agentmesh/agentmesh/link"
)

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// linkPrincipal is who the peer of l authenticated as (nil: nobody).
func linkPrincipal(l *link.Link) *Principal {
	if l == nil {
		return nil
	}
	p, _ := l.Owner().(*Principal)
	return p
}
