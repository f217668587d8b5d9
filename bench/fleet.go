package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorilla/websocket"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/contract/control"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/mesh"
)

// fleetOpts are -fleet's knobs.
type fleetOpts struct {
	n, base  int           // idle agents at scale, and at the baseline
	idleFor  time.Duration // how long the hub's idle CPU is measured
	loadFor  time.Duration // how long each echo throughput is measured
	parallel int           // registrations in flight in the agents' process
	runs     int
	rounds   int // per run: the n agents registered, echoed beside, killed
}

// FleetRun is one run of -fleet: one hub, first with base idle agents,
// then, for each round, with n more, which are then killed at once.
type FleetRun struct {
	RegisterAll []time.Duration // per round: n agents dialled and registered
	HubReady    []int           // per round: agents the hub listed ready then
	IdleCPU     []float64       // per round: the hub's CPU at n idle agents, % of a core
	IdleCPUBase float64         // the same at base idle agents, before the first round
	// Per round: the same at base idle agents again, from the drop on,
	// before the echo that follows it (as long as IdleCPU before echo at n).
	IdleCPUAfter []float64
	// Echo calls/s at base idle agents (before the first round and after
	// each) and at n (in each round); EchoBase and EchoN are their medians.
	EchoBases, EchoNs []float64
	EchoBase, EchoN   float64
	// Echo calls/s at base idle agents, n idle links to another server
	// beside the hub (before each round), and their median.
	EchoControls []float64
	EchoControl  float64
	// The CPU, in % of a core, of what idles beside each round's echo:
	// the n agents' process; the control's clients and its server.
	AgentsCPU                           []float64
	ControlClientsCPU, ControlServerCPU []float64
	Relinked                            int64           // agents that registered again: their link was closed under them
	DropAll                             []time.Duration // per round: the n links closed at once until the hub lists none of them
	HubRSSMiB                           []float64       // per round, beside the n idle agents
	DropIncomplete                      bool            // the hub still listed some after 60 s
}

// fleet runs -fleet: what N idle agents cost one hub (registration, idle
// CPU, routing throughput beside them, the drop of them all), runs
// times, each on a fresh hub.
func fleet(o fleetOpts) error {
	for _, c := range []struct{ role, what string }{
		{"ping-clients", "a plain gorilla/websocket server with %d idle connections, each pinging every 5 s"},
		{"link-clients", "the same server with %d idle agentmesh links (the agents' link layer and ping timing, not registered)"},
	} {
		ctl, err := pingControl(c.role, o.n, o.idleFor)
		if err != nil {
			return fmt.Errorf("control (%s): %w", c.role, err)
		}
		fmt.Printf("control: "+c.what+": %.1f %% of a core\n", o.n, ctl)
	}
	var rs []FleetRun
	for i := range o.runs {
		r, err := fleetRun(o)
		if err != nil {
			return fmt.Errorf("run %d: %w", i+1, err)
		}
		rs = append(rs, r)
		fmt.Printf("run %d: %d agents registered in %v (hub lists %v ready); %d links dropped at once gone from the hub in %v%s; %d agents relinked; hub idle CPU %s %% of a core (%.1f %% at %d before, %s after each drop); hub RSS %s MiB\n",
			i+1, o.n, roundMs(r.RegisterAll), r.HubReady, o.n, roundMs(r.DropAll),
			map[bool]string{true: " (INCOMPLETE after 60 s)"}[r.DropIncomplete], r.Relinked, fmtPercents(r.IdleCPU), r.IdleCPUBase, o.base, fmtPercents(r.IdleCPUAfter), fmtPercents(r.HubRSSMiB))
		for k, e := range r.EchoNs {
			around := (r.EchoBases[k] + r.EchoBases[k+1]) / 2
			c := r.EchoControls[k]
			fmt.Printf("  round %d: echo c=16 at %d agents %.0f and %.0f calls/s (around it); at %d idle agents %.0f (%.2fx; the agents' process took %.1f %% of a core); control, with %d idle links to another server beside the hub, %.0f (%.2fx; its clients took %.1f %% and its server %.1f %%); at %d agents against the control %.2fx\n",
				k+1, o.base, r.EchoBases[k], r.EchoBases[k+1], o.n, e, e/around, r.AgentsCPU[k],
				o.n, c, c/around, r.ControlClientsCPU[k], r.ControlServerCPU[k], o.n, e/c)
		}
		fmt.Printf("  medians: echo at %d agents %.0f, at %d %.0f (%.2fx), control %.0f (%.2fx); at %d against the control %.2fx\n",
			o.base, r.EchoBase, o.n, r.EchoN, r.EchoN/r.EchoBase, r.EchoControl, r.EchoControl/r.EchoBase, o.n, r.EchoN/r.EchoControl)
	}
	if len(rs) > 1 {
		var relinked int64
		for _, r := range rs {
			relinked += r.Relinked
		}
		fmt.Printf("%d runs: %d agents relinked in all\n", len(rs), relinked)
	}
	return nil
}

