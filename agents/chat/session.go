package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"time"
)

// A session file is JSON lines, one entry a line, appended and synced one
// at a time:
//
//	{"type":"session","agentId":"a1","createdAt":1700000000000,"systemPrompt":"…"}
//	{"type":"message","message":{"role":"user","content":[…],"timestamp":…}}
//	{"type":"compaction","firstKept":24,"summary":"…","reason":"tokens"}
//
// A reset (chat.reset) renames the file to ID.jsonl.reset-UNIXMS (-N
// added when that name is taken) and starts a new one whose session line
// names it in resetFrom; files moved aside are never read or removed.
//
// The history is every message line in order; the context the provider
// sees starts at the last compaction's firstKept (after its summary, if
// any). A session line may be repeated (a later system prompt wins; the
// first createdAt stays). A crash mid-append leaves a torn last line: it is
// skipped on load and cut off before the next append. A bad line elsewhere
// is skipped and counted, never fatal.

// Entry types.
const (
	entrySession    = "session"
	entryMessage    = "message"
	entryCompaction = "compaction"
	// entryDestroyed closes the file of an agent destroyed: a new agent
	// created under its id starts afresh, the old file moved aside.
	entryDestroyed = "destroyed"
)

// entry is one line of a session file.
type entry struct {
	Type         string   `json:"type"`
	AgentID      string   `json:"agentId,omitempty"`
	CreatedAt    int64    `json:"createdAt,omitempty"`
	SystemPrompt *string  `json:"systemPrompt,omitempty"`
	Message      *Message `json:"message,omitempty"`
	FirstKept    int      `json:"firstKept,omitempty"`
	Summary      string   `json:"summary,omitempty"`
	Reason       string   `json:"reason,omitempty"`
	// ResetFrom, on the first line of a file started by a reset, names
	// the file the earlier conversation was moved to.
	ResetFrom string `json:"resetFrom,omitempty"`
}

// maxLine bounds one line of a session file (a message with images can be
// large, but not unbounded).
const maxLine = 16 << 20

// decodeLine decodes one line (without its newline) of a session file.
func decodeLine(line []byte) (entry, error) {
	var e entry
	if len(line) > maxLine {
		return e, errors.New("line too long")
	}
	dec := json.NewDecoder(bytes.NewReader(line))
	if err := dec.Decode(&e); err != nil {
		return entry{}, err
	}
	if dec.More() {
		return entry{}, errors.New("trailing data after the entry")
	}
	switch e.Type {
	case entrySession:
		if e.AgentID == "" {
			return entry{}, errors.New("session entry without agentId")
		}
	case entryMessage:
		if e.Message == nil {
			return entry{}, errors.New("message entry without message")
		}
		if err := e.Message.Validate(); err != nil {
			return entry{}, err
		}
	case entryCompaction:
		if e.FirstKept < 0 {
			return entry{}, errors.New("compaction entry with a negative firstKept")
		}
	case entryDestroyed:
	default:
		return entry{}, fmt.Errorf("unknown entry type %q", e.Type)
	}
	return e, nil
}

