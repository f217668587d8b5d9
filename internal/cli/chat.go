package cli

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/agents/chat"
	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/telemetry"
)

// chatAgentFlags are the flags of `meshctl agent run chat`.
type chatAgentFlags struct {
	provider, model, baseURL, apiKey string
	dataDir, systemPrompt            string
	tokenBudget, maxMessages         int
	summarize                        bool
	chunkDelay                       time.Duration
}

func (c *chatAgentFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&c.provider, "provider", envOr("MESH_CHAT_PROVIDER", "scripted"), "chat: scripted (offline, deterministic) or openai (any OpenAI-compatible chat-completions server) [$MESH_CHAT_PROVIDER]")
	f.StringVar(&c.model, "model", envOr("OPENAI_MODEL", ""), "chat: the model of --provider openai [$OPENAI_MODEL]")
	f.StringVar(&c.baseURL, "base-url", envOr("OPENAI_BASE_URL", "https://api.openai.com/v1"), "chat: API root of --provider openai [$OPENAI_BASE_URL]")
	f.StringVar(&c.apiKey, "api-key-env", "OPENAI_API_KEY", "chat: environment variable holding the API key of --provider openai")
	f.StringVar(&c.dataDir, "data-dir", envOr("MESH_CHAT_DATA_DIR", chat.DefaultDataDir()), "chat: directory of the session files (history survives restarts) [$MESH_CHAT_DATA_DIR]")
	f.StringVar(&c.systemPrompt, "system-prompt", "You are a helpful agent on an agentmesh mesh.", "chat: system prompt of agents created without one")
	f.IntVar(&c.tokenBudget, "token-budget", 8000, "chat: context budget in tokens; past it the context is compacted")
	f.IntVar(&c.maxMessages, "max-messages", 200, "chat: context budget in messages; past it the context is compacted")
	f.BoolVar(&c.summarize, "summarize", false, "chat: compaction keeps a summary of what it removes")
	f.DurationVar(&c.chunkDelay, "chunk-delay", 20*time.Millisecond, "chat: pause between the scripted provider's chunks")
}

// newChatAgent builds the chat agent: a runtime, and a mesh client for its
// mesh_call tool. close releases both once the agent has stopped.
func (g *ctlFlags) newChatAgent(c *chatAgentFlags, log *slog.Logger, tel *telemetry.Telemetry, opts ...agents.Option) (a *agents.Agent, close func(), err error) {
	var p chat.Provider
	switch c.provider {
	case "scripted":
		p = &chat.Scripted{Delay: c.chunkDelay}
	case "openai":
		op, err := chat.NewOpenAI(chat.OpenAIConfig{BaseURL: c.baseURL, APIKey: os.Getenv(c.apiKey), Model: c.model})
		if err != nil {
			return nil, nil, usageErr("%v", err)
		}
		p = op
	default:
		return nil, nil, usageErr("--provider must be scripted or openai, not %q", c.provider)
	}
	// The mesh_call tool's client traces its calls (a CLIENT span between
	// the tool's span and the hub's) and counts them.
	mc, err := g.client(mesh.WithOrigin("chat-agent"), mesh.WithTimeout(30*time.Second), mesh.WithClientTelemetry(tel))
	if err != nil {
		return nil, nil, err
	}
	rt := chat.NewRuntime(chat.Config{DataDir: c.dataDir, SystemPrompt: c.systemPrompt, TokenBudget: c.tokenBudget,
		MaxMessages: c.maxMessages, Summarize: c.summarize}, p, chat.NewTools(chat.MeshCallTool(mc, 30*time.Second)))
	rt.SetTelemetry(tel) // GenAI spans, gen_ai_* histograms on the agent's /metrics
	log.Info("chat agent", "provider", p.Name(), "model", c.model, "dataDir", rt.Config().DataDir)
	return chat.NewService(rt, opts...), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		rt.Close(ctx)
		_ = mc.Close()
	}, nil
}