func fleetRun(o fleetOpts) (FleetRun, error) {
	var r FleetRun
	addr := freeAddr()
	hub, err := startRoleEnv("mesh-hub", addr, profileDir != "", "BENCH_WINDOW_PROFILE="+filepath.Join(profileDir, fmt.Sprintf("fleet-%d-idle-hub.pprof", o.n)))
	if err != nil {
		return r, err
	}
	defer hub.stop()
	if err := waitDial(addr); err != nil {
		return r, err
	}
	echo, err := startRole("mesh-agent", addr)
	if err != nil {
		return r, err
	}
	defer echo.stop()
	cl, err := mesh.NewClient([]string{"ws://" + addr + "/ws"}, mesh.WithoutReliability(), mesh.WithWaitForReady())
	if err != nil {
		return r, err
	}
	defer cl.Close()
	ctx := context.Background()
	summary := func() (control.AgentsSummary, error) {
		var s control.AgentsSummary
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		err := cl.Call(c, "mesh.agents", control.ListParams{Summary: true}, &s)
		return s, err
	}

	base, err := startFleetAgents(addr, o.base, o.parallel, "")
	if err != nil {
		return r, err
	}
	defer base.stop()
	time.Sleep(2 * time.Second)
	r.IdleCPUBase = cpuShare(hub, o.idleFor)
	b, err := echoRate(addr, o.loadFor)
	if err != nil {
		return r, err
	}
	r.EchoBases = append(r.EchoBases, b)
	// Rounds: echo beside the control, then the n agents register, echo
	// runs beside them, they are killed at once, and echo runs again at
	// base. Each echo at n thus lies between two at base and follows its
	// control on the same hub, and the machine's drift reaches them alike,
	// as the comparison's interleaved rounds do.
	for round := range max(o.rounds, 1) {
		if err := r.controlEcho(o, round, addr); err != nil {
			return r, fmt.Errorf("round %d: control: %w", round+1, err)
		}
		if err := r.fleetRound(o, round, addr, hub, summary); err != nil {
			return r, fmt.Errorf("round %d: %w", round+1, err)
		}
		// The hub settles as long as it did before the echo at n: its
		// idle CPU at base, after the drop, over the same window.
		r.IdleCPUAfter = append(r.IdleCPUAfter, cpuShare(hub, o.idleFor))
		b, err := echoRate(addr, o.loadFor)
		if err != nil {
			return r, err
		}
		r.EchoBases = append(r.EchoBases, b)
	}
	r.EchoBase, r.EchoN, r.EchoControl = median(r.EchoBases), median(r.EchoNs), median(r.EchoControls)
	return r, nil
}

