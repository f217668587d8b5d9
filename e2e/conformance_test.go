package e2e_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/internal/race"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/mesh"
)

// TestConformance runs the conformance agent of each SDK (sdk/PROTOCOL.md,
// "The conformance agent") as a process against real meshd processes and
// checks that each behaves as the protocol says, the same checks for
// every SDK, each a subtest of its own (TestConformance/<sdk>/<check>):
//
//   - on a hub in heartbeat mode (--heartbeat 500ms, --link-ping 2s: the
//     hub wants agent.heartbeat): registration (name, ready, the five
//     methods, echo of any JSON), heartbeats at the assigned interval, the
//     trace context seen by the handler, a throwing handler answered
//     INTERNAL_ERROR with its message, the handler's signal firing on a
//     cancel and on the ttl, 1,000 concurrent calls all answered and
//     matched, SIGSTOP expiring the agent after three intervals and
//     SIGCONT bringing it back, and SIGTERM (deregistered at once, the
//     call in flight finished, exit 0 within the drain timeout);
//   - on a hub (--heartbeat 1s) SIGKILLed and started again on its port:
//     the agent registered again within two intervals;
//   - on a hub in link-liveness mode (--link-ping 500ms = --heartbeat):
//     the agent kept alive by its link, and a SIGSTOPped one gone within
//     three intervals.
//
// The Go agent is built from agents/example; the TypeScript one needs
// node and `npm ci --prefix sdk/typescript`, the Python one Debian's
// /usr/bin/python3 (or $MESH_PYTHON) with websockets. A missing runtime or
// package fails the test in CI and skips the SDK elsewhere. The SDKs run
// one after the other: the checks measure time.
func TestConformance(t *testing.T) {
	root, err := filepath.Abs("..") // the test runs in e2e/
	if err != nil {
		t.Fatal(err)
	}
	for _, sdk := range []struct {
		name, short string
		command     func(t *testing.T, root string) []string
	}{
		{"go", "go", goConformanceAgent},
		{"typescript", "ts", tsConformanceAgent},
		{"python", "py", pyConformanceAgent},
	} {
		t.Run(sdk.name, func(t *testing.T) {
			argv := sdk.command(t, root)
			conformance(t, root, argv, "conf-"+sdk.short)
		})
	}
}

// missingf is how a missing runtime or package ends an SDK's subtest: a
// failure in CI (which installs them all), a skip elsewhere.
func missingf(t *testing.T) func(format string, args ...any) {
	if os.Getenv("CI") != "" {
		return t.Fatalf
	}
	return t.Skipf
}

// goConformanceAgent builds agents/example (with the race detector when
// the test has it) and returns its command.
func goConformanceAgent(t *testing.T, root string) []string {
	bin := filepath.Join(t.TempDir(), "conformance-agent")
	args := []string{"build", "-o", bin}
	if race.Enabled {
		args = append(args, "-race")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	build := exec.CommandContext(ctx, "go", append(args, "./agents/example")...)
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./agents/example: %v\n%s", err, out)
	}
	return []string{bin}
}

