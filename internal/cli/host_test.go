package cli

import (
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/surface"
)

// The hub is what the surfaces mount on.
var _ surface.Host = (*hub.Hub)(nil)