// controlEcho measures the control for echo at n: the same hub and its
// base agents, with n idle links pinging a server of their own beside
// them on this machine, which take the CPU the n agents' pings would
// (the server's and its clients'), none of it the hub's.
func (r *FleetRun) controlEcho(o fleetOpts, round int, addr string) error {
	name := ""
	if round == 0 {
		name = fmt.Sprintf("fleet-%d-control-clients-echo.pprof", o.n)
	}
	srv, clients, stop, err := startControl("link-clients", o.n, windowProfile(name))
	if err != nil {
		return err
	}
	defer stop()
	var echo float64
	cpu := cpuWhile(func() { echo, err = echoBeside(addr, o.loadFor, clients, name != "") }, clients, srv)
	if err != nil {
		return err
	}
	r.EchoControls = append(r.EchoControls, echo)
	r.ControlClientsCPU = append(r.ControlClientsCPU, cpu[0])
	r.ControlServerCPU = append(r.ControlServerCPU, cpu[1])
	return nil
}

// fleetRound registers the n agents on the hub, measures the hub's idle
// CPU and RSS and echo beside them, then kills them all at once and
// measures how long the hub takes to drop them.
func (r *FleetRun) fleetRound(o fleetOpts, round int, addr string, hub *proc, summary func() (control.AgentsSummary, error)) error {
	first := round == 0
	name := ""
	if first {
		name = fmt.Sprintf("fleet-%d-agents-echo.pprof", o.n)
	}
	start := time.Now()
	many, err := startFleetAgents(addr, o.n, o.parallel, windowProfile(name))
	if err != nil {
		return err
	}
	defer many.stop()
	r.RegisterAll = append(r.RegisterAll, time.Since(start))
	s, err := summary()
	if err != nil {
		return err
	}
	r.HubReady = append(r.HubReady, s.ByState["ready"])
	time.Sleep(3 * time.Second) // the registrations' garbage collected, heartbeats in their rhythm
	if first && profileDir != "" {
		_ = hub.cmd.Process.Signal(syscall.SIGUSR1)
	}
	r.IdleCPU = append(r.IdleCPU, cpuShare(hub, o.idleFor))
	if first && profileDir != "" {
		_ = hub.cmd.Process.Signal(syscall.SIGUSR2)
	}
	r.HubRSSMiB = append(r.HubRSSMiB, float64(rss(hub.cmd.Process.Pid))/(1<<20))
	agentsProc := &proc{many.cmd, "fleet-agents"}
	var echo float64
	cpu := cpuWhile(func() { echo, err = echoBeside(addr, o.loadFor, agentsProc, name != "") }, agentsProc)[0]
	if err != nil {
		return err
	}
	r.EchoNs = append(r.EchoNs, echo)
	r.AgentsCPU = append(r.AgentsCPU, cpu)
	r.Relinked += many.relinked.Load()

	// All n links closed at once: the kernel closes the process's sockets.
	if first && profileDir != "" {
		time.Sleep(time.Second) // its window profile written (SIGUSR2 has no answer)
	}
	_ = many.cmd.Process.Signal(syscall.SIGKILL)
	start = time.Now()
	want := o.base + 1
	for {
		s, err := summary()
		if err == nil && s.Agents <= want {
			r.DropAll = append(r.DropAll, time.Since(start))
			return nil
		}
		if time.Since(start) > 60*time.Second {
			r.DropAll = append(r.DropAll, time.Since(start))
			r.DropIncomplete = true
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// roundMs lists ds rounded to milliseconds.
func roundMs(ds []time.Duration) string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond).String()
	}
	return strings.Join(out, ", ")
}

// fmtPercents lists xs to one decimal.
func fmtPercents(xs []float64) string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = fmt.Sprintf("%.1f", x)
	}
	return strings.Join(out, ", ")
}

// median is xs's median (the mean of the middle two for an even count).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// windowProfile is the environment that makes a role process profile the
// windows the harness marks (profileWindow) into name under -cpuprofile's
// directory, or "" without -cpuprofile or a name. A role process started
// without it must not be sent profiled's signals: they would end it.
func windowProfile(name string) string {
	if profileDir == "" || name == "" {
		return ""
	}
	return "BENCH_WINDOW_PROFILE=" + filepath.Join(profileDir, name)
}

