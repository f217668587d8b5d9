package cli_test

import (
	"encoding/json"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/cli"
	"github.com/agentmesh/agentmesh/internal/freeport"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
)

// parsedHubs parses args as meshctl would for the command they name and
// returns the --hub list that command sees.
func parsedHubs(t *testing.T, args ...string) []string {
	t.Helper()
	root := cli.NewMeshctl(strings.NewReader(""), io.Discard, io.Discard)
	cmd, rest, err := root.Find(args)
	if err != nil {
		t.Fatalf("meshctl %v: %v", args, err)
	}
	if err := cmd.ParseFlags(rest); err != nil {
		t.Fatalf("meshctl %v: %v", args, err)
	}
	f := cmd.Flags().Lookup("hub")
	if f == nil {
		t.Fatalf("meshctl %v: no --hub flag", args)
	}
	list, ok := f.Value.(interface{ GetSlice() []string })
	if !ok {
		t.Fatalf("meshctl %v: --hub is a %s flag, not a list", args, f.Value.Type())
	}
	return list.GetSlice()
}

// TestHubFlagRepeatedAndCommaSeparated: --hub given twice and --hub given
// a comma list both make the list [a b], on the client commands and on
// agent run (the flag is meshctl's, persistent); mixing the forms
// appends in order; MESH_HUB is split the same way and a flag replaces
// it rather than adding to it.
func TestHubFlagRepeatedAndCommaSeparated(t *testing.T) {
	t.Setenv("MESH_HUB", "")
	const a, b = "ws://hub-a:7070/ws", "ws://hub-b:7070/ws"
	for _, cmd := range [][]string{{"call", "echo.echo"}, {"agents"}, {"methods"}, {"agent", "run", "echo"}} {
		for _, form := range [][]string{
			{"--hub", a, "--hub", b},
			{"--hub", a + "," + b},
			{"--hub=" + a, "--hub=" + b},
			{"--hub=" + a + "," + b},
		} {
			args := append(slices.Clone(cmd), form...)
			if got := parsedHubs(t, args...); !slices.Equal(got, []string{a, b}) {
				t.Errorf("meshctl %s: --hub = %q; want [%s %s]", strings.Join(args, " "), got, a, b)
			}
		}
	}
	const c = "ws://hub-c:7070/ws"
	if got := parsedHubs(t, "agents", "--hub", a+","+b, "--hub", c); !slices.Equal(got, []string{a, b, c}) {
		t.Errorf("--hub a,b --hub c = %q; want [a b c]", got)
	}

	t.Setenv("MESH_HUB", a+","+b)
	if got := parsedHubs(t, "agents"); !slices.Equal(got, []string{a, b}) {
		t.Errorf("MESH_HUB=a,b: --hub = %q; want [a b]", got)
	}
	if got := parsedHubs(t, "agents", "--hub", c); !slices.Equal(got, []string{c}) {
		t.Errorf("MESH_HUB=a,b --hub c: --hub = %q; want [c] (the flag replaces the variable)", got)
	}
}

// TestHubFlagListReachesTheClient: with a dead hub first and a live one
// second, in either form (spaces after the commas too), meshctl agents is
// answered by the live hub: the whole list reaches the client, which
// tries the hubs in turn.
func TestHubFlagListReachesTheClient(t *testing.T) {
	t.Setenv("MESH_HUB", "")
	m := meshtest.Start(t, hub.Config{})
	m.RunAgent(t, agents.NewEcho(agents.WithID("echo-hubflag")))
	dead := "ws://" + freeport.Addr(t) + "/ws" // nothing listens there: a refused dial
	for _, form := range [][]string{{"--hub", dead, "--hub", m.WS}, {"--hub", dead + "," + m.WS}, {"--hub", dead + ", " + m.WS + " "}} {
		r := meshctl(t, "", append([]string{"agents", "-o", "json"}, form...)...)
		var list []control.AgentInfo
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &list) != nil || len(list) != 1 || list[0].AgentID != "echo-hubflag" {
			t.Errorf("meshctl agents %s: exit %d, stdout %q, stderr %q; want the live hub's agent", strings.Join(form, " "), r.code, r.stdout, r.stderr)
		}
	}
}
