// Package all mounts every protocol surface on a hub: what meshd serves
// and what the test kit's hubs serve. A binary that wants fewer mounts
// the surfaces it wants itself.
package all

import (
	"github.com/agentmesh/agentmesh/surface"
	"github.com/agentmesh/agentmesh/surface/agentick"
	"github.com/agentmesh/agentmesh/surface/mcp"
	"github.com/agentmesh/agentmesh/surface/multica"
	"github.com/agentmesh/agentmesh/surface/nexus3"
	"github.com/agentmesh/agentmesh/surface/openai"
)

// Mount mounts every surface on h.
func Mount(h surface.Host) {
	agentick.Mount(h)
	mcp.Mount(h)
	nexus3.Mount(h)
	multica.Mount(h)
	openai.Mount(h)
}