// profiled runs f with p's window profile on, under -cpuprofile.
func profiled(f func() (float64, error), p *proc) (float64, error) {
	if profileDir != "" {
		_ = p.cmd.Process.Signal(syscall.SIGUSR1)
		defer func() { _ = p.cmd.Process.Signal(syscall.SIGUSR2) }()
	}
	return f()
}

// echoBeside is echoRate with p's window profile on when p was started
// with one (windowProfile): a process started without it must not get
// profiled's signals.
func echoBeside(addr string, d time.Duration, p *proc, profile bool) (float64, error) {
	if profile {
		return profiled(func() (float64, error) { return echoRate(addr, d) }, p)
	}
	return echoRate(addr, d)
}

// cpuWhile runs f and returns each of ps's CPU meanwhile, in % of one core.
func cpuWhile(f func(), ps ...*proc) []float64 {
	c0 := make([]time.Duration, len(ps))
	for i, p := range ps {
		c0[i] = p.cpu()
	}
	start := time.Now()
	f()
	d := time.Since(start)
	out := make([]float64, len(ps))
	for i, p := range ps {
		out[i] = 100 * float64(p.cpu()-c0[i]) / float64(d)
	}
	return out
}

// cpuShare is p's CPU over d, in % of one core.
func cpuShare(p *proc, d time.Duration) float64 {
	c0 := p.cpu()
	time.Sleep(d)
	return 100 * float64(p.cpu()-c0) / float64(d)
}

