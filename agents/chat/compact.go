package chat

import (
	"context"
	"strings"

	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/telemetry"
)

// compact compacts the context when it is past its count or token budget
// (the turn token held). The cut falls before a user message, so that a
// tool call is never separated from its result, and never after the
// current turn's user message. A compaction that runs is a span of g
// under ctx's (the turn's): "compact {agent}", with its reason and the
// context's tokens before and after.
func (a *Agent) compact(ctx context.Context, g *telemetry.GenAI) error {
	cfg := &a.rt.cfg
	a.mu.Lock()
	tok := a.tokens()
	n := a.contextLen()
	reason := ""
	switch {
	case cfg.MaxMessages > 0 && n > cfg.MaxMessages:
		reason = "count"
	case tok.Total > cfg.TokenBudget:
		reason = "tokens"
	}
	if reason == "" {
		a.mu.Unlock()
		return nil
	}
	lastUser := -1
	for i := len(a.history) - 1; i >= a.firstKept; i-- {
		if a.history[i].Role == RoleUser {
			lastUser = i
			break
		}
	}
	cut := a.firstKept
	if reason == "count" {
		cut = max(a.firstKept, len(a.history)-cfg.KeepMessages)
	} else {
		kept := tok.System + tok.Tools
		cut = len(a.history)
		for cut > a.firstKept && kept+messageTokens(&a.history[cut-1]) <= cfg.KeepTokens {
			cut--
			kept += messageTokens(&a.history[cut])
		}
	}
	for cut < len(a.history) && a.history[cut].Role != RoleUser {
		cut++
	}
	if lastUser >= 0 && cut > lastUser {
		cut = lastUser
	}
	if cut <= a.firstKept {
		a.mu.Unlock()
		return nil // nothing can go: the current turn alone is past the budget
	}
	removed, kept := cut-a.firstKept, len(a.history)-cut
	tokRemoved, tokKept := 0, 0
	for i := a.firstKept; i < len(a.history); i++ {
		if i < cut {
			tokRemoved += messageTokens(&a.history[i])
		} else {
			tokKept += messageTokens(&a.history[i])
		}
	}
	summary := ""
	if cfg.Summarize {
		reason = "summary"
		summary = summarize(a.summary, a.history[a.firstKept:cut], max(cfg.KeepTokens/4, 64))
		tokKept += 4 + EstimateTokens(summary)
	} else if a.summary != "" {
		tokRemoved += 4 + EstimateTokens(a.summary)
	}
	a.mu.Unlock()

	_, span := g.StartCompaction(ctx, a.id)
	figures := telemetry.Compaction{Reason: reason, TokensBefore: tok.Total, TokensAfter: tok.Total, Removed: removed, Kept: kept}
	streamID := "compaction:" + a.id
	a.publish(streamID, Event{Type: EventCompactionStart})
	if err := a.file.append(entry{Type: entryCompaction, FirstKept: cut, Summary: summary, Reason: reason}); err != nil {
		err = envelope.WrapError(envelope.CodeInternal, "cannot write the session file", err)
		span.End(figures, err)
		return err
	}
	a.mu.Lock()
	a.firstKept, a.summary = cut, summary
	a.compactions++
	if span.Recording() {
		figures.TokensAfter = a.tokens().Total
	}
	a.mu.Unlock()
	end := Event{Type: EventCompactionEnd, Removed: intPtr(removed), Kept: intPtr(kept), Reason: reason}
	if reason != "count" {
		end.TokensRemoved, end.TokensKept = intPtr(tokRemoved), intPtr(tokKept)
	}
	a.publish(streamID, end)
	span.End(figures, nil)
	return nil
}

// summarize folds removed messages into a bounded extractive summary: one
// line per message, "role: first words", newest kept when it must shrink.
func summarize(prev string, removed []Message, maxTokens int) string {
	var lines []string
	if prev != "" {
		lines = append(lines, strings.Split(prev, "\n")...)
	}
	for _, m := range removed {
		t := strings.Join(strings.Fields(TextOf(m.Content)), " ")
		if m.Role == RoleAssistant {
			for _, c := range ToolCalls(m.Content) {
				t += " [called " + c.Name + "]"
			}
		}
		if r := []rune(t); len(r) > 120 {
			t = string(r[:120]) + "…"
		}
		lines = append(lines, m.Role+": "+t)
	}
	for len(lines) > 1 && EstimateTokens(strings.Join(lines, "\n")) > maxTokens {
		lines = lines[1:]
	}
	return strings.Join(lines, "\n")
}