// tsConformanceAgent is node sdk/typescript/examples/agent.mjs.
func tsConformanceAgent(t *testing.T, root string) []string {
	missing := missingf(t)
	const install = "install Node.js 20 or later, then run `npm ci --prefix sdk/typescript` at the repository's root"
	script := filepath.Join(root, "sdk", "typescript", "examples", "agent.mjs")
	if _, err := os.Stat(script); err != nil {
		missing("the TypeScript SDK's conformance agent is missing: %v", err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("node is not on PATH (%v): %s", err, install)
	}
	if _, err := os.Stat(filepath.Join(root, "sdk", "typescript", "node_modules", "ws", "package.json")); err != nil {
		missing("the npm package ws is not installed in sdk/typescript (%v): %s", err, install)
	}
	return []string{node, script}
}

// pyConformanceAgent is /usr/bin/python3 (or $MESH_PYTHON)
// sdk/python/examples/agent.py.
func pyConformanceAgent(t *testing.T, root string) []string {
	missing := missingf(t)
	const install = "install Debian's python3 and python3-websockets (`apt-get install python3 python3-websockets`), or point MESH_PYTHON at a Python 3 with websockets installed"
	script := filepath.Join(root, "sdk", "python", "examples", "agent.py")
	if _, err := os.Stat(script); err != nil {
		missing("the Python SDK's conformance agent is missing: %v", err)
	}
	py := os.Getenv("MESH_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	if _, err := exec.LookPath(py); err != nil {
		missing("no Python interpreter at %s (%v): %s", py, err, install)
	}
	if out, err := exec.CommandContext(t.Context(), py, "-c", "import websockets").CombinedOutput(); err != nil {
		missing("%s cannot import websockets (%v: %s): %s", py, err, strings.TrimSpace(string(out)), install)
	}
	return []string{py, script}
}

// The conformance agent's methods, under its name n.
func confMethods(n string) []string {
	return []string{n + ".echo", n + ".sleep", n + ".aborted", n + ".fail", n + ".trace"}
}

// conformance runs every check against the agent command argv, the agent
// registering as name.
func conformance(t *testing.T, root string, argv []string, name string) {
	const heartbeat = 500 * time.Millisecond

	// One hub in heartbeat mode and one agent for most checks; SIGTERM
	// last, as it ends the agent.
	h := hubAt(t, freeAddr(t), "--heartbeat", heartbeat.String(), "--link-ping", "2s", "--drain-timeout", "5s")
	c := confClient(t, h.ws)
	started := time.Now()
	agent := startConfAgent(t, root, argv, name, h.ws)
	if !t.Run("registration", func(t *testing.T) { checkRegistration(t, c, agent, name, started) }) {
		return // nothing else can pass
	}
	t.Run("heartbeats", func(t *testing.T) { checkHeartbeats(t, h.ws, c, name, heartbeat) })
	t.Run("trace-context", func(t *testing.T) { checkTrace(t, c, name) })
	t.Run("throw", func(t *testing.T) { checkThrow(t, c, name) })
	t.Run("cancel", func(t *testing.T) { checkCancel(t, c, name) })
	t.Run("ttl", func(t *testing.T) { checkTTL(t, c, name) })
	t.Run("1000-concurrent-calls", func(t *testing.T) { checkConcurrent(t, h.ws, name) })
	t.Run("sigstop-expires", func(t *testing.T) {
		before, _, _ := findAgent(t.Context(), c, name)
		checkSIGSTOP(t, c, agent, name, heartbeat)
		stopped := time.Now()
		if err := agent.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		back, ok := pollAgent(c, agent, name, 5*time.Second, true)
		if !ok {
			t.Fatalf("after SIGCONT the agent is not registered again within 5s")
		}
		t.Logf("after SIGCONT registered again %v later", back.Sub(stopped).Round(time.Millisecond))
		checkSameID(t, c, name, before.AgentID)
		checkEcho(t, c, name, `"back"`)
	})
	t.Run("sigterm-drains", func(t *testing.T) { checkSIGTERM(t, c, agent, name) })

	t.Run("hub-restart", func(t *testing.T) { checkHubRestart(t, root, argv, name) })
	t.Run("link-liveness", func(t *testing.T) { checkLinkLiveness(t, root, argv, name) })
}

// startConfAgent runs the agent command against hubs, registering as
// name; it is stopped when the test ends (SIGCONT first: a stopped
// process does not act on SIGTERM), its stderr logged if the test failed.
func startConfAgent(t *testing.T, root string, argv []string, name string, hubs ...string) *proc {
	t.Helper()
	args := slices.Concat(argv[1:], []string{"--name", name, "--drain-timeout", "5s"})
	for _, h := range hubs {
		args = append(args, "--hub", h)
	}
	p := &proc{name: name, stdout: &syncBuf{}, stderr: &syncBuf{}, done: make(chan struct{})}
	ctx, cancel := context.WithTimeout(t.Context(), procLimit)
	p.cmd = exec.CommandContext(ctx, argv[0], args...)
	p.cmd.Dir = root
	// A Go agent built with -race sleeps 1 s at exit by default (for the
	// detector's reports): off, so that its exit time is the SDK's.
	p.cmd.Env = env("GORACE=" + strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	launch(t, p, cancel, "agent "+filepath.Base(argv[len(argv)-1])+" "+strings.Join(args[len(argv)-1:], " "))
	t.Cleanup(func() { _ = p.cmd.Process.Signal(syscall.SIGCONT) }) // runs before launch's
	return p
}

// confClient is a client of the hub at ws without retries or breakers:
// every answer is the agent's (or the hub's), none hidden or held back.
func confClient(t *testing.T, ws string) *mesh.Client {
	t.Helper()
	c, err := mesh.NewClient([]string{ws}, mesh.WithoutReliability())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// findAgent looks name up in mesh.agents.
func findAgent(ctx context.Context, c *mesh.Client, name string) (control.AgentInfo, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var list []control.AgentInfo
	if err := c.Call(ctx, "mesh.agents", nil, &list); err != nil {
		return control.AgentInfo{}, false, err
	}
	for _, a := range list {
		if a.Name == name {
			return a, true, nil
		}
	}
	return control.AgentInfo{}, false, nil
}

// pollAgent polls mesh.agents every 25 ms until name is listed (present)
// or gone (!present), for at most d; it returns when that was seen. It
// gives up early when the agent's process exits while it should be there.
func pollAgent(c *mesh.Client, agent *proc, name string, d time.Duration, present bool) (time.Time, bool) {
	deadline := time.Now().Add(d)
	for {
		_, ok, err := findAgent(context.Background(), c, name)
		now := time.Now()
		if err == nil && ok == present {
			return now, true
		}
		if now.After(deadline) || (present && agent != nil && agent.exitedYet()) {
			return now, false
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// randHex returns n random bytes in hex.
func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// sameJSON reports whether two JSON texts hold the same value; the SDKs
// may re-encode what they echo (spaces, number forms).
func sameJSON(a, b []byte) bool { return jsonEq(string(a), string(b)) }

// checkEcho calls N.echo with params and checks the answer.
func checkEcho(t *testing.T, c *mesh.Client, name, params string) {
	t.Helper()
	var got json.RawMessage
	err := c.Call(t.Context(), name+".echo", json.RawMessage(params), &got, mesh.CallTimeout(5*time.Second))
	if err != nil || !sameJSON(got, []byte(params)) {
		t.Errorf("%s.echo %s = %s, %v; want its params back", name, params, got, err)
	}
}

// checkSameID checks that the agent registered again under the agentId
// it had: an agent keeps it across reconnects.
func checkSameID(t *testing.T, c *mesh.Client, name, id string) {
	t.Helper()
	info, ok, err := findAgent(t.Context(), c, name)
	if err != nil || !ok || info.AgentID != id {
		t.Errorf("registered again as %q (listed %v, %v); want the agentId it had, %q", info.AgentID, ok, err, id)
	}
}

func checkRegistration(t *testing.T, c *mesh.Client, agent *proc, name string, started time.Time) {
	at, ok := pollAgent(c, agent, name, 10*time.Second, true)
	if !ok {
		t.Fatalf("the agent is not in mesh.agents as %q 10s after it started (exited: %v, %v)", name, agent.exitedYet(), agent.err)
	}
	t.Logf("in mesh.agents %v after the process started", at.Sub(started).Round(time.Millisecond))
	info, _, err := findAgent(t.Context(), c, name)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range confMethods(name) {
		if !slices.Contains(info.Methods, m) {
			t.Errorf("mesh.agents: %s serves %v; want %s among them", name, info.Methods, m)
		}
	}
	if info.Status != "ready" {
		t.Errorf("mesh.agents: %s is %q; want ready", name, info.Status)
	}
	var methods []control.MethodInfo
	if err := c.Call(t.Context(), "mesh.methods", nil, &methods); err != nil {
		t.Fatal(err)
	}
	for _, m := range confMethods(name) {
		if !slices.ContainsFunc(methods, func(mi control.MethodInfo) bool {
			return mi.Method == m && mi.Ready > 0 && slices.Contains(mi.Agents, info.AgentID)
		}) {
			t.Errorf("mesh.methods does not list %s served by %s (ready)", m, info.AgentID)
		}
	}
	for _, p := range []string{
		`{"a":1,"b":[true,false,null],"c":{"d":"e","f":[]},"g":{}}`,
		`"a string"`, `""`, `0`, `-17`, `3.25`, `1e+21`, `null`, `true`, `[1,"two",{"three":3}]`,
		`"h\u00e9llo w\u00f6rld \u2713 \u65e5\u672c\u8a9e \ud83d\ude00"`, `"héllo wörld ✓ 日本語 😀"`,
		`"quote \" backslash \\ newline \n tab \t nul \u0000 ls \u2028"`,
	} {
		checkEcho(t, c, name, p)
	}
}

// hubLiveness registers a probe agent over a link of its own and returns
// the register answer's liveness ("" when the hub wants heartbeats).
func hubLiveness(t *testing.T, ws string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	l, err := link.Dial(ctx, ws, link.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p, _ := json.Marshal(control.RegisterParams{AgentID: "conf-probe-" + randHex(4), Name: "conf-probe", Capabilities: []string{"conf-probe.x"}})
	res, err := l.Call(ctx, &envelope.Request{ID: envelope.NewID(), Method: "agent.register", Params: p, Version: envelope.Version})
	if err != nil {
		t.Fatalf("agent.register of a probe: %v", err)
	}
	var r control.RegisterResult
	if err := json.Unmarshal(res.Result, &r); err != nil {
		t.Fatal(err)
	}
	return r.Liveness
}

func checkHeartbeats(t *testing.T, ws string, c *mesh.Client, name string, interval time.Duration) {
	if l := hubLiveness(t, ws); l != "" {
		t.Fatalf("the hub answers agent.register with liveness %q; this check wants one that asks for heartbeats", l)
	}
	var beats []time.Time
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(25 * time.Millisecond) {
		info, ok, err := findAgent(t.Context(), c, name)
		if err != nil || !ok {
			t.Fatalf("mesh.agents while watching the heartbeats: listed %v, %v", ok, err)
		}
		if n := len(beats); n == 0 || !info.LastHeartbeat.Equal(beats[n-1]) {
			beats = append(beats, info.LastHeartbeat)
		}
	}
	var gaps []time.Duration
	for i := 1; i < len(beats); i++ {
		gaps = append(gaps, beats[i].Sub(beats[i-1]))
	}
	slices.Sort(gaps)
	var median time.Duration
	if len(gaps) > 0 {
		median = gaps[len(gaps)/2]
	}
	t.Logf("%d heartbeats seen in 4s (interval %v): median gap %v, gaps %v", len(gaps), interval, median.Round(time.Millisecond), roundAll(gaps))
	if len(gaps) < 5 {
		t.Errorf("%d heartbeats in 4s; want at least 5 (interval %v)", len(gaps), interval)
	}
	if lo, hi := interval*7/10, interval*13/10; median < lo || median > hi {
		t.Errorf("median heartbeat gap %v; want %v ± 30%% [%v, %v]", median.Round(time.Millisecond), interval, lo, hi)
	}
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}

func checkTrace(t *testing.T, c *mesh.Client, name string) {
	traceID, parent := randHex(16), randHex(8)
	var got struct{ Traceparent, Tracestate string }
	err := c.Call(t.Context(), name+".trace", json.RawMessage(`{}`), &got, mesh.WithHeaders(func(h *envelope.Headers) {
		h.Traceparent = "00-" + traceID + "-" + parent + "-01"
		h.Tracestate = "conf=1"
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sent traceparent 00-%s-%s-01; the handler saw %q, tracestate %q", traceID, parent, got.Traceparent, got.Tracestate)
	if f := strings.Split(got.Traceparent, "-"); len(f) != 4 || f[1] != traceID {
		t.Errorf("the handler saw traceparent %q; want trace id %s", got.Traceparent, traceID)
	}
	if got.Tracestate != "conf=1" {
		t.Errorf("the handler saw tracestate %q; want conf=1", got.Tracestate)
	}
}

func checkThrow(t *testing.T, c *mesh.Client, name string) {
	msg := "boom-" + randHex(6)
	err := c.Call(t.Context(), name+".fail", map[string]string{"message": msg}, nil)
	t.Logf("%s.fail: %v", name, err)
	if code := envelope.CodeOf(err); code != envelope.CodeInternal || !strings.Contains(err.Error(), msg) {
		t.Errorf("%s.fail {message: %s}: %s %v; want INTERNAL_ERROR with the message", name, msg, code, err)
	}
}

// awaitAborted polls N.aborted for key until it says aborted, for at most
// 2 s, and reports the time it took and the reason.
func awaitAborted(t *testing.T, c *mesh.Client, name, key string, since time.Time) {
	t.Helper()
	var got struct {
		Aborted bool   `json:"aborted"`
		Reason  string `json:"reason"`
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		err := c.Call(t.Context(), name+".aborted", map[string]string{"key": key}, &got, mesh.CallTimeout(time.Second))
		if err == nil && got.Aborted {
			t.Logf("%s.aborted {key: %s}: aborted %v after the call returned, reason %q", name, key, time.Since(since).Round(time.Millisecond), got.Reason)
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%s.aborted {key: %s} = %+v, %v 2s after the call returned; want aborted: the handler's signal did not fire", name, key, got, err)
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func checkCancel(t *testing.T, c *mesh.Client, name string) {
	key := "cancel-" + randHex(4)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	time.AfterFunc(300*time.Millisecond, cancel)
	start := time.Now()
	err := c.Call(ctx, name+".sleep", map[string]any{"ms": 30000, "key": key}, nil)
	returned := time.Now()
	t.Logf("%s.sleep 30s cancelled after 300ms: %v after %v", name, err, returned.Sub(start).Round(time.Millisecond))
	if code := envelope.CodeOf(err); code != envelope.CodeCancelled {
		t.Errorf("%s.sleep cancelled by the caller: %s %v; want CANCELLED", name, code, err)
	}
	awaitAborted(t, c, name, key, returned)
}

func checkTTL(t *testing.T, c *mesh.Client, name string) {
	key := "ttl-" + randHex(4)
	start := time.Now()
	err := c.Call(t.Context(), name+".sleep", map[string]any{"ms": 30000, "key": key}, nil, mesh.CallTimeout(400*time.Millisecond))
	returned := time.Now()
	t.Logf("%s.sleep 30s with a 400ms timeout: %v after %v", name, err, returned.Sub(start).Round(time.Millisecond))
	if code := envelope.CodeOf(err); code != envelope.CodeTimeout {
		t.Errorf("%s.sleep with a 400ms timeout: %s %v; want TIMEOUT", name, code, err)
	}
	awaitAborted(t, c, name, key, returned)
}

func checkConcurrent(t *testing.T, ws, name string) {
	const n = 1000
	// One client of its own, reliability off as everywhere here, with the
	// default send queue (256 frames): the n calls wait their turn.
	c, err := mesh.NewClient([]string{ws}, mesh.WithoutReliability())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	checkEcho(t, c, name, `"warm"`)
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		errs     = map[string]int{}
		wrong    int
		examples []string
	)
	begin := make(chan struct{})
	for i := range n {
		wg.Go(func() {
			params := fmt.Sprintf(`{"i":%d,"s":"%s"}`, i, randHex(8))
			<-begin
			var got json.RawMessage
			err := c.Call(t.Context(), name+".echo", json.RawMessage(params), &got, mesh.CallTimeout(10*time.Second))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				errs[envelope.CodeOf(err).String()]++
				if len(examples) < 3 {
					examples = append(examples, err.Error())
				}
			case !sameJSON(got, []byte(params)):
				wrong++
				if len(examples) < 3 {
					examples = append(examples, fmt.Sprintf("sent %s, got %s", params, got))
				}
			}
		})
	}
	start := time.Now()
	close(begin)
	wg.Wait()
	took := time.Since(start)
	failed := 0
	for _, k := range errs {
		failed += k
	}
	t.Logf("%d concurrent %s.echo calls in %v: %d answered with their own params, %d errors %v, %d wrong answers",
		n, name, took.Round(time.Millisecond), n-failed-wrong, failed, errs, wrong)
	if failed > 0 || wrong > 0 {
		t.Errorf("%d of %d concurrent calls failed (%v) and %d got another answer; want all answered with their own params; e.g. %q",
			failed, n, errs, wrong, examples)
	}
}

func checkSIGSTOP(t *testing.T, c *mesh.Client, agent *proc, name string, interval time.Duration) {
	t.Helper()
	if _, ok := pollAgent(c, agent, name, 5*time.Second, true); !ok {
		t.Fatalf("the agent is not registered before SIGSTOP")
	}
	stopped := time.Now()
	if err := agent.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	limit := 3*interval + time.Second
	at, ok := pollAgent(c, nil, name, limit+3*time.Second, false)
	gone := at.Sub(stopped)
	if !ok {
		t.Fatalf("the SIGSTOPped agent is still in mesh.agents %v after the stop; want gone within 3 intervals + 1s (%v)", gone.Round(time.Millisecond), limit)
	}
	t.Logf("the SIGSTOPped agent left mesh.agents %v after the stop (interval %v, bounds [%v, %v])", gone.Round(time.Millisecond), interval, interval, limit)
	if gone < interval || gone > limit {
		t.Errorf("the SIGSTOPped agent left mesh.agents %v after the stop; want within [%v, %v] (1 interval to 3 intervals + 1s)", gone.Round(time.Millisecond), interval, limit)
	}
}

func checkSIGTERM(t *testing.T, c *mesh.Client, agent *proc, name string) {
	if _, ok := pollAgent(c, agent, name, 5*time.Second, true); !ok {
		t.Fatalf("the agent is not registered before SIGTERM")
	}
	const drain = 5 * time.Second // the agent's --drain-timeout
	key := "term-" + randHex(4)
	type outcome struct {
		got json.RawMessage
		err error
		at  time.Time
	}
	done := make(chan outcome, 1)
	callStart := time.Now()
	go func() {
		var o outcome
		o.err = c.Call(context.Background(), name+".sleep", map[string]any{"ms": 1500, "key": key}, &o.got, mesh.CallTimeout(10*time.Second))
		o.at = time.Now()
		done <- o
	}()
	waitFor(t, name+".sleep in flight at the agent", 3*time.Second, func() bool {
		info, ok, _ := findAgent(t.Context(), c, name)
		return ok && info.InFlight > 0
	})
	time.Sleep(300*time.Millisecond - time.Since(callStart)) // well into the call
	signalled := time.Now()
	if err := agent.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	at, ok := pollAgent(c, nil, name, 10*time.Second, false)
	left := at.Sub(signalled)
	if !ok {
		t.Errorf("the agent is still in mesh.agents %v after SIGTERM; want deregistered within 1s", left.Round(time.Millisecond))
	} else {
		t.Logf("deregistered: gone from mesh.agents %v after SIGTERM", left.Round(time.Millisecond))
		if left > time.Second {
			t.Errorf("the agent left mesh.agents %v after SIGTERM; want within 1s (deregistered, not expired)", left.Round(time.Millisecond))
		}
	}
	o := <-done
	t.Logf("the call in flight (%s.sleep 1500ms) ended %v after SIGTERM: %s, %v", name, o.at.Sub(signalled).Round(time.Millisecond), o.got, o.err)
	if o.err != nil || !sameJSON(o.got, []byte(`{"slept":1500}`)) {
		t.Errorf("the call in flight during SIGTERM: %s, %v; want {\"slept\":1500}", o.got, o.err)
	}
	select {
	case <-agent.done:
	case <-time.After(time.Until(signalled.Add(drain + time.Second))):
		t.Fatalf("the agent still runs %v after SIGTERM; want it gone within the drain timeout %v + 1s", time.Since(signalled).Round(time.Millisecond), drain)
	}
	t.Logf("the agent exited %v after SIGTERM: %v", agent.exited.Sub(signalled).Round(time.Millisecond), agent.cmd.ProcessState)
	if code := agent.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("the agent exited with %v after SIGTERM; want exit status 0", agent.cmd.ProcessState)
	}
}

// restartHub starts meshd on addr, trying again for up to 2 s while the
// port is still taken, and returns it once /readyz answers 200, with
// that moment.
func restartHub(t *testing.T, addr string, args ...string) (*proc, time.Time) {
	t.Helper()
	client := &http.Client{Timeout: time.Second}
	first := time.Now()
	for {
		p := start(t, "meshd", append([]string{"--listen", addr}, args...)...)
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if httpStatus(client, "http://"+addr+"/readyz") == http.StatusOK {
				return p, time.Now()
			}
			if p.exitedYet() || time.Now().After(deadline) {
				break
			}
		}
		p.stop(5 * time.Second)
		if !strings.Contains(p.stderr.String(), "address already in use") || time.Since(first) > 2*time.Second {
			t.Fatalf("meshd on %s did not become ready (%v):\n%s", addr, p.err, p.stderr.String())
		}
	}
}

func checkHubRestart(t *testing.T, root string, argv []string, name string) {
	const interval = time.Second
	addr := freeAddr(t)
	ws := "ws://" + addr + "/ws"
	args := []string{"--heartbeat", interval.String(), "--link-ping", "2s"}
	h, _ := restartHub(t, addr, args...)
	agent := startConfAgent(t, root, argv, name, ws)
	c0 := confClient(t, ws)
	if _, ok := pollAgent(c0, agent, name, 10*time.Second, true); !ok {
		t.Fatalf("the agent did not register with the first hub within 10s")
	}
	before, _, _ := findAgent(t.Context(), c0, name)
	killed := time.Now()
	if err := h.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-h.done
	_, ready := restartHub(t, addr, args...)
	c := confClient(t, ws) // a new client: the old one's link died with the hub
	at, ok := pollAgent(c, agent, name, 10*time.Second, true)
	back := at.Sub(ready)
	t.Logf("hub SIGKILLed, the new one ready %v later; the agent registered with it %v after /readyz answered 200 (bound 2 intervals = %v)",
		ready.Sub(killed).Round(time.Millisecond), back.Round(time.Millisecond), 2*interval)
	if !ok {
		t.Fatalf("the agent is not registered with the restarted hub %v after it was ready; want within %v", back.Round(time.Millisecond), 2*interval)
	}
	if back > 2*interval {
		t.Errorf("the agent registered with the restarted hub %v after it was ready; want within 2 intervals (%v)", back.Round(time.Millisecond), 2*interval)
	}
	checkSameID(t, c, name, before.AgentID)
	checkEcho(t, c, name, `{"after":"restart"}`)
}

func checkLinkLiveness(t *testing.T, root string, argv []string, name string) {
	const interval = 500 * time.Millisecond
	h := hubAt(t, freeAddr(t), "--heartbeat", interval.String(), "--link-ping", interval.String())
	if l := hubLiveness(t, h.ws); l != control.LivenessLink {
		t.Fatalf("a hub with --link-ping = --heartbeat answers agent.register with liveness %q; want %q", l, control.LivenessLink)
	}
	c := confClient(t, h.ws)
	agent := startConfAgent(t, root, argv, name, h.ws)
	registered, ok := pollAgent(c, agent, name, 10*time.Second, true)
	if !ok {
		t.Fatalf("the agent did not register with a link-liveness hub within 10s")
	}
	checkEcho(t, c, name, `{"liveness":"link"}`)
	// Kept alive by its link past three intervals.
	for end := registered.Add(4 * interval); time.Now().Before(end); time.Sleep(25 * time.Millisecond) {
		if _, ok, err := findAgent(t.Context(), c, name); err != nil || !ok {
			t.Fatalf("the agent left mesh.agents %v after it registered (listed %v, %v); want it kept alive by its link",
				time.Since(registered).Round(time.Millisecond), ok, err)
		}
	}
	checkEcho(t, c, name, `"still here"`)
	checkSIGSTOP(t, c, agent, name, interval)
}