func (g *ctlFlags) chatCmd() *cobra.Command {
	var systemPrompt string
	var turnTimeout time.Duration
	cmd := &cobra.Command{
		Use:   "chat AGENT_ID",
		Short: "Talk to a chat agent: type a message, watch the answer stream",
		Long: `Talk to a chat agent of the chat runtime (meshctl agent run chat, or meshd --demo).

The agent is created if it is not in the pool (resuming its history if its
session file exists). Each line read is sent with chat.send while chat.events
is long-polled, so the answer streams as it is written, with tool calls and
compactions. Ctrl-C during an answer cancels it (chat.cancel); Ctrl-C at the
prompt, or end of input, leaves.

The scripted provider understands /call METHOD {json}, /tool NAME {json},
/think TEXT and /long N.`,
		Example: `  meshctl chat demo
  echo 'hello' | meshctl chat demo
  meshctl chat demo  # then: /call echo.echo {"hi":1}`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			// Ctrl-C must cancel a turn, not end the command: work under a
			// context the root's signal handling does not cancel, and watch
			// the signal here.
			ctx, cancel := context.WithCancel(context.WithoutCancel(cmd.Context()))
			defer cancel()
			sigs := make(chan os.Signal, 1)
			signal.Notify(sigs, os.Interrupt)
			defer signal.Stop(sigs)
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			var created chat.CreateResult
			err = c.Call(ctx, "chat.create", map[string]any{"agent_id": id, "system_prompt": systemPrompt}, &created, mesh.CallTimeout(g.timeout))
			switch {
			case err == nil:
				what := "new"
				if created.Resumed {
					what = fmt.Sprintf("resumed, %d messages", created.MessageCount)
				}
				fmt.Fprintf(g.stderr, "chat agent %s (%s)\n", id, what)
			case envelope.CodeOf(err) == envelope.CodeInvalidParams && strings.Contains(err.Error(), "already exists"):
				fmt.Fprintf(g.stderr, "chat agent %s (running)\n", id)
			default:
				return g.callErr(err, false)
			}
			lines := make(chan string)
			go func() {
				defer close(lines)
				sc := bufio.NewScanner(g.stdin)
				sc.Buffer(make([]byte, 64<<10), 1<<20)
				for sc.Scan() {
					select {
					case lines <- sc.Text():
					case <-ctx.Done():
						return
					}
				}
			}()
			prompt := isTerminal(g.stdout)
			for {
				if prompt {
					fmt.Fprint(g.stdout, "> ")
				}
				var line string
				var ok bool
				select {
				case line, ok = <-lines:
				case <-sigs:
					ok = false
				}
				if !ok {
					if prompt {
						fmt.Fprintln(g.stdout)
					}
					return nil
				}
				if strings.TrimSpace(line) == "" {
					continue
				}
				if err := g.chatTurn(ctx, c, id, line, turnTimeout, sigs); err != nil {
					return err
				}
			}
		},
	}
	cmd.Flags().StringVar(&systemPrompt, "system-prompt", "", "system prompt of the agent if it is created")
	cmd.Flags().DurationVar(&turnTimeout, "turn-timeout", 5*time.Minute, "how long one answer may take")
	return cmd
}

// chatTurn sends one message and prints the answer as it streams.
func (g *ctlFlags) chatTurn(ctx context.Context, c *mesh.Client, id, line string, timeout time.Duration, sigs <-chan os.Signal) error {
	// Where the event log stands before the send.
	var head chat.EventsPage
	if err := c.Call(ctx, "chat.events", map[string]any{"agentId": id, "tail": true}, &head, mesh.CallTimeout(g.timeout)); err != nil {
		return g.callErr(err, false)
	}
	reqID := envelope.NewID()
	pctx, stopPoll := context.WithCancel(ctx)
	var wg sync.WaitGroup
	pr := &streamPrinter{w: g.stdout, color: isTerminal(g.stdout)}
	wg.Go(func() {
		after := head.NextSeq
		for {
			var page chat.EventsPage
			err := c.Call(pctx, "chat.events", map[string]any{"agentId": id, "after_seq": after, "wait_ms": 1000}, &page, mesh.CallTimeout(5*time.Second))
			if pctx.Err() != nil {
				return
			}
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			for _, e := range page.Events {
				if e.RequestID == reqID { // not another client's turn on this agent
					pr.print(e)
				}
			}
			after = page.NextSeq
			if page.Closed {
				return
			}
		}
	})
	type answer struct {
		res chat.SendResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		var a answer
		a.err = c.Call(ctx, "chat.send", map[string]any{"agentId": id, "content": line, "request_id": reqID}, &a.res, mesh.CallTimeout(timeout))
		done <- a
	}()
	var a answer
	for waiting := true; waiting; {
		select {
		case a = <-done:
			waiting = false
		case <-sigs:
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_ = c.Call(cctx, "chat.cancel", map[string]any{"agentId": id, "request_id": reqID}, nil)
			cancel()
		}
	}
	// Let the poller catch the last events (message_end) before stopping.
	deadline := time.Now().Add(2 * time.Second)
	for !pr.ended() && time.Now().Before(deadline) && a.err == nil {
		time.Sleep(10 * time.Millisecond)
	}
	stopPoll()
	wg.Wait()
	pr.finish()
	switch {
	case a.err == nil:
		return nil
	case envelope.CodeOf(a.err) == envelope.CodeCancelled:
		fmt.Fprintln(g.stderr, "(cancelled)")
		return nil
	case errors.Is(a.err, link.ErrHubUnreachable) || envelope.CodeOf(a.err) == envelope.CodeAgentNotFound:
		return g.callErr(a.err, false)
	}
	e := envelope.AsError(a.err)
	fmt.Fprintf(g.stderr, "%s: %s\n", e.Code, e.Message)
	return nil
}