// encodeLine encodes e as one line, newline included.
func encodeLine(e entry) ([]byte, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// state is what a session file holds.
type state struct {
	agentID      string
	createdAt    int64
	systemPrompt string
	history      []Message
	firstKept    int    // index in history where the context starts
	summary      string // summary of history[:firstKept], if compacted with one
	compactions  int
	destroyed    bool  // the agent was destroyed (its last entry says so)
	skipped      int   // bad lines skipped (torn last line included)
	goodEnd      int64 // offset just past the last good line
	needNewline  bool  // the last good line lacks its newline
}

// parse reads a whole session file's bytes.
func parse(data []byte) *state {
	st := &state{}
	off := 0
	for off < len(data) {
		nl := bytes.IndexByte(data[off:], '\n')
		end, next := len(data), len(data)
		if nl >= 0 {
			end, next = off+nl, off+nl+1
		}
		line := bytes.TrimSpace(data[off:end])
		if len(line) > 0 {
			e, err := decodeLine(line)
			if err != nil {
				st.skipped++
			} else {
				st.apply(e)
				st.goodEnd = int64(next)
				st.needNewline = nl < 0
			}
		}
		off = next
	}
	return st
}

func (st *state) apply(e entry) {
	switch e.Type {
	case entrySession:
		if st.agentID == "" {
			st.agentID = e.AgentID
		}
		if st.createdAt == 0 {
			st.createdAt = e.CreatedAt
		}
		if e.SystemPrompt != nil {
			st.systemPrompt = *e.SystemPrompt
		}
	case entryMessage:
		st.history = append(st.history, *e.Message)
	case entryCompaction:
		st.firstKept = min(e.FirstKept, len(st.history))
		st.summary = e.Summary
		st.compactions++
	}
	st.destroyed = e.Type == entryDestroyed
}

var idRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$`)

// ValidAgentID reports whether id can name an agent (and its session file).
func ValidAgentID(id string) bool { return idRE.MatchString(id) }

// sessionPath is the session file of agent id under dir.
func sessionPath(dir, id string) string { return filepath.Join(dir, "sessions", id+".jsonl") }

// readSession loads the session file of id under dir; os.ErrNotExist if
// there is none.
func readSession(dir, id string) (*state, error) {
	if !ValidAgentID(id) {
		return nil, os.ErrNotExist
	}
	f, err := os.Open(sessionPath(dir, id))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, 1<<30))
	if err != nil {
		return nil, err
	}
	return parse(data), nil
}

// sessionFile appends entries to one agent's session file.
type sessionFile struct {
	mu sync.Mutex
	f  *os.File
}

// openSession opens (creating it if needed) the session file of id under
// dir, repairs a torn tail, and returns it with its state.
func openSession(dir, id string) (*sessionFile, *state, error) {
	if !ValidAgentID(id) {
		return nil, nil, fmt.Errorf("invalid agent id %q", id)
	}
	p := sessionPath(dir, id)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return nil, nil, err
	}
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, 1<<30))
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	st := parse(data)
	// Cut what follows the last good line (a torn write), so that the
	// next append starts on a line of its own.
	if st.goodEnd < int64(len(data)) {
		if err := f.Truncate(st.goodEnd); err != nil {
			f.Close()
			return nil, nil, err
		}
	}
	if _, err := f.Seek(st.goodEnd, io.SeekStart); err != nil {
		f.Close()
		return nil, nil, err
	}
	if st.needNewline {
		if _, err := f.Write([]byte{'\n'}); err != nil {
			f.Close()
			return nil, nil, err
		}
		st.needNewline = false
	}
	return &sessionFile{f: f}, st, nil
}

// append writes e as one line and syncs it.
func (s *sessionFile) append(e entry) error {
	line, err := encodeLine(e)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return errors.New("session file closed")
	}
	if _, err := s.f.Write(line); err != nil {
		return err
	}
	return s.f.Sync()
}

func (s *sessionFile) close() error { return s.closeWith(nil) }

// closeWith appends last, if not nil, and closes the file, under one
// hold of the lock: no other entry can land after last (a turn still
// ending when its agent is destroyed writes nothing after "destroyed").
func (s *sessionFile) closeWith(last *entry) error {
	var line []byte
	if last != nil {
		var err error
		if line, err = encodeLine(*last); err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return nil
	}
	var err error
	if line != nil {
		if _, err = s.f.Write(line); err == nil {
			err = s.f.Sync()
		}
	}
	if cerr := s.f.Close(); err == nil {
		err = cerr
	}
	s.f = nil
	return err
}

// moveAside renames the session file of id under dir (the file s writes)
// to a name of its own beside it, ID.jsonl.reset-UNIXMS (with -N added
// when taken: nothing is overwritten), and makes s write a new file at
// the session's path whose first line is first (its resetFrom set to the
// old file's new base name). It returns the new path of the old file. On
// failure the old file is put back and s still writes it.
func (s *sessionFile) moveAside(dir, id string, now time.Time, first entry) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return "", errors.New("session file closed")
	}
	p := sessionPath(dir, id)
	aside := ""
	for n := 0; aside == ""; n++ {
		c := p + ".reset-" + strconv.FormatInt(now.UnixMilli(), 10)
		if n > 0 {
			c += "-" + strconv.Itoa(n)
		}
		switch _, err := os.Lstat(c); {
		case errors.Is(err, os.ErrNotExist):
			aside = c
		case err != nil:
			return "", err
		case n >= 1000:
			return "", fmt.Errorf("no free name for %s", c)
		}
	}
	first.ResetFrom = filepath.Base(aside)
	line, err := encodeLine(first)
	if err != nil {
		return "", err
	}
	// Crash-safe: the new file is written whole under a temporary name;
	// the old file then gets its second name (a hard link), and the new
	// one replaces it under the session's name (an atomic rename). At
	// every moment the session's name holds one whole file, the old or
	// the new; a crash leaves at worst a stray .new file (removed by the
	// next reset) or the old file under both names.
	tmp := p + ".new"
	_ = os.Remove(tmp)
	nf, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", err
	}
	if _, err = nf.Write(line); err == nil {
		err = nf.Sync()
	}
	if err == nil {
		err = os.Link(p, aside)
	}
	if err == nil {
		if err = os.Rename(tmp, p); err != nil {
			_ = os.Remove(aside)
		}
	}
	if err != nil {
		nf.Close()
		_ = os.Remove(tmp)
		return "", err
	}
	syncDir(filepath.Dir(p))
	_ = s.f.Close()
	s.f = nf
	return aside, nil
}

// syncDir makes a directory's entries (a rename, a new file) durable,
// where the system allows it.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
}
