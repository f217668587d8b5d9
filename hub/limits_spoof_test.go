package hub_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents/chat"
	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/surface"
)

// TestHopsHeaderDoesNotEscapeLimits: with authentication on, a client
// that sets headers.hops (as if a peer hub forwarded its calls) is held
// to the global and per-connection limits all the same; only a peer
// hub's token exempts a call.
func TestHopsHeaderDoesNotEscapeLimits(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  hub.Config
	}{
		{"global", hub.Config{GlobalRate: 20, GlobalBurst: 5}},
		{"per connection", hub.Config{ConnRate: 20, ConnBurst: 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Security = &hub.Security{Key: testkit.TestKey}
			m := meshtest.Start(t, cfg)
			var n atomic.Int64
			m.RunAgent(t, testkit.CountingAgent("echo", &n, testkit.Token(t, auth.Claims{Subject: "echo", Serve: []string{"echo.*"}}, time.Hour), "echo.*"))
			c := testkit.MustClient(t, m.WS, mesh.WithToken(testkit.Token(t, auth.Claims{Subject: "spoof"}, time.Hour)), mesh.WithoutReliability())
			hops := mesh.WithHeaders(func(h *envelope.Headers) { h.Hops = 1 })
			ok, limited := 0, 0
			for range 40 {
				switch err := c.Call(t.Context(), "echo.echo", 1, nil, hops); envelope.CodeOf(err) {
				case envelope.CodeOK:
					ok++
				case envelope.CodeOverloaded:
					limited++
				default:
					t.Fatalf("call with hops 1: %v", err)
				}
			}
			t.Logf("40 calls at once with hops 1: %d ok, %d OVERLOADED", ok, limited)
			if limited == 0 || ok > 10 {
				t.Errorf("a client setting hops escaped the limit (burst 5, 20/s): %d ok, %d OVERLOADED", ok, limited)
			}
		})
	}
}

// TestFollowChatOutlastsRateLimit: a follower's long polls of chat.events
// go through the hub's limits like any call; one refused OVERLOADED waits
// the limiter's hint and goes on from the same seq, instead of ending the
// follow (an agentick subscription would end silently).
func TestFollowChatOutlastsRateLimit(t *testing.T) {
	m := meshtest.Start(t, hub.Config{GlobalRate: 4, GlobalBurst: 2})
	rt := chat.NewRuntime(chat.Config{DataDir: t.TempDir()}, &chat.Scripted{}, nil)
	t.Cleanup(func() { rt.Close(context.Background()) })
	m.RunAgent(t, chat.NewService(rt))
	c := m.Client(t) // default policies: a call refused not-sent is retried after the hint
	if err := c.Call(t.Context(), "chat.create", map[string]any{"agent_id": "f1"}, nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	ends := make(chan struct{}, 8)
	done := make(chan error, 1)
	go func() {
		_, err := surface.FollowChat(ctx, m.Hub, "f1", 0, func(e surface.ChatEvent) bool {
			if strings.Contains(string(e.Event), `"type":"message_end"`) {
				ends <- struct{}{}
			}
			return true
		})
		done <- err
	}()
	for i := range 3 {
		// The sends compete with the follower's polls for the same 4
		// calls/s: a send can spend its retries on refusals (seen in 1 of
		// 10 runs). It is the follow that must outlast them, so a refused
		// send is sent again.
		for {
			err := c.Call(ctx, "chat.send", map[string]any{"agentId": "f1", "content": "/long 30"}, nil)
			if envelope.CodeOf(err) == envelope.CodeOverloaded && ctx.Err() == nil {
				continue
			}
			if err != nil {
				t.Fatalf("send %d: %v", i, err)
			}
			break
		}
		select {
		case <-ends:
		case err := <-done:
			t.Fatalf("the follow ended after %d turns: %v", i, err)
		case <-ctx.Done():
			t.Fatalf("turn %d's message_end never followed", i)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("FollowChat = %v after its context ended; want nil", err)
	}
}