// echoRate is the echo calls/s of 16 callers on one plain JSON-RPC
// connection over d.
func echoRate(addr string, d time.Duration) (float64, error) {
	const c = 16
	cl, err := dialJSONRPC("ws://"+addr+"/ws", c)
	if err != nil {
		return 0, err
	}
	defer cl.close()
	var calls, errs atomic.Int64
	var wg sync.WaitGroup
	warm := time.Now().Add(300 * time.Millisecond)
	end := warm.Add(d)
	var start time.Time
	var startOnce sync.Once
	for w := range c {
		wg.Go(func() {
			for {
				now := time.Now()
				if now.After(end) {
					return
				}
				err := cl.call(w)
				if now.Before(warm) {
					continue
				}
				startOnce.Do(func() { start = now })
				calls.Add(1)
				if err != nil {
					errs.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if n := errs.Load(); n > 0 {
		return 0, fmt.Errorf("echo: %d of %d calls failed", n, calls.Load())
	}
	return float64(calls.Load()) / time.Since(start).Seconds(), nil
}

// fleetAgents is a process of idle agents (-role fleet-agents).
type fleetAgents struct {
	cmd      *exec.Cmd
	relinked atomic.Int64
	done     chan struct{}
}

// startFleetAgents starts n idle agents in a process of their own and
// returns once all registered. The process reports each agent that
// registers again (its link was closed under it) on a line of its own.
func startFleetAgents(addr string, n, parallel int, env string) (*fleetAgents, error) {
	cmd := exec.Command(os.Args[0], "-role", "fleet-agents", "-addr", fmt.Sprintf("%s,%d,%d", addr, n, parallel))
	if env != "" {
		cmd.Env = append(os.Environ(), env)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	f := &fleetAgents{cmd: cmd, done: make(chan struct{})}
	ready := make(chan struct{})
	go func() {
		defer close(f.done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			switch line := sc.Text(); {
			case line == "ready":
				close(ready)
			case strings.HasPrefix(line, "relinked "):
				f.relinked.Add(1)
			}
		}
	}()
	select {
	case <-ready:
		return f, nil
	case <-f.done:
		_ = cmd.Wait()
		return nil, fmt.Errorf("the agents' process ended before all %d registered", n)
	case <-time.After(5 * time.Minute):
		f.stop()
		return nil, fmt.Errorf("%d agents did not register within 5 minutes", n)
	}
}

func (f *fleetAgents) stop() {
	_ = f.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-f.done:
	case <-time.After(10 * time.Second):
		_ = f.cmd.Process.Kill()
	}
	_ = f.cmd.Wait()
}

// runFleetAgents is the fleet-agents role: n idle agents, parallel of
// them registering at a time, as a fleet of agents starting
// independently would; "ready" once all registered, then "relinked ID"
// for each registration after an agent's first.
func runFleetAgents(ctx context.Context, spec string) error {
	f := strings.Split(spec, ",")
	if len(f) != 3 {
		return fmt.Errorf("fleet-agents: want addr,n,parallel")
	}
	n, _ := strconv.Atoi(f[1])
	parallel, _ := strconv.Atoi(f[2])
	out := &lockedWriter{w: bufio.NewWriter(os.Stdout)}
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(parallel, 1))
	var registered sync.WaitGroup
	for i := range n {
		id := fmt.Sprintf("idle-%d-%d", os.Getpid(), i)
		// Each serves a method of its own kind, not echo.echo: the echo
		// calls measured beside them go to the one echo agent.
		a := agents.New("idle", agents.WithID(id), agents.WithLogger(slog.New(&registrations{id: id, out: out})))
		a.Handle("idle.noop", func(context.Context, json.RawMessage) (any, error) { return nil, nil })
		sem <- struct{}{}
		registered.Add(1)
		wg.Go(func() { _ = a.Run(ctx, "ws://"+f[0]+"/ws") })
		go func() {
			select {
			case <-a.Registered():
			case <-ctx.Done():
			}
			<-sem
			registered.Done()
		}()
	}
	registered.Wait()
	out.line("ready")
	wg.Wait()
	return nil
}

// registrations is a log handler that writes "relinked ID" for every
// "registered" record of an agent after its first.
type registrations struct {
	id   string
	seen atomic.Int32
	out  *lockedWriter
}

func (h *registrations) Enabled(context.Context, slog.Level) bool { return true }
func (h *registrations) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "registered" && h.seen.Add(1) > 1 {
		h.out.line("relinked " + h.id)
	}
	return nil
}
func (h *registrations) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *registrations) WithGroup(string) slog.Handler      { return h }

type lockedWriter struct {
	mu sync.Mutex
	w  *bufio.Writer
}

func (l *lockedWriter) line(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = io.WriteString(l.w, s+"\n")
	_ = l.w.Flush()
}

// startRoleEnv is startRole with env added to the process's environment
// when add is set.
func startRoleEnv(role, addr string, add bool, env ...string) (*proc, error) {
	cmd := exec.Command(os.Args[0], "-role", role, "-addr", addr)
	cmd.Stderr = os.Stderr
	if add {
		cmd.Env = append(os.Environ(), env...)
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &proc{cmd, role}, nil
}

// profileWindow profiles the CPU to path between SIGUSR1 and SIGUSR2;
// the returned func ends a profile still running.
func profileWindow(path string) func() {
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGUSR1, syscall.SIGUSR2)
	var mu sync.Mutex
	var stop func()
	go func() {
		for s := range sig {
			mu.Lock()
			switch {
			case s == syscall.SIGUSR1 && stop == nil:
				if st, err := startProfile(path); err == nil {
					stop = st
				}
			case s == syscall.SIGUSR2 && stop != nil:
				stop()
				stop = nil
			}
			mu.Unlock()
		}
	}()
	return func() {
		signal.Stop(sig)
		mu.Lock()
		defer mu.Unlock()
		if stop != nil {
			stop()
		}
	}
}

// runPingServer is the ping-server role, -fleet's control: a plain
// gorilla/websocket server that reads every connection and answers
// pings (gorilla's default handler), nothing else. What it costs at N
// idle connections pinging every 5 s is the floor of one ping exchange
// per link per interval on this machine.
func runPingServer(ctx context.Context, addr string) error {
	// It speaks the agentmesh subprotocols only to let link-clients
	// connect; whatever they send is read and dropped.
	up := websocket.Upgrader{Subprotocols: []string{envelope.SubprotocolV2, envelope.Subprotocol}}
	srv := &http.Server{Addr: addr, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := up.Upgrade(w, r, nil)
		if err != nil {
			return
		}
		go func() {
			defer ws.Close()
			for {
				if _, _, err := ws.ReadMessage(); err != nil {
					return
				}
			}
		}()
	})}
	go func() { <-ctx.Done(); srv.Close() }()
	if err := srv.ListenAndServe(); err != http.ErrServerClosed {
		return err
	}
	return nil
}