// streamPrinter prints the events of a turn: the new part of each
// message_update's accumulated text, tool calls and compactions.
type streamPrinter struct {
	w       io.Writer
	color   bool // dim the thinking
	mu      sync.Mutex
	printed int // bytes of the current message's text already printed
	thought int
	done    bool // a message_end with a final stop reason was seen
	midLine bool
}

func (p *streamPrinter) print(e chat.SeqEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ev := e.Event
	switch ev.Type {
	case chat.EventMessageStart:
		p.printed, p.thought = 0, 0
	case chat.EventMessageUpdate, chat.EventMessageEnd:
		var text, thinking string
		for _, b := range ev.Message.Content {
			switch b.Type {
			case chat.BlockText:
				text += b.Text
			case chat.BlockThinking:
				thinking += b.Thinking
			}
		}
		if len(thinking) > p.thought {
			switch {
			case p.color:
				fmt.Fprintf(p.w, "\x1b[2m%s\x1b[0m", thinking[p.thought:])
			case p.thought == 0:
				fmt.Fprintf(p.w, "(thinking) %s", thinking)
			default:
				fmt.Fprint(p.w, thinking[p.thought:])
			}
			p.thought = len(thinking)
			p.midLine = true
		}
		if len(text) > p.printed {
			if p.printed == 0 && p.thought > 0 {
				fmt.Fprintln(p.w)
			}
			fmt.Fprint(p.w, text[p.printed:])
			p.printed = len(text)
			p.midLine = true
		}
		if ev.Type == chat.EventMessageEnd {
			if p.midLine {
				fmt.Fprintln(p.w)
				p.midLine = false
			}
			if ev.Message.StopReason != chat.StopToolUse {
				p.done = true
			}
		}
	case chat.EventToolExecutionStart:
		fmt.Fprintf(p.w, "  [tool %s %s]\n", ev.ToolName, ev.Args)
	case chat.EventToolExecutionEnd:
		res := ""
		if ev.Result != nil {
			res = *ev.Result
		}
		if len(res) > 200 {
			res = res[:200] + "…"
		}
		mark := "→"
		if ev.IsError != nil && *ev.IsError {
			mark = "✗"
		}
		fmt.Fprintf(p.w, "  [%s %s]\n", mark, res)
	case chat.EventCompactionEnd:
		fmt.Fprintf(p.w, "  [context compacted (%s): %d messages removed, %d kept]\n", ev.Reason, deref(ev.Removed), deref(ev.Kept))
	}
}

func (p *streamPrinter) ended() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

func (p *streamPrinter) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.midLine {
		fmt.Fprintln(p.w)
		p.midLine = false
	}
}

func deref(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}

// demoChat is the chat agent meshd --demo runs: the scripted provider,
// sessions under dataDir, and a mesh_call tool wired once the hub's URL
// is known.
type demoChat struct {
	agent *agents.Agent
	rt    *chat.Runtime
	tools *chat.Tools
	mc    *mesh.Client
}

func newDemoChat(dataDir string, opts ...agents.Option) (*demoChat, error) {
	d := &demoChat{tools: chat.NewTools()}
	d.rt = chat.NewRuntime(chat.Config{DataDir: dataDir, SystemPrompt: "You are the demo chat agent of an agentmesh hub."},
		&chat.Scripted{Delay: 20 * time.Millisecond}, d.tools)
	// The chat agent "demo" is there from the start (its history resumed
	// from its session file, if any): model chat/demo answers on a fresh
	// meshd --demo, and meshctl chat demo joins it.
	if _, err := d.rt.Create(demoChatAgent, ""); err != nil {
		d.rt.Close(context.Background())
		return nil, fmt.Errorf("the demo chat agent %q: %w", demoChatAgent, err)
	}
	d.agent = chat.NewService(d.rt, opts...)
	return d, nil
}

// demoChatAgent is the chat agent meshd --demo starts with.
const demoChatAgent = "demo"

// connect gives the agent's mesh_call tool a client of the hub at url
// (with a token signed by key, when the hub requires one).
func (d *demoChat) connect(url string, tlsCfg *tls.Config, key []byte, tel *telemetry.Telemetry) error {
	tok := ""
	if key != nil {
		var err error
		if tok, err = auth.Issue(key, auth.Claims{Subject: "demo.chat"}, 365*24*time.Hour); err != nil {
			return err
		}
	}
	mc, err := mesh.NewClient([]string{url}, mesh.WithOrigin("chat-agent"), mesh.WithToken(tok), mesh.WithTLS(tlsCfg), mesh.WithTimeout(30*time.Second),
		mesh.WithClientTelemetry(tel))
	if err != nil {
		return err
	}
	d.mc = mc
	d.tools.Register(chat.MeshCallTool(mc, 30*time.Second))
	return nil
}

// close releases the runtime and the client, after the agent stopped.
func (d *demoChat) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d.rt.Close(ctx)
	if d.mc != nil {
		_ = d.mc.Close()
	}
}
