package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/bench"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/stream"
)

func (g *ctlFlags) streamCmd() *cobra.Command {
	var output string
	var window int
	cmd := &cobra.Command{
		Use:   "stream METHOD [PARAMS_JSON|@FILE|-]",
		Short: "Call a streaming method and print its chunks as they arrive",
		Long: `Call a streaming method and print each chunk as it arrives.

-o json (the default off a terminal) prints one chunk per line (NDJSON) and
nothing else on stdout; -o pretty prints each chunk with its sequence number
and the time since the call, then the end: the chunk count, the time to the
first chunk and the result. --window is the chunks meshctl may hold unread
(its credit): the agent is held back beyond it. The stream's deadline is
--timeout when given, else 5 minutes (the kOS seed's stream ttl). On an error
it prints "CODE: message" (with the last sequence number received) on stderr
and exits 1.`,
		Example: `  meshctl stream echo.stream '{"n":5,"intervalMs":200}'
  meshctl stream llm.generate '{"prompt":"hi"}' -o json | jq .token`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			pretty, err := outputMode(output, g.stdout, "pretty", "json")
			if err != nil {
				return err
			}
			var params json.RawMessage
			if len(args) == 2 {
				if params, err = g.readParams(args[1]); err != nil {
					return err
				}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			var opts []mesh.CallOption
			if cmd.Flags().Changed("timeout") {
				opts = append(opts, mesh.CallTimeout(g.timeout))
			}
			start := time.Now()
			s, err := c.Stream(cmd.Context(), args[0], params, mesh.Window(window), mesh.WithCallOptions(opts...))
			if err != nil {
				return g.callErr(err, pretty)
			}
			defer s.Close()
			var first time.Duration
			n := 0
			for chunk, err := range s.All() {
				if err != nil {
					if pretty {
						fmt.Fprintf(g.stderr, "after %d chunks:\n", n)
					}
					return g.callErr(err, pretty)
				}
				n++
				if n == 1 {
					first = time.Since(start)
				}
				if !pretty {
					fmt.Fprintf(g.stdout, "%s\n", chunk)
					continue
				}
				fmt.Fprintf(g.stdout, "[%d] +%s %s\n", n, time.Since(start).Round(100*time.Microsecond), chunk)
			}
			if pretty {
				var ind bytes.Buffer
				if res := s.Result(); res != nil && json.Indent(&ind, res.Result, "", "  ") != nil {
					ind.Write(res.Result)
				}
				fmt.Fprintf(g.stdout, "✅ Stream ended: %d chunks in %s (first after %s)\nResult: %s\n",
					n, time.Since(start).Round(10*time.Microsecond), first.Round(10*time.Microsecond), ind.String())
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "json or pretty (default: pretty on a terminal, else json)")
	cmd.Flags().IntVar(&window, "window", stream.DefaultWindow, "chunks held unread at most (the stream's credit)")
	return cmd
}

// streamInvoker is bench's call for --stream: a whole stream read to
// its end through the client's chain, its chunks and time to first chunk
// counted in st.
func streamInvoker(clients []*mesh.Client, window int, st *bench.StreamStats) bench.Invoker {
	return func(ctx context.Context, i int, req *envelope.Request) error {
		start := time.Now()
		p, stop := stream.Open(ctx, clients[i].Invoke, req, stream.Window{Chunks: window})
		defer stop()
		for n := 0; ; n++ {
			c, err := p.Next(ctx)
			if err == io.EOF {
				return nil
			}
			if err != nil {
				return err
			}
			if n == 0 {
				st.FirstChunk(time.Since(start))
			}
			st.Chunk(len(c))
		}
	}
}
