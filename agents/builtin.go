package agents

import (
	"context"
	"encoding/json"
	"io"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
)

// decode unmarshals params into v, answering INVALID_PARAMS on failure.
func decode(method string, params json.RawMessage, v any) error {
	if len(params) == 0 {
		params = []byte("{}")
	}
	if err := json.Unmarshal(params, v); err != nil {
		return control.ParamsError(method, err)
	}
	return nil
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// NewEcho returns the echo agent: echo.echo returns its params;
// echo.sleep {ms} sleeps that long (or until the deadline) and answers
// {"slept": ms}.
func NewEcho(opts ...Option) *Agent {
	a := New("echo", opts...)
	a.HandleInline("echo.echo", func(ctx context.Context, p json.RawMessage) (any, error) {
		if len(p) == 0 {
			return json.RawMessage("null"), nil
		}
		return p, nil
	})
	a.SetSchema("echo.echo", control.MethodSchema{
		Description: "Answer the params as they came (any JSON value)",
		Params:      json.RawMessage(`{}`), Result: json.RawMessage(`{}`), Idempotent: true,
	})
	HandleTyped(a, "echo.sleep", "Sleep ms milliseconds (or until the deadline), then answer how long",
		func(ctx context.Context, in SleepParams) (SleepResult, error) {
			if in.MS < 0 || in.MS > int64(time.Hour/time.Millisecond) {
				return SleepResult{}, envelope.NewError(envelope.CodeInvalidParams, "echo.sleep: ms must be within 0..3600000")
			}
			if err := sleep(ctx, time.Duration(in.MS)*time.Millisecond); err != nil {
				return SleepResult{}, err
			}
			return SleepResult{Slept: in.MS}, nil
		}, Errors(envelope.CodeInvalidParams, envelope.CodeTimeout), Idempotent())
	a.HandleStream("echo.stream", echoStream)
	a.SetSchema("echo.stream", control.MethodSchema{
		Description: "Stream n chunks {\"i\":k,\"pad\":...} (k from 1) at intervalMs, each padded to about size bytes; the end is {\"chunks\":n}",
		Params:      streamParamsSchema, Result: streamEndSchema, Errors: []string{"INVALID_PARAMS", "TIMEOUT", "CANCELLED"},
	})
	return a
}

var (
	streamParamsSchema, _ = control.SchemaFor[StreamParams]()
	streamEndSchema, _    = control.SchemaFor[StreamEnd]()
)

// StreamEnd is the result that ends a stream served with HandleStream.
type StreamEnd struct {
	Chunks uint64 `json:"chunks" jsonschema:"the chunks sent"`
}

// StreamParams are the params of echo.stream.
type StreamParams struct {
	N          int64 `json:"n,omitempty" jsonschema:"chunks to send, 0..10000000 (default 10)"`
	IntervalMS int64 `json:"intervalMs,omitempty" jsonschema:"milliseconds between chunks, 0..60000"`
	Size       int   `json:"size,omitempty" jsonschema:"bytes to pad each chunk to, 0..1000000"`
}

// echoStream serves echo.stream.
func echoStream(ctx context.Context, raw json.RawMessage, s *Stream) error {
	p := StreamParams{N: 10}
	if len(raw) > 0 && string(raw) != "null" {
		if err := json.Unmarshal(raw, &p); err != nil {
			return control.ParamsError("echo.stream", err)
		}
	}
	if p.N < 0 || p.N > 10_000_000 || p.IntervalMS < 0 || p.IntervalMS > 60_000 || p.Size < 0 || p.Size > 1_000_000 {
		return envelope.NewError(envelope.CodeInvalidParams, "echo.stream: n must be within 0..10000000, intervalMs 0..60000, size 0..1000000")
	}
	pad := strings.Repeat("x", max(p.Size-24, 0))
	var t *time.Ticker
	if p.IntervalMS > 0 {
		t = time.NewTicker(time.Duration(p.IntervalMS) * time.Millisecond)
		defer t.Stop()
	}
	buf := make([]byte, 0, len(pad)+48)
	for i := int64(1); i <= p.N; i++ {
		if t != nil && i > 1 {
			select {
			case <-t.C:
			case <-ctx.Done():
				return envelope.AsError(ctx.Err())
			}
		}
		buf = append(buf[:0], `{"i":`...)
		buf = strconv.AppendInt(buf, i, 10)
		buf = append(buf, `,"pad":"`...)
		buf = append(buf, pad...)
		buf = append(buf, `"}`...)
		if err := s.Send(ctx, json.RawMessage(buf)); err != nil {
			return err
		}
	}
	return nil
}

// SleepParams are the params of echo.sleep.
type SleepParams struct {
	MS int64 `json:"ms,omitempty" jsonschema:"milliseconds to sleep, 0..3600000"`
}

// SleepResult is the answer of echo.sleep.
type SleepResult struct {
	Slept int64 `json:"slept" jsonschema:"milliseconds slept"`
}

// KV is the store behind the kv agent.
type KV struct {
	mu sync.RWMutex
	m  map[string]json.RawMessage
}

// KVItem is one entry of memory.query's answer.
type KVItem struct {
	Key   string          `json:"key"`
	Value json.RawMessage `json:"value"`
}

// NewKV returns the kv agent serving memory.put {key, value},
// memory.get {key} → {key, value, found}, memory.delete {key} → {deleted},
// and memory.query {prefix?, q?, limit?} → {items, count} on an in-memory
// store.
func NewKV(opts ...Option) *Agent {
	kv := &KV{m: map[string]json.RawMessage{}}
	a := New("kv", opts...)
	type keyParams struct {
		Key   string          `json:"key"`
		Value json.RawMessage `json:"value"`
	}
	key := func(method string, p json.RawMessage) (keyParams, error) {
		var in keyParams
		if err := decode(method, p, &in); err != nil {
			return in, err
		}
		if in.Key == "" {
			return in, envelope.Errorf(envelope.CodeInvalidParams, "%s: key is required", method)
		}
		return in, nil
	}
	a.Handle("memory.put", func(ctx context.Context, p json.RawMessage) (any, error) {
		in, err := key("memory.put", p)
		if err != nil {
			return nil, err
		}
		if len(in.Value) == 0 {
			return nil, envelope.NewError(envelope.CodeInvalidParams, "memory.put: value is required")
		}
		kv.mu.Lock()
		kv.m[in.Key] = append(json.RawMessage(nil), in.Value...)
		kv.mu.Unlock()
		return map[string]any{"ok": true, "key": in.Key}, nil
	})
	a.Handle("memory.get", func(ctx context.Context, p json.RawMessage) (any, error) {
		in, err := key("memory.get", p)
		if err != nil {
			return nil, err
		}
		kv.mu.RLock()
		v, ok := kv.m[in.Key]
		kv.mu.RUnlock()
		if !ok {
			v = json.RawMessage("null")
		}
		return map[string]any{"key": in.Key, "value": v, "found": ok}, nil
	})
	a.Handle("memory.delete", func(ctx context.Context, p json.RawMessage) (any, error) {
		in, err := key("memory.delete", p)
		if err != nil {
			return nil, err
		}
		kv.mu.Lock()
		_, ok := kv.m[in.Key]
		delete(kv.m, in.Key)
		kv.mu.Unlock()
		return map[string]bool{"deleted": ok}, nil
	})
	a.Handle("memory.query", func(ctx context.Context, p json.RawMessage) (any, error) {
		var in struct {
			Prefix string `json:"prefix"`
			Q      string `json:"q"`
			Limit  int    `json:"limit"`
		}
		if err := decode("memory.query", p, &in); err != nil {
			return nil, err
		}
		if in.Limit <= 0 || in.Limit > 1000 {
			in.Limit = 1000
		}
		items := []KVItem{}
		kv.mu.RLock()
		for k, v := range kv.m {
			if strings.HasPrefix(k, in.Prefix) && (in.Q == "" || strings.Contains(k, in.Q) || strings.Contains(string(v), in.Q)) {
				items = append(items, KVItem{k, v})
			}
		}
		kv.mu.RUnlock()
		sort.Slice(items, func(i, j int) bool { return items[i].Key < items[j].Key })
		if len(items) > in.Limit {
			items = items[:in.Limit]
		}
		return map[string]any{"items": items, "count": len(items)}, nil
	})
	kvSchemas(a)
	return a
}

// The shapes of the kv agent's methods, for its declared schemas.
type (
	kvKey struct {
		Key string `json:"key" jsonschema:"the key"`
	}
	kvPut struct {
		Key   string          `json:"key" jsonschema:"the key"`
		Value json.RawMessage `json:"value" jsonschema:"any JSON value"`
	}
	kvPutResult struct {
		OK  bool   `json:"ok"`
		Key string `json:"key"`
	}
	kvGetResult struct {
		Key   string          `json:"key"`
		Value json.RawMessage `json:"value" jsonschema:"the value, null when not found"`
		Found bool            `json:"found"`
	}
	kvDeleteResult struct {
		Deleted bool `json:"deleted" jsonschema:"whether the key was there"`
	}
	kvQuery struct {
		Prefix string `json:"prefix,omitempty" jsonschema:"keys starting with this"`
		Q      string `json:"q,omitempty" jsonschema:"substring of the key or of the value's JSON"`
		Limit  int    `json:"limit,omitempty" jsonschema:"at most this many items (1..1000, default 1000)"`
	}
	kvQueryResult struct {
		Items []KVItem `json:"items"`
		Count int      `json:"count"`
	}
)

func kvSchemas(a *Agent) {
	must := func(s json.RawMessage, err error) json.RawMessage {
		if err != nil {
			panic(err)
		}
		return s
	}
	inv := []string{envelope.CodeInvalidParams.String()}
	a.SetSchema("memory.put", control.MethodSchema{Description: "Store value under key", Errors: inv, Idempotent: true,
		Params: must(control.SchemaFor[kvPut]()), Result: must(control.SchemaFor[kvPutResult]())})
	a.SetSchema("memory.get", control.MethodSchema{Description: "Read the value under key", Errors: inv, Idempotent: true,
		Params: must(control.SchemaFor[kvKey]()), Result: must(control.SchemaFor[kvGetResult]())})
	a.SetSchema("memory.delete", control.MethodSchema{Description: "Delete key", Errors: inv, Idempotent: true,
		Params: must(control.SchemaFor[kvKey]()), Result: must(control.SchemaFor[kvDeleteResult]())})
	a.SetSchema("memory.query", control.MethodSchema{Description: "List the entries whose key has prefix and whose key or value contains q, sorted by key", Errors: inv, Idempotent: true,
		Params: must(control.SchemaFor[kvQuery]()), Result: must(control.SchemaFor[kvQueryResult]())})
}

// ChaosConfig sets the faults of the chaos agent.
type ChaosConfig struct {
	FailRate   float64       // 0..1: share of calls that fail with FailCode
	FailCode   envelope.Code // default UNAVAILABLE
	Latency    time.Duration // added to every call
	Jitter     time.Duration // up to this much more, at random
	HangRate   float64       // 0..1: share of calls that never answer
	CrashAfter int           // exit after this many executions (0: never)
	// Crash ends the process abruptly; required when CrashAfter > 0.
	Crash func()
	// Ledger, if set, receives one line per execution of chaos.echo, the
	// request id, written before the handler runs: an execution record
	// that survives the process (SIGKILL loses the in-memory counts).
	Ledger io.Writer
}

// NewChaos returns the chaos agent: chaos.echo echoes its params after the
// configured faults; chaos.executions answers how many times this agent
// executed each request id ({"executions": {id: n}, "total": n}), so that
// tests can detect doubled executions.
func NewChaos(cfg ChaosConfig, opts ...Option) *Agent {
	if cfg.FailCode == envelope.CodeOK {
		cfg.FailCode = envelope.CodeUnavailable
	}
	var mu sync.Mutex
	execs := map[string]int{}
	total := 0
	a := New("chaos", opts...)
	a.Handle("chaos.echo", func(ctx context.Context, p json.RawMessage) (any, error) {
		id := ""
		if r := RequestFrom(ctx); r != nil {
			id = r.ID
		}
		mu.Lock()
		execs[id]++
		total++
		n := total
		if cfg.Ledger != nil {
			_, _ = io.WriteString(cfg.Ledger, id+"\n")
		}
		mu.Unlock()
		if cfg.CrashAfter > 0 && n >= cfg.CrashAfter && cfg.Crash != nil {
			cfg.Crash()
		}
		if cfg.HangRate > 0 && rand.Float64() < cfg.HangRate {
			<-ctx.Done()
			return nil, ctx.Err()
		}
		d := cfg.Latency
		if cfg.Jitter > 0 {
			d += rand.N(cfg.Jitter)
		}
		if err := sleep(ctx, d); err != nil {
			return nil, err
		}
		if cfg.FailRate > 0 && rand.Float64() < cfg.FailRate {
			return nil, envelope.Errorf(cfg.FailCode, "chaos: injected %s", cfg.FailCode)
		}
		if len(p) == 0 {
			return json.RawMessage("null"), nil
		}
		return p, nil
	})
	a.Handle("chaos.executions", func(ctx context.Context, p json.RawMessage) (any, error) {
		var in struct {
			ID string `json:"id"`
		}
		if err := decode("chaos.executions", p, &in); err != nil {
			return nil, err
		}
		mu.Lock()
		defer mu.Unlock()
		if in.ID != "" {
			return map[string]any{"id": in.ID, "count": execs[in.ID]}, nil
		}
		cp := make(map[string]int, len(execs))
		for k, v := range execs {
			cp[k] = v
		}
		return map[string]any{"executions": cp, "total": total}, nil
	})
	return a
}
