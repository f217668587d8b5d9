package e2e_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// The web console of issue [M14], driven in a real headless Chromium
// (Debian's chromium, which .ci/run installs) with chromedp, against a real
// meshd --demo: the page is read through its DOM contract (#status,
// #agents rows by data-agent-id, #methods rows by data-method with .rate,
// .errors and .breaker cells, the call form, #auth-required), as a person
// would see it, with no reload. Every step saves a full-page screenshot in
// the test's artifact directory (a temporary directory; kept with
// `go test -artifacts -outputdir DIR`), and any error in the browser's
// console (console.error, an uncaught exception, an error entry of the
// browser log) fails the test. MESH_CONSOLE_SCREENSHOT=FILE.png also writes
// the screenshot of the whole console (agents, rates, an open breaker, a
// call's answer) there, for the README.

// consoleHeartbeat is meshd's --heartbeat in these tests: a removed agent
// must leave the page within 3 of them.
const consoleHeartbeat = time.Second

// chromiumPath finds Debian's chromium: missing, the test fails in CI and
// is skipped elsewhere, saying what to install.
func chromiumPath(t *testing.T) string {
	t.Helper()
	missing := t.Fatalf
	if os.Getenv("CI") == "" {
		missing = t.Skipf
	}
	p, err := exec.LookPath("chromium")
	if err != nil {
		missing("chromium is not on PATH (%v): install Debian's chromium package (`apt-get install chromium`; CI does)", err)
	}
	return p
}

// browserLog keeps the errors of a browser's console, from every tab.
type browserLog struct {
	mu   sync.Mutex
	errs []chromedp.ConsoleMessage
	seen int // how many of errs were reported already
}

func (l *browserLog) add(m chromedp.ConsoleMessage) {
	if m.Type != chromedp.ConsoleError && !m.IsException() {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errs = append(l.errs, m)
}

// check fails the test on each error not reported yet.
func (l *browserLog) check(t *testing.T, when string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.errs[l.seen:] {
		t.Errorf("browser console error (%s): %s [source %q, %s:%d]", when, m, m.Source, m.URL, m.Line)
	}
	l.seen = len(l.errs)
}

// browser is a headless Chromium of the test's own, with a fresh profile.
type browser struct {
	ctx  context.Context // the first tab's chromedp context (about:blank; the pages open tabs of their own)
	log  *browserLog
	shot string // the screenshots' directory
}

// startBrowser starts Chromium; it is closed when the test ends.
func startBrowser(t *testing.T) *browser {
	t.Helper()
	bin := chromiumPath(t)
	if out, err := exec.Command(bin, "--version").Output(); err == nil {
		t.Logf("browser: %s", strings.TrimSpace(string(out)))
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin),
		chromedp.NoSandbox, // the tests run as root in CI
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 1000),
	)
	// Not t.Context: the browser is closed in a cleanup, after the
	// screenshots of a failure are taken.
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	b := &browser{ctx: ctx, log: &browserLog{}, shot: t.ArtifactDir()}
	// The first Run starts the browser (with no timeout of its own: it
	// would end the browser).
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting %s: %v", bin, err)
	}
	return b
}

// listen collects the console messages of the tab of ctx until it closes.
func (b *browser) listen(ctx context.Context) {
	msgs := chromedp.Console(ctx) // subscribed now, before any navigation
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			b.log.add(m)
		}
	}()
}

// page is one tab showing the console.
type page struct {
	t   *testing.T
	b   *browser
	ctx context.Context
}

// open opens url in a new tab, with a session of its own, and waits for
// #status to be visible. The tab is closed when t ends, before the
// processes t started are stopped.
func (b *browser) open(t *testing.T, url string) *page {
	t.Helper()
	ctx, cancel := chromedp.NewContext(b.ctx)
	t.Cleanup(cancel)
	b.listen(ctx)
	p := &page{t: t, b: b, ctx: ctx}
	if err := p.do(10*time.Second, chromedp.Navigate(url), chromedp.WaitVisible(chromedp.ID("status"))); err != nil {
		p.fail("opening %s: %v", url, err)
	}
	return p
}

func (p *page) do(d time.Duration, steps ...chromedp.Action[chromedp.Void]) error {
	ctx, cancel := context.WithTimeout(p.ctx, d)
	defer cancel()
	return chromedp.Do(ctx, steps...)
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](p *page, expr string) (T, error) {
	ctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[T](expr))
}

