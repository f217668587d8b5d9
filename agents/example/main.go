// Command example is the Go SDK's example agent, and its conformance agent
// (sdk/PROTOCOL.md, "The conformance agent"; e2e/conformance_test.go runs
// it as a process):
//
//	go run ./agents/example --hub ws://127.0.0.1:7700/ws [--hub …] [--name go] [--token T] [--drain-timeout 5s]
//
// (or MESH_HUB, a comma-separated list, MESH_AGENT_NAME and MESH_TOKEN).
// Under the name N it serves N.echo, N.sleep, N.aborted, N.fail and
// N.trace. SIGINT or SIGTERM stops it: it deregisters, lets the calls in
// flight finish (at most the drain timeout) and exits 0.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/agentmesh/agentmesh/agents"
)

// hubList is the repeatable --hub flag.
type hubList []string

func (h *hubList) String() string     { return strings.Join(*h, ",") }
func (h *hubList) Set(v string) error { *h = append(*h, v); return nil }

func main() {
	var hubs hubList
	flag.Var(&hubs, "hub", "hub URL, ws://HOST:PORT/ws (repeatable; default $MESH_HUB, comma-separated)")
	name := flag.String("name", envOr("MESH_AGENT_NAME", "go"), "the agent's name N: it serves N.echo, N.sleep, N.aborted, N.fail, N.trace")
	token := flag.String("token", os.Getenv("MESH_TOKEN"), "bearer token for the hubs")
	drain := flag.Duration("drain-timeout", 5*time.Second, "how long a shutdown waits for the calls in flight")
	flag.Parse()
	if len(hubs) == 0 && os.Getenv("MESH_HUB") != "" {
		hubs = strings.Split(os.Getenv("MESH_HUB"), ",")
	}

	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	a := agents.New(*name, agents.WithToken(*token), agents.WithDrainTimeout(*drain), agents.WithLogger(log))
	serve(a, *name)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		select {
		case <-a.Registered():
			log.Info("registered", "name", a.Name(), "agent", a.ID())
		case <-ctx.Done():
		}
	}()
	if err := a.Run(ctx, hubs...); err != nil {
		log.Error("agent stopped", "error", err)
		os.Exit(1)
	}
}

// serve registers the conformance methods under the name n.
func serve(a *agents.Agent, n string) {
	var aborted sync.Map // N.sleep's key -> why its context ended

	a.Handle(n+".echo", func(_ context.Context, params json.RawMessage) (any, error) {
		if len(params) == 0 {
			return nil, nil // absent params: null
		}
		return params, nil // a json.RawMessage goes back as it came
	})

	type sleepParams struct {
		Ms  int    `json:"ms"`
		Key string `json:"key"`
	}
	type slept struct {
		Slept int `json:"slept"`
	}
	agents.HandleTyped(a, n+".sleep", "waits ms milliseconds; records key as aborted if the call ends first",
		func(ctx context.Context, p sleepParams) (slept, error) {
			t := time.NewTimer(time.Duration(p.Ms) * time.Millisecond)
			defer t.Stop()
			select {
			case <-t.C:
				return slept{p.Ms}, nil
			case <-ctx.Done(): // the caller cancelled, the ttl passed, or the link was lost
				aborted.Store(p.Key, context.Cause(ctx).Error())
				return slept{}, ctx.Err()
			}
		})

	type abortedParams struct {
		Key string `json:"key"`
	}
	type abortedResult struct {
		Aborted bool   `json:"aborted"`
		Reason  string `json:"reason,omitempty"`
	}
	agents.HandleTyped(a, n+".aborted", "whether the sleep with this key saw its context end, and why",
		func(_ context.Context, p abortedParams) (abortedResult, error) {
			reason, ok := aborted.Load(p.Key)
			if !ok {
				return abortedResult{}, nil
			}
			return abortedResult{true, reason.(string)}, nil
		})

	type failParams struct {
		Message string `json:"message"`
	}
	a.Handle(n+".fail", func(_ context.Context, params json.RawMessage) (any, error) {
		var p failParams
		_ = json.Unmarshal(params, &p)
		panic(p.Message) // answered INTERNAL_ERROR "handler for N.fail panicked: <message>"
	})

	type traceResult struct {
		Traceparent string `json:"traceparent"`
		Tracestate  string `json:"tracestate"`
	}
	agents.HandleTyped(a, n+".trace", "the trace context the handler sees",
		func(ctx context.Context, _ struct{}) (traceResult, error) {
			h := agents.RequestFrom(ctx).Headers
			return traceResult{h.Traceparent, h.Tracestate}, nil
		})
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
