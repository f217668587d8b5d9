// Package listing answers the hub's mesh.agents and mesh.methods from a
// registry snapshot: the whole list for a small mesh, pages with a cursor
// and filters, or a summary, so that a listing never crosses a link's
// message limit however many agents there are.
package listing

import (
	"encoding/json"
	"slices"
	"strings"

	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/registry"
)

// params decodes a listing's params; paged reports that any were given.
func params(method string, raw json.RawMessage) (p control.ListParams, paged bool, _ error) {
	if len(raw) == 0 || string(raw) == "null" || string(raw) == "{}" {
		return p, false, nil
	}
	if err := control.DecodeParams(method, raw, &p); err != nil {
		return p, false, err
	}
	if p.Limit == 0 {
		p.Limit = control.DefaultPage
	}
	if p.Limit < 1 || p.Limit > control.MaxPage {
		return p, false, envelope.Errorf(envelope.CodeInvalidParams, "%s: limit must be within 1..%d", method, control.MaxPage)
	}
	if p.State != "" && !registry.ValidState(p.State) {
		return p, false, envelope.Errorf(envelope.CodeInvalidParams, "%s: state %q is not a state of the registry", method, p.State)
	}
	return p, true, nil
}

func tooMany(method string, n int) error {
	return envelope.Errorf(envelope.CodeInvalidParams, "%s: %d entries are too many to list at once (at most %d): page with {\"limit\":N,\"cursor\":...}, or ask {\"summary\":true}", method, n, control.MaxUnpaged)
}

func agentInfo(in *registry.Instance) control.AgentInfo {
	return control.AgentInfo{
		AgentID: in.InstanceID, Name: in.Name, Hub: in.Hub, Status: in.State(), Load: in.Load(),
		InFlight: in.InFlight(), Methods: in.Capabilities, LastHeartbeat: in.LastHeartbeat().UTC(),
		RegisteredAt: in.RegisteredAt.UTC(),
	}
}

// Agents answers mesh.agents.
func Agents(snap *registry.Snapshot, raw json.RawMessage) (any, error) {
	p, paged, err := params("mesh.agents", raw)
	if err != nil {
		return nil, err
	}
	all := snap.Instances()
	if p.Summary {
		s := control.AgentsSummary{Agents: len(all), ByState: map[string]int{}, ByHub: map[string]int{}, Methods: len(snap.Methods())}
		for _, in := range all {
			s.ByState[in.State()]++
			s.ByHub[in.Hub]++
		}
		return s, nil
	}
	if !paged {
		if len(all) > control.MaxUnpaged {
			return nil, tooMany("mesh.agents", len(all))
		}
		out := make([]control.AgentInfo, 0, len(all))
		for _, in := range all {
			out = append(out, agentInfo(in))
		}
		return out, nil
	}
	keep := func(in *registry.Instance) bool {
		return (p.State == "" || in.State() == p.State) && (p.Hub == "" || in.Hub == p.Hub) &&
			(p.Method == "" || serves(in, p.Method))
	}
	page, next := snap.Page(p.Cursor, p.Limit, keep)
	out := control.AgentsPage{Agents: make([]control.AgentInfo, 0, len(page)), Next: next}
	for _, in := range page {
		out.Agents = append(out.Agents, agentInfo(in))
	}
	return out, nil
}

// serves reports whether in serves a method matching m (a name or a
// pattern).
func serves(in *registry.Instance, m string) bool {
	for _, c := range in.Capabilities {
		if c == m || registry.Match(m, c) || registry.Match(c, m) {
			return true
		}
	}
	return false
}

// Methods answers mesh.methods.
func Methods(snap *registry.Snapshot, raw json.RawMessage) (any, error) {
	p, paged, err := params("mesh.methods", raw)
	if err != nil {
		return nil, err
	}
	byMethod := snap.Methods()
	names := make([]string, 0, len(byMethod))
	for m := range byMethod {
		names = append(names, m)
	}
	slices.Sort(names)
	if p.Summary {
		return map[string]int{"methods": len(names)}, nil
	}
	if !paged && len(names) > control.MaxUnpaged {
		return nil, tooMany("mesh.methods", len(names))
	}
	var next string
	if paged {
		i, found := slices.BinarySearch(names, p.Cursor)
		if found {
			i++
		}
		var sel []string
		for ; i < len(names) && len(sel) < p.Limit; i++ {
			if strings.HasPrefix(names[i], p.Method) {
				sel = append(sel, names[i])
			}
		}
		if i < len(names) && len(sel) == p.Limit {
			next = sel[len(sel)-1]
		}
		names = sel
	}
	out := make([]control.MethodInfo, 0, len(names))
	for _, m := range names {
		out = append(out, info(byMethod[m], m, paged))
	}
	if !paged {
		return out, nil
	}
	return control.MethodsPage{Methods: out, Next: next}, nil
}

// info is the MethodInfo of capability m; in a page its agents are
// listed up to MaxMethodAgents (Count has them all).
func info(serving []*registry.Instance, m string, paged bool) control.MethodInfo {
	mi := control.MethodInfo{Method: m, Agents: []string{}}
	for _, in := range serving {
		mi.Count++
		if !paged || len(mi.Agents) < control.MaxMethodAgents {
			mi.Agents = append(mi.Agents, in.InstanceID)
		}
		if in.State() == registry.StateReady {
			mi.Ready++
		}
	}
	if !paged {
		mi.Count = 0
	}
	return mi
}