// screenshot saves a full-page PNG as NAME.png in the artifact directory
// and returns its path.
func (p *page) screenshot(name string) string {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		p.t.Errorf("screenshot %s: %v", name, err)
		return ""
	}
	path := filepath.Join(p.b.shot, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		p.t.Errorf("screenshot %s: %v", name, err)
		return ""
	}
	p.t.Logf("screenshot %s", path)
	return path
}

// fail ends the test with what the page shows.
func (p *page) fail(format string, args ...any) {
	p.t.Helper()
	p.screenshot("failure")
	if text, err := eval[string](p, `document.body ? document.body.innerText : ""`); err == nil {
		if len(text) > 4000 {
			text = text[:4000] + "…"
		}
		p.t.Logf("the page's text:\n%s", text)
	}
	p.b.log.check(p.t, "at the failure")
	p.t.Fatalf(format, args...)
}

// waitJS polls a JavaScript expression until it is true, failing the test
// after d; it returns how long that took.
func (p *page) waitJS(what string, d time.Duration, expr string) time.Duration {
	p.t.Helper()
	start := time.Now()
	var last error
	for {
		ok, err := eval[bool](p, expr)
		if err == nil && ok {
			return time.Since(start)
		}
		last = err
		if time.Since(start) > d {
			p.fail("%s: not within %v (last evaluation error: %v)", what, d, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// holdsJS checks that a JavaScript expression stays true for d.
func (p *page) holdsJS(what string, d time.Duration, expr string) {
	p.t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		ok, err := eval[bool](p, expr)
		if err != nil || !ok {
			p.fail("%s: no longer so (%v)", what, err)
		}
	}
}

// The page's contract, read in JavaScript.
const (
	jsCell = `(r, s) => ((r.querySelector(s) || {}).textContent || "").trim()`
	// jsAgents is the rows of #agents.
	jsAgents = `Array.from(document.querySelectorAll('#agents tr[data-agent-id]')).map(r => { const c = ` + jsCell + `;
		return {id: r.dataset.agentId, name: c(r, '.name'), hub: c(r, '.hub'), state: c(r, '.state'), methods: c(r, '.methods')}; })`
	// jsRows is how many data rows the page shows.
	jsRows = `document.querySelectorAll('#agents tr[data-agent-id], #methods tr[data-method]').length`
	// jsLive: the page's live stream is connected.
	jsLive = `((document.getElementById('status') || {}).textContent || "").trim() === 'live'`
)

// jsVisible is an expression true when the element of that id is shown.
func jsVisible(id string) string {
	return fmt.Sprintf(`(el => !!el && el.getClientRects().length > 0 && getComputedStyle(el).visibility !== 'hidden')(document.getElementById(%q))`, id)
}

// jsText is the trimmed text of the element of that id ("" if absent).
func jsText(id string) string {
	return fmt.Sprintf(`((document.getElementById(%q) || {}).textContent || "").trim()`, id)
}

type consoleAgent struct {
	ID      string `json:"id"`
	Name    string `json:"name"`
	Hub     string `json:"hub"`
	State   string `json:"state"`
	Methods string `json:"methods"`
}

func (a consoleAgent) serves(method string) bool {
	return slices.ContainsFunc(strings.Split(a.Methods, ","), func(m string) bool { return strings.TrimSpace(m) == method })
}

func (p *page) agents() []consoleAgent {
	p.t.Helper()
	list, err := eval[[]consoleAgent](p, jsAgents)
	if err != nil {
		p.fail("reading #agents: %v", err)
	}
	return list
}

type consoleMethod struct {
	Instances string `json:"instances"`
	Rate      string `json:"rate"`
	Errors    string `json:"errors"`
	P50       string `json:"p50"`
	P99       string `json:"p99"`
	Breaker   string `json:"breaker"`
}

// method reads the row of #methods for name; nil when there is none.
func (p *page) method(name string) *consoleMethod {
	p.t.Helper()
	q, _ := json.Marshal(`#methods tr[data-method="` + name + `"]`)
	m, err := eval[*consoleMethod](p, fmt.Sprintf(`(r => { if (!r) return null; const c = %s;
		return {instances: c(r, '.instances'), rate: c(r, '.rate'), errors: c(r, '.errors'), p50: c(r, '.p50'), p99: c(r, '.p99'), breaker: c(r, '.breaker')}; })(document.querySelector(%s))`, jsCell, q))
	if err != nil {
		p.fail("reading the row of %s: %v", name, err)
	}
	return m
}

// number reads a cell's number (its first one: "12.5" of "12.5/s").
var leadingNumber = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?`)

func number(cell string) (float64, bool) {
	n, err := strconv.ParseFloat(leadingNumber.FindString(strings.TrimSpace(cell)), 64)
	return n, err == nil
}

// waitMethodRow polls the row of a method until cond holds, failing after
// d; it returns the row and how long that took.
func (p *page) waitMethodRow(what, name string, d time.Duration, cond func(*consoleMethod) bool) (*consoleMethod, time.Duration) {
	p.t.Helper()
	start := time.Now()
	var m *consoleMethod
	for {
		m = p.method(name)
		if m != nil && cond(m) {
			return m, time.Since(start)
		}
		if time.Since(start) > d {
			p.fail("%s: not within %v (the row of %s: %+v)", what, d, name, m)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestConsole: the console of a meshd --demo in Chromium, live: the demo
// agents listed; an agent SIGKILLed gone from the page within 3 heartbeats;
// a load from meshctl bench raising a method's rate; a failing chaos agent
// opening a breaker; the call form answering with a result and a trace id.
// Then, with --auth-key, no data without an admin token.
func TestConsole(t *testing.T) {
	b := startBrowser(t)
	t.Run("demo", func(t *testing.T) { consoleDemo(t, b) })
	t.Run("auth", func(t *testing.T) { consoleAuth(t, b) })
	b.log.check(t, "at the end")
}

func consoleDemo(t *testing.T, b *browser) {
	h := startHub(t, "--demo", "--heartbeat", consoleHeartbeat.String())
	waitMethods(t, h.ws, "echo.echo", "memory.put")
	killed := start(t, "meshctl", "agent", "run", "echo", "--hub", h.ws, "--id", "console-echo-2")

	opened := time.Now()
	p := b.open(t, h.base+"/ui/")
	p.waitJS(`#status "live"`, 10*time.Second, jsLive)
	t.Logf("the page is live %v after it was opened", time.Since(opened).Round(time.Millisecond))

	// The demo agents (echo, kv, chat) and the agent of its own process.
	p.waitJS("the demo agents and console-echo-2 listed", 10*time.Second,
		`(a => ['echo', 'kv', 'chat'].every(n => a.some(x => x.name === n)) && a.some(x => x.id === 'console-echo-2'))(`+jsAgents+`)`)
	for _, a := range p.agents() {
		t.Logf("agent row: %+v", a)
	}
	for _, a := range p.agents() {
		if a.Name == "echo" && !a.serves("echo.echo") {
			t.Errorf("agent row %+v: want echo.echo among its methods", a)
		}
		if a.ID == "" || a.Hub == "" || a.State == "" {
			t.Errorf("agent row %+v: want an id, a hub and a state", a)
		}
	}
	if m := p.method("echo.echo"); m == nil || !strings.HasPrefix(m.Instances, "2/") {
		t.Errorf("the row of echo.echo: %+v; want 2/2 instances (the demo's and console-echo-2)", m)
	}
	p.screenshot("agents")
	b.log.check(t, "agents listed")

	// SIGKILL: no deregistration; the row goes without a reload of the
	// page (a value set in the page survives).
	if _, err := eval[string](p, `window.meshE2E = 'no reload'`); err != nil {
		t.Fatal(err)
	}
	kill := time.Now()
	if err := killed.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	bound := 3*consoleHeartbeat + time.Second
	p.waitJS("console-echo-2's row gone", bound,
		`!document.querySelector('#agents tr[data-agent-id="console-echo-2"]')`)
	gone := time.Since(kill)
	t.Logf("console-echo-2 left the page %v after its SIGKILL (bound: 3 heartbeats of %v + 1s = %v)", gone.Round(time.Millisecond), consoleHeartbeat, bound)
	if v, err := eval[string](p, `window.meshE2E || ''`); err != nil || v != "no reload" {
		t.Errorf("the page was reloaded (window.meshE2E %q, %v)", v, err)
	}
	if !slices.ContainsFunc(p.agents(), func(a consoleAgent) bool { return a.Name == "echo" }) {
		t.Error("the demo's echo agent left the page too")
	}
	p.screenshot("agent-removed")
	b.log.check(t, "agent removed")

	// A load on echo.echo: its rate moves from 0 while meshctl bench runs.
	before := p.method("echo.echo")
	if before == nil {
		p.fail("no row for echo.echo")
	}
	if n, ok := number(before.Rate); !ok || n != 0 {
		t.Errorf("echo.echo's rate before any call: %q; want 0", before.Rate)
	}
	benchDone := make(chan result, 1)
	ctx := t.Context()
	go func() {
		benchDone <- runCtl(ctx, nil, "bench", "echo.echo", `{"console":"load"}`, "--hub", h.ws,
			"-d", "10s", "--rps", "200", "-c", "8", "--slowest", "0", "-o", "json")
	}()
	benchStart := time.Now()
	var maxRate float64
	row, took := p.waitMethodRow("echo.echo's rate above 50/s under a 200 calls/s load", "echo.echo", 10*time.Second, func(m *consoleMethod) bool {
		n, _ := number(m.Rate)
		maxRate = max(maxRate, n)
		return n > 50
	})
	t.Logf("echo.echo's rate on the page: %q %v after the load started (%+v)", row.Rate, took.Round(time.Millisecond), row)
	p.screenshot("rate")
	var r result
	for sampling := true; sampling; { // the highest rate shown until the load ends
		select {
		case r = <-benchDone:
			sampling = false
		case <-time.After(100 * time.Millisecond):
			if m := p.method("echo.echo"); m != nil {
				n, _ := number(m.Rate)
				maxRate = max(maxRate, n)
			}
		}
	}
	var rep struct {
		Count int64   `json:"count"`
		RPS   float64 `json:"rps"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &rep) != nil {
		t.Errorf("meshctl bench: %v", r)
	}
	t.Logf("meshctl bench: %d calls at %.1f/s over %v; the highest rate the page showed: %.1f/s",
		rep.Count, rep.RPS, time.Since(benchStart).Round(100*time.Millisecond), maxRate)
	b.log.check(t, "rate")

	// A chaos agent that fails every call: its breaker opens after 5
	// failures in a row, and the page shows it.
	start(t, "meshctl", "agent", "run", "chaos", "--hub", h.ws, "--id", "console-chaos-1", "--fail-rate", "1", "--fail-code", "UNAVAILABLE")
	waitMethods(t, h.ws, "chaos.echo")
	p.waitJS("console-chaos-1 listed", 5*time.Second, `!!document.querySelector('#agents tr[data-agent-id="console-chaos-1"]')`)
	if m := p.method("chaos.echo"); m == nil || m.Breaker != "closed" {
		t.Errorf("the row of chaos.echo before any call: %+v; want its breaker closed", m)
	}
	r = runCtl(t.Context(), nil, "bench", "chaos.echo", `{}`, "--hub", h.ws, "-n", "50", "-c", "1", "--slowest", "0", "-o", "json")
	var chaosRep struct {
		Count  int64            `json:"count"`
		Errors map[string]int64 `json:"errorDistribution"`
	}
	_ = json.Unmarshal([]byte(r.stdout), &chaosRep)
	t.Logf("meshctl bench chaos.echo -n 50: exit %d, %d calls, errors %v", r.code, chaosRep.Count, chaosRep.Errors)
	row, took = p.waitMethodRow("chaos.echo's breaker shown open", "chaos.echo", 5*time.Second, func(m *consoleMethod) bool { return m.Breaker == "open" })
	t.Logf("chaos.echo's breaker shown %q %v after the calls ended: %+v", row.Breaker, took.Round(time.Millisecond), row)
	if n, ok := number(row.Errors); !ok || n <= 0 {
		t.Errorf("chaos.echo's error ratio %q; want above 0%%", row.Errors)
	}
	p.screenshot("breaker-open")
	b.log.check(t, "breaker")

	// The call form: echo.echo answers with its params, a duration and a
	// trace id.
	const params = `{"hello":"console"}`
	if err := p.do(10*time.Second,
		chromedp.Clear(chromedp.ID("call-method")),
		chromedp.SendKeys(chromedp.ID("call-method"), "echo.echo"),
		chromedp.SendKeys(chromedp.ID("call-params"), params),
		chromedp.Click(chromedp.ID("call-submit")),
	); err != nil {
		p.fail("the call form: %v", err)
	}
	// "…" while the call is in flight.
	p.waitJS("#call-result and #call-trace filled", 5*time.Second,
		`!["", "…"].includes(`+jsText("call-result")+`) && `+jsText("call-trace")+` !== ""`)
	if err := p.do(5*time.Second, chromedp.WaitVisible(chromedp.ID("call-result"))); err != nil {
		p.fail("#call-result not visible: %v", err)
	}
	res, _ := eval[string](p, jsText("call-result"))
	dur, _ := eval[string](p, jsText("call-duration"))
	trace, _ := eval[string](p, jsText("call-trace"))
	t.Logf("the call form's answer: result %q, duration %q, trace %q", res, dur, trace)
	if !jsonEq(res, params) {
		t.Errorf("#call-result %q; want %s", res, params)
	}
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(trace) {
		t.Errorf("#call-trace %q; want a trace id of 32 hex digits", trace)
	}
	if dur == "" {
		t.Error("#call-duration is empty")
	}
	if ok, _ := eval[bool](p, jsLive); !ok {
		t.Error(`#status is no longer "live"`)
	}
	shot := p.screenshot("console")
	if dst := os.Getenv("MESH_CONSOLE_SCREENSHOT"); dst != "" && shot != "" {
		png, err := os.ReadFile(shot)
		if err == nil {
			err = os.WriteFile(dst, png, 0o644)
		}
		if err != nil {
			t.Errorf("MESH_CONSOLE_SCREENSHOT: %v", err)
		} else {
			t.Logf("MESH_CONSOLE_SCREENSHOT: %s", dst)
		}
	}
	b.log.check(t, "call form")
}

// consoleAuth: with --auth-key the page asks for a token and shows no data
// without one, nor with a wrong or a non-admin one; an admin token shows
// the mesh.
func consoleAuth(t *testing.T, b *browser) {
	key := filepath.Join(t.TempDir(), "mesh.key")
	if r := meshctl(t, "token", "keygen", "--out", key); r.code != 0 {
		t.Fatalf("keygen: %v", r)
	}
	issue := func(args ...string) string {
		r := meshctl(t, append([]string{"token", "issue", "--key", key, "--ttl", "1h"}, args...)...)
		if r.code != 0 {
			t.Fatalf("token issue %v: %v", args, r)
		}
		return strings.TrimSpace(r.stdout)
	}
	admin := issue("--sub", "console-admin", "--role", "admin")
	reader := issue("--sub", "console-reader", "--role", "reader")
	h := startHub(t, "--demo", "--heartbeat", consoleHeartbeat.String(), "--auth-key", key)

	// The API itself: no stream without a token.
	if s := httpStatus(&http.Client{Timeout: 2 * time.Second}, h.base+"/ui/api/stream"); s != http.StatusUnauthorized {
		t.Errorf("GET /ui/api/stream without a token: %d; want 401", s)
	}

	// The page asks /ui/api/info and /ui/api/whoami before it opens the
	// stream, so no refused request (which Chromium logs as an error) is
	// made: here too the browser's log must stay free of errors.
	noData := `!` + jsVisible("auth-required") + ` ? false : (` + jsRows + `) === 0 && !(` + jsLive + `)`
	for _, c := range []struct{ name, token string }{
		{"no-token", ""},
		{"wrong-token", "not-a-token"},
		{"non-admin-token", reader},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := b.open(t, h.base+"/ui/")
			p.waitJS("#auth-required shown", 10*time.Second, jsVisible("auth-required"))
			if c.token != "" {
				if err := p.do(10*time.Second,
					chromedp.SendKeys(chromedp.ID("token"), c.token),
					chromedp.Click(chromedp.ID("token-save")),
				); err != nil {
					p.fail("entering the token: %v", err)
				}
				p.waitJS("#auth-error says why", 5*time.Second, jsText("auth-error")+` !== ""`)
				msg, _ := eval[string](p, jsText("auth-error"))
				t.Logf("#auth-error: %q", msg)
			}
			// Over two ticks of the stream: still no data.
			p.holdsJS("#auth-required shown, no agent or method row, not live", 2500*time.Millisecond, noData)
			p.screenshot("auth-" + c.name)
			b.log.check(t, c.name)
		})
	}
	t.Run("admin-token", func(t *testing.T) {
		p := b.open(t, h.base+"/ui/")
		p.waitJS("#auth-required shown", 10*time.Second, jsVisible("auth-required"))
		if err := p.do(10*time.Second,
			chromedp.SendKeys(chromedp.ID("token"), admin),
			chromedp.Click(chromedp.ID("token-save")),
		); err != nil {
			p.fail("entering the token: %v", err)
		}
		took := p.waitJS("live with the demo agents", 10*time.Second,
			`!`+jsVisible("auth-required")+` && (`+jsLive+`) && (a => ['echo', 'kv', 'chat'].every(n => a.some(x => x.name === n)))(`+jsAgents+`)`)
		t.Logf("with the admin token the demo agents are listed %v after it was saved", took.Round(time.Millisecond))
		p.screenshot("auth-admin-token")
		b.log.check(t, "admin token")
	})
}