// runPingClients is the ping-clients role: N plain WebSocket clients of
// addr, each pinging every 5 s (and reading the pongs), 64 dialling at a
// time; "ready" once all are connected.
func runPingClients(ctx context.Context, spec string) error {
	host, ns, _ := strings.Cut(spec, ",")
	n, _ := strconv.Atoi(ns)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	var dialled sync.WaitGroup
	for range n {
		sem <- struct{}{}
		dialled.Add(1)
		wg.Go(func() {
			ws, _, err := websocket.DefaultDialer.DialContext(ctx, "ws://"+host+"/", nil)
			<-sem
			dialled.Done()
			if err != nil {
				fmt.Fprintln(os.Stderr, "ping-clients:", err)
				return
			}
			defer ws.Close()
			go func() {
				for {
					if _, _, err := ws.ReadMessage(); err != nil {
						return
					}
				}
			}()
			t := time.NewTicker(5 * time.Second)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					if ws.WriteControl(websocket.PingMessage, nil, time.Now().Add(5*time.Second)) != nil {
						return
					}
				}
			}
		})
	}
	dialled.Wait()
	fmt.Println("ready")
	wg.Wait()
	return nil
}

// runLinkClients is the link-clients role: N idle agentmesh links
// (link.Dial, the link layer the agents run on, with its ping timers and
// their timing) to addr, 64 dialling at a time, none registering; "ready"
// once all are connected. The second control: the ping-server with the
// agents' own ping pattern (their pings arrive in more, smaller bursts
// than ping-clients' tickers give).
func runLinkClients(ctx context.Context, spec string) error {
	host, ns, _ := strings.Cut(spec, ",")
	n, _ := strconv.Atoi(ns)
	var links []*link.Link
	defer func() {
		for _, l := range links {
			l.Close()
		}
	}()
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			l, err := link.Dial(ctx, "ws://"+host+"/ws", link.Config{})
			if err != nil {
				fmt.Fprintln(os.Stderr, "link-clients:", err)
				return
			}
			mu.Lock()
			links = append(links, l)
			mu.Unlock()
		})
	}
	wg.Wait()
	fmt.Println("ready")
	<-ctx.Done()
	return nil
}

// pingControl measures the ping-server's CPU with n clients of the
// role clients (ping-clients or link-clients) idle.
func pingControl(clients string, n int, d time.Duration) (float64, error) {
	srv, _, stop, err := startControl(clients, n, "")
	if err != nil {
		return 0, err
	}
	defer stop()
	return cpuShare(srv, d), nil
}

// startControl starts the ping-server and n idle clients of the role
// clients (cp: their process), and returns once every client's pings are
// in their rhythm.
func startControl(clients string, n int, env string) (srv, cp *proc, stop func(), err error) {
	addr := freeAddr()
	srv, err = startRole("ping-server", addr)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := waitDial(addr); err != nil {
		srv.stop()
		return nil, nil, nil, err
	}
	cmd := exec.Command(os.Args[0], "-role", clients, "-addr", fmt.Sprintf("%s,%d", addr, n))
	if env != "" {
		cmd.Env = append(os.Environ(), env)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		srv.stop()
		return nil, nil, nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		srv.stop()
		return nil, nil, nil, err
	}
	cp = &proc{cmd, clients} // stopped as a server is: SIGTERM, then a kill after 5 s
	stop = func() { cp.stop(); srv.stop() }
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		stop()
		return nil, nil, nil, fmt.Errorf("%s did not come up: %w", clients, err)
	}
	time.Sleep(6 * time.Second) // every client's ticker in its rhythm
	return srv, cp, stop, nil
}
