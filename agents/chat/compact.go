package chat

import (
	"strings"

	"github.com/agentmesh/agentmesh/envelope"
)

// compact compacts the context when it is past its count or token budget
// (the turn token held). The cut falls before a user message, so that a
// tool call is never separated from its result, and never after the
// current turn's user message.
func (a *Agent) compact() error {
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

	streamID := "compaction:" + a.id
	a.publish(streamID, Event{Type: EventCompactionStart})
	if err := a.file.append(entry{Type: entryCompaction, FirstKept: cut, Summary: summary, Reason: reason}); err != nil {
		return envelope.WrapError(envelope.CodeInternal, "cannot write the session file", err)
	}
	a.mu.Lock()
	a.firstKept, a.summary = cut, summary
	a.compactions++
	a.mu.Unlock()
	end := Event{Type: EventCompactionEnd, Removed: intPtr(removed), Kept: intPtr(kept), Reason: reason}
	if reason != "count" {
		end.TokensRemoved, end.TokensKept = intPtr(tokRemoved), intPtr(tokKept)
	}
	a.publish(streamID, end)
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
