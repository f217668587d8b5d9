package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/mesh"
)

// listFlags are the filters and paging of meshctl agents and methods.
type listFlags struct {
	output  string
	page    int
	method  string
	state   string
	hub     string
	summary bool
}

func (f *listFlags) add(cmd *cobra.Command, agents bool) {
	fl := cmd.Flags()
	fl.StringVarP(&f.output, "output", "o", "", "table or json (default: table on a terminal, else json)")
	fl.IntVar(&f.page, "page-size", control.DefaultPage, "entries fetched per call (the listing follows the hub's cursor to the end)")
	if agents {
		fl.StringVar(&f.method, "method", "", "only agents serving a method matching this name or pattern (e.g. memory.*)")
		fl.StringVar(&f.state, "state", "", "only agents in this state (ready, busy, draining, ...)")
		fl.StringVar(&f.hub, "hub-id", "", "only agents attached to this hub")
		fl.BoolVar(&f.summary, "summary", false, "print counts by state and by hub instead of the list")
	} else {
		fl.StringVar(&f.method, "prefix", "", "only methods starting with this prefix")
	}
}

// pages calls method page by page (ListParams) until the cursor runs out,
// handing each page's raw answer to fn, which returns its next cursor.
func (g *ctlFlags) pages(ctx context.Context, method string, p control.ListParams, fn func(json.RawMessage) (string, error)) error {
	c, err := g.client()
	if err != nil {
		return err
	}
	defer c.Close()
	for {
		var raw json.RawMessage
		if err := c.Call(ctx, method, p, &raw, mesh.CallTimeout(g.timeout)); err != nil {
			return g.callErr(err, false)
		}
		next, err := fn(raw)
		if err != nil {
			return withCode(ExitError, fmt.Errorf("unexpected answer to %s: %v", method, err))
		}
		if next == "" || next == p.Cursor {
			return nil
		}
		p.Cursor = next
	}
}

func (g *ctlFlags) agentsCmd() *cobra.Command {
	var f listFlags
	cmd := &cobra.Command{
		Use:   "agents",
		Short: "List the registered agents (mesh.agents, page by page)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			table, err := outputMode(f.output, g.stdout, "table", "json")
			if err != nil {
				return err
			}
			p := control.ListParams{Limit: f.page, Method: f.method, State: f.state, Hub: f.hub, Summary: f.summary}
			if f.summary {
				return g.pages(cmd.Context(), "mesh.agents", p, func(raw json.RawMessage) (string, error) {
					if !table {
						fmt.Fprintf(g.stdout, "%s\n", raw)
						return "", nil
					}
					var s control.AgentsSummary
					if err := json.Unmarshal(raw, &s); err != nil {
						return "", err
					}
					fmt.Fprintf(g.stdout, "%d agents, %d methods\n", s.Agents, s.Methods)
					printCounts(g, "STATE", s.ByState)
					printCounts(g, "HUB", s.ByHub)
					return "", nil
				})
			}
			all := []control.AgentInfo{}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			if table {
				fmt.Fprintln(tw, "AGENT ID\tNAME\tSTATUS\tLOAD\tINFLIGHT\tLAST HEARTBEAT\tMETHODS")
			}
			err = g.pages(cmd.Context(), "mesh.agents", p, func(raw json.RawMessage) (string, error) {
				var page control.AgentsPage
				if err := json.Unmarshal(raw, &page); err != nil {
					return "", err
				}
				for _, a := range page.Agents {
					if table {
						fmt.Fprintf(tw, "%s\t%s\t%s\t%.2f\t%d\t%s ago\t%s\n", a.AgentID, a.Name, a.Status, a.Load, a.InFlight,
							time.Since(a.LastHeartbeat).Round(100*time.Millisecond), strings.Join(a.Methods, ","))
					}
				}
				all = append(all, page.Agents...)
				return page.Next, nil
			})
			if err != nil {
				return err
			}
			if table {
				return tw.Flush()
			}
			return printJSON(g, all)
		},
	}
	f.add(cmd, true)
	return cmd
}

func (g *ctlFlags) methodsCmd() *cobra.Command {
	var f listFlags
	cmd := &cobra.Command{
		Use:   "methods",
		Short: "List the methods served and the agents serving them (mesh.methods, page by page)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			table, err := outputMode(f.output, g.stdout, "table", "json")
			if err != nil {
				return err
			}
			all := []control.MethodInfo{}
			err = g.pages(cmd.Context(), "mesh.methods", control.ListParams{Limit: f.page, Method: f.method}, func(raw json.RawMessage) (string, error) {
				var page control.MethodsPage
				if err := json.Unmarshal(raw, &page); err != nil {
					return "", err
				}
				all = append(all, page.Methods...)
				return page.Next, nil
			})
			if err != nil {
				return err
			}
			if !table {
				return printJSON(g, all)
			}
			tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "METHOD\tREADY\tAGENTS")
			for _, m := range all {
				sort.Strings(m.Agents)
				agents := strings.Join(m.Agents, ",")
				if m.Count > len(m.Agents) {
					agents += fmt.Sprintf(", … (%d in all)", m.Count)
				}
				fmt.Fprintf(tw, "%s\t%d/%d\t%s\n", m.Method, m.Ready, max(m.Count, len(m.Agents)), agents)
			}
			return tw.Flush()
		},
	}
	f.add(cmd, false)
	return cmd
}

func printCounts(g *ctlFlags, what string, m map[string]int) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	tw := tabwriter.NewWriter(g.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "%s\tAGENTS\n", what)
	for _, k := range keys {
		fmt.Fprintf(tw, "%s\t%d\n", k, m[k])
	}
	_ = tw.Flush()
}

// printJSON prints v as one JSON document (an array, for a listing: the
// same shape as an unpaged answer).
func printJSON(g *ctlFlags, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return withCode(ExitError, err)
	}
	fmt.Fprintf(g.stdout, "%s\n", b)
	return nil
}
