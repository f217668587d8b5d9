// Command s26diag runs the load phases of RELIABILITY.md's S26 (hostile
// JSON and frames) against an in-process hub, with diagnostic knobs, and
// prints what each phase cost the hub and the machine. The scenario test
// (mesh/s26_test.go, TestS26HostileJSON, scenario build tag) holds the
// pass figures; this command is for finding out why a figure moves. Both
// use the corpus, attackers, timetable and legitimate load of package
// internal/s26.
//
// Run it from the repository root (Linux only: it reads /proc and starts
// its attackers with chrt from util-linux):
//
//	go run ./internal/s26/cmd/s26diag                  # 10 hostile + 10 benign windows
//	go run ./internal/s26/cmd/s26diag -only fragments  # one kind of input
//	go run ./internal/s26/cmd/s26diag -noise 200       # no attack: loopback noise
//	go run ./internal/s26/cmd/s26diag -burn 200        # benign windows with a busy attacker
//	go run ./internal/s26/cmd/s26diag -cpuprofile hub.pprof
//
// What it runs: a hub (metrics on, no warm-up) with the echo and count
// agents, in this process; 100 legitimate echo.echo calls/s from this
// process; and, from this program re-executed under SCHED_IDLE, 10
// attacker connections (4 HTTP /rpc, 4 plain WebSocket, 2 native) at
// ~100 messages/s each, in 1 s loaded windows between 1 s quiet ones.
// Loaded windows alternate hostile (the S26 corpus) and benign (the same
// connections sending a well-formed echo.echo at the same rate: the
// control), unless -control=false. The legitimate calls are split by the
// window they fall in (s26.Schedule.Split): healthy (quiet, past the
// 100 ms settling time), benign, attack.
//
// Flags:
//
//	-windows N    hostile windows (default 10, the test's -short figure);
//	              as many benign ones besides with -control.
//	-control      interleave benign control windows (default true).
//	-legit N      legitimate calls per second (default 100).
//	-only S       attack only with the corpus inputs whose names contain S
//	              (e.g. "fragments", "16 MiB", "nesting"): the hub's cost
//	              per input kind. Formerly AGENTMESH_S26_ONLY.
//	-noise N      instead of attacking, the attacker process sends N MB/s
//	              of loopback TCP traffic in 64 KiB blocks between 10
//	              socket pairs of its own, which never reach the hub: what
//	              the kernel's loopback work and a busy neighbour cost the
//	              legitimate calls without the hub's work ("hostile_sent"
//	              then counts blocks). Formerly AGENTMESH_S26_NOISE.
//	-burn N       in benign windows the attacker process also spins about
//	              N ms of CPU per s (at its SCHED_IDLE): with N the
//	              difference between its CPU in hostile and benign windows
//	              (attacker_cpu_ms_per_s - benign_cpu_ms_per_s of a run
//	              without it), the control differs from the attack only
//	              in what the hub is sent. Formerly AGENTMESH_S26_BURN.
//	-cpuprofile F write a CPU profile of this process (the hub's work,
//	              mostly) over the loaded phases to F.
//	-json         print only the JSON summary line.
//
// What it prints: one JSON line (the figures below, as the scenario test
// printed them before they moved here) and a table. Per phase (quiet,
// benign, attack), per second of window: the hub process's CPU time
// (cpu_ms_per_s) and its kernel part (cpu_sys_ms_per_s, getrusage), the
// time its threads spent runnable but waiting for a CPU (os_wait_ms_per_s,
// /proc/self/task/*/schedstat), its goroutines' wait in Go's run queues
// (go_sched_p99_us, p999: runtime/metrics /sched/latencies), and the
// machine's CPU time per state, every process (machine_*_ms_per_s,
// /proc/stat). Besides: the legitimate p50/p99 per phase and their
// ratios, the attacker process's CPU per window kind, the hostile
// messages' latencies and slowest inputs, GC cycles and pause p99, and
// the load average.
//
// It exits 1 if a phase did not run as meant (the attacker process
// failed, a legitimate call failed, or a hostile or benign message got
// an unexpected answer), 2 on bad flags.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/s26"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/surface/all"
	"github.com/agentmesh/agentmesh/telemetry"
)

// knobs travel to the attacker process in s26.Plan.Diag.
type knobs struct {
	Only  string `json:",omitempty"`
	Noise int    `json:",omitempty"` // MB/s of loopback traffic instead of the attack
	Burn  int    `json:",omitempty"` // ms of CPU per s spun in benign windows
}

// attackerCPU comes back in s26.Report.Diag: the attacker process's CPU
// time in hostile and in benign windows.
type attackerCPU struct{ Hostile, Benign time.Duration }

func main() {
	if p, ok := s26.AttackerPlan(); ok {
		attacker(p)
	}
	var (
		windows    = flag.Int("windows", 10, "hostile `windows` of 1 s")
		control    = flag.Bool("control", true, "interleave benign control windows")
		legitRate  = flag.Int("legit", 100, "legitimate calls per `second`")
		only       = flag.String("only", "", "attack only with the inputs whose names contain `substring`")
		noise      = flag.Int("noise", 0, "send `MB/s` of loopback traffic instead of attacking")
		burn       = flag.Int("burn", 0, "spin `ms` of CPU per s in the attacker process in benign windows")
		cpuprofile = flag.String("cpuprofile", "", "write a CPU profile of the loaded phases to `file`")
		jsonOnly   = flag.Bool("json", false, "print only the JSON summary line")
	)
	flag.Parse()
	k := knobs{Only: *only, Noise: *noise, Burn: *burn}
	if err := check(*windows, *legitRate, k); err != nil {
		fmt.Fprintln(os.Stderr, "s26diag:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *windows, *control, *legitRate, k, *cpuprofile, *jsonOnly); err != nil {
		fmt.Fprintln(os.Stderr, "s26diag:", err)
		stop()
		os.Exit(1)
	}
}

func check(windows, legit int, k knobs) error {
	switch {
	case windows < 1:
		return errors.New("-windows must be at least 1")
	case legit < 1:
		return errors.New("-legit must be at least 1")
	case k.Noise < 0:
		return errors.New("-noise must not be negative")
	case k.Burn < 0 || k.Burn > 1000:
		return errors.New("-burn must be 0 to 1000 ms per s")
	case len(narrow(s26.Corpus(), k.Only)) == 0:
		var names []string
		for _, it := range s26.Corpus() {
			names = append(names, fmt.Sprintf("%q", it.Name))
		}
		return fmt.Errorf("-only %q matches no input; the inputs: %s", k.Only, strings.Join(names, ", "))
	}
	return nil
}

// narrow keeps the items whose names contain only (all, if only is "").
func narrow(corpus []*s26.Item, only string) []*s26.Item {
	var keep []*s26.Item
	for _, it := range corpus {
		if strings.Contains(it.Name, only) {
			keep = append(keep, it)
		}
	}
	return keep
}

// run starts the hub and its agents, runs the phases and prints them.
func run(ctx context.Context, windows int, control bool, legitRate int, k knobs, cpuprofile string, jsonOnly bool) (err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	h, err := hub.New(hub.Config{WarmUp: -1}, hub.WithTelemetry(telemetry.New(nil, telemetry.NewMetrics(nil))))
	if err == nil {
		all.Mount(h) // the corpus reaches every surface, as meshd serves them
	}
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	defer wg.Wait() // the hub and the agents end with ctx (cancel runs first)
	defer cancel()
	wg.Go(func() {
		if err := h.Serve(ctx, ln); err != nil && ctx.Err() == nil {
			fmt.Fprintln(os.Stderr, "s26diag: hub:", err)
		}
	})
	tgt := s26.Target{Addr: ln.Addr().String(), WS: "ws://" + ln.Addr().String() + "/ws"}
	counter, _, _ := s26.NewCounter()
	for _, a := range []*agents.Agent{agents.NewEcho(), counter} {
		wg.Go(func() {
			if err := a.Run(ctx, tgt.WS); err != nil && ctx.Err() == nil {
				fmt.Fprintf(os.Stderr, "s26diag: agent %s: %v\n", a.Name(), err)
			}
		})
		select {
		case <-a.Registered():
		case <-time.After(10 * time.Second):
			return fmt.Errorf("agent %s did not register within 10 s", a.Name())
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	legit, err := mesh.NewClient([]string{tgt.WS})
	if err != nil {
		return err
	}
	defer legit.Close()

	loaded := windows
	if control {
		loaded = 2 * windows
	}
	runtime.GC()
	gc0 := gcStats()
	sched := s26.Schedule{Start: time.Now().Add(500 * time.Millisecond), Window: time.Second, Loaded: loaded, Control: control}
	diag, err := json.Marshal(k)
	if err != nil {
		return err
	}
	if cpuprofile != "" {
		f, err := os.Create(cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	lctx, lcancel := context.WithDeadline(ctx, sched.End())
	defer lcancel()
	// This process's and the machine's counters at each window boundary.
	snaps := make([]snapshot, 2*sched.Loaded+2)
	var swg sync.WaitGroup
	swg.Go(func() {
		for i := range snaps {
			t := time.NewTimer(time.Until(sched.Start.Add(time.Duration(i) * sched.Window)))
			select {
			case <-lctx.Done():
				t.Stop()
				if i < len(snaps)-1 {
					continue
				}
			case <-t.C:
			}
			snaps[i] = takeSnapshot()
		}
	})
	load := s26.LegitLoad(lctx, legit, legitRate)
	rep, aerr := s26.RunAttackers(ctx, s26.Plan{Target: tgt, Schedule: sched, Diag: diag})
	<-lctx.Done()
	swg.Wait()
	samples, lFails, lErrs := load()
	if cpuprofile != "" {
		pprof.StopCPUProfile()
	}
	if aerr != nil {
		return fmt.Errorf("attacker process: %v", aerr)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	gc1 := gcStats()
	var cpu attackerCPU
	if err := json.Unmarshal(rep.Diag, &cpu); err != nil {
		return fmt.Errorf("attacker process's CPU figures %q: %v", rep.Diag, err)
	}
	var quiet, hostile, benign phase
	for i := 0; i+1 < len(snaps); i++ {
		ph := &quiet
		if i%2 == 1 {
			ph = &benign
			if _, _, h := sched.LoadedWindow(i / 2); h {
				ph = &hostile
			}
		}
		ph.add(snaps[i], snaps[i+1])
	}
	hLat, aLat, bLat := sched.Split(samples)
	st := rep.Hostile
	hp99, ap99, bp99 := s26.Pctl(hLat, 99), s26.Pctl(aLat, 99), s26.Pctl(bLat, 99)
	ratio := func(a, b time.Duration) float64 { return float64(a) / float64(max(b, 1)) }
	secs := float64(windows)
	summary := map[string]any{
		"scenario":                "S26 diagnostic",
		"knobs":                   k,
		"attack_s":                secs,
		"control":                 control,
		"hostile_sent":            st.Sent,
		"hostile_rate":            float64(st.Sent) / secs,
		"hostile_unexpected":      st.NBad,
		"hostile_p50_ms":          s26.Ms(s26.Pctl(st.Lat, 50)),
		"hostile_p99_ms":          s26.Ms(s26.Pctl(st.Lat, 99)),
		"hostile_max_ms":          s26.Ms(s26.Pctl(st.Lat, 100)),
		"slowest_inputs":          st.Slowest(6),
		"outcomes":                st.ByOutcome,
		"ws_over_limit":           st.Closes,
		"legit_healthy":           len(hLat),
		"legit_healthy_p50":       s26.Ms(s26.Pctl(hLat, 50)),
		"legit_healthy_p99":       s26.Ms(hp99),
		"legit_attack":            len(aLat),
		"legit_attack_p50":        s26.Ms(s26.Pctl(aLat, 50)),
		"legit_attack_p99":        s26.Ms(ap99),
		"legit_fail":              lFails,
		"p99_ratio":               ratio(ap99, hp99),
		"benign_sent":             rep.Benign.Sent,
		"benign_unexpected":       rep.Benign.NBad,
		"legit_benign":            len(bLat),
		"legit_benign_p50":        s26.Ms(s26.Pctl(bLat, 50)),
		"legit_benign_p99":        s26.Ms(bp99),
		"p99_ratio_benign":        ratio(bp99, hp99),
		"p99_ratio_attack_benign": ratio(ap99, bp99),
		"attacker_cpu_ms_per_s":   s26.Ms(cpu.Hostile) / secs,
		"benign_cpu_ms_per_s":     s26.Ms(cpu.Benign) / float64(max(loaded-windows, 1)),
		"quiet":                   quiet.summary(),
		"attack":                  hostile.summary(),
		"benign":                  benign.summary(),
		"gc_cycles":               gc1.cycles - gc0.cycles,
		"gc_pause_p99_ms":         gc1.pauseP99ms,
		"loadavg":                 loadAvg(),
	}
	line, err := json.Marshal(summary)
	if err != nil {
		return err
	}
	fmt.Println(string(line))
	if !jsonOnly {
		fmt.Printf("\nlegitimate p99: healthy %.2f ms (n=%d)", s26.Ms(hp99), len(hLat))
		if control {
			fmt.Printf(", benign %.2f ms (%.2f×, n=%d)", s26.Ms(bp99), ratio(bp99, hp99), len(bLat))
		}
		fmt.Printf(", attack %.2f ms (%.2f×, n=%d)", s26.Ms(ap99), ratio(ap99, hp99), len(aLat))
		if control {
			fmt.Printf("; attack / benign %.2f×", ratio(ap99, bp99))
		}
		if k.Noise > 0 {
			fmt.Printf("\nnoise (no attack): %d blocks of 64 KiB (%.0f MB/s)", st.Sent, float64(st.Sent)*(64<<10)/1e6/secs)
		} else {
			fmt.Printf("\nhostile: %d sent (%.0f/s), p50 %.2f ms, p99 %.2f ms, max %.2f ms",
				st.Sent, float64(st.Sent)/secs, s26.Ms(s26.Pctl(st.Lat, 50)), s26.Ms(s26.Pctl(st.Lat, 99)), s26.Ms(s26.Pctl(st.Lat, 100)))
		}
		fmt.Printf("; attacker process CPU %.0f ms/s in hostile windows, %.0f in benign ones\n",
			summary["attacker_cpu_ms_per_s"], summary["benign_cpu_ms_per_s"])
		fmt.Println("per second of window (hub = this process):")
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "phase\thub cpu ms\thub kernel ms\thub os_wait ms\tgo sched p99 µs\tmachine user\tsystem\tsoftirq\tsteal\tidle\t")
		for _, r := range []struct {
			name string
			p    *phase
		}{{"quiet", &quiet}, {"benign", &benign}, {"attack", &hostile}} {
			if r.p.windows == 0 {
				continue
			}
			s := r.p.summary()
			fmt.Fprintf(tw, "%s\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t\n", r.name,
				s["cpu_ms_per_s"], s["cpu_sys_ms_per_s"], s["os_wait_ms_per_s"], s["go_sched_p99_us"],
				s["machine_user_ms_per_s"], s["machine_system_ms_per_s"], s["machine_softirq_ms_per_s"], s["machine_steal_ms_per_s"], s["machine_idle_ms_per_s"])
		}
		tw.Flush()
		fmt.Printf("gc: %d cycles, pause p99 %.2f ms; load average %s\n", gc1.cycles-gc0.cycles, gc1.pauseP99ms, loadAvg())
	}
	var bad []string
	for _, b := range st.Bad {
		bad = append(bad, "attack: "+b)
	}
	for _, b := range rep.Benign.Bad {
		bad = append(bad, "benign load: "+b)
	}
	for _, e := range lErrs {
		bad = append(bad, "legitimate call: "+e)
	}
	if len(bad) > 0 || lFails > 0 {
		return fmt.Errorf("the phases did not run as meant (%d hostile, %d benign unexpected; %d legitimate calls failed):\n  %s",
			st.NBad, rep.Benign.NBad, lFails, strings.Join(bad, "\n  "))
	}
	return nil
}

// attacker is the attacker process: the scenario's traffic, changed by
// the knobs; it reports what it saw and its CPU per window kind, and
// exits.
func attacker(p s26.Plan) {
	var k knobs
	if len(p.Diag) > 0 {
		if err := json.Unmarshal(p.Diag, &k); err != nil {
			fmt.Fprintln(os.Stderr, "attacker: knobs:", err)
			os.Exit(2)
		}
	}
	corpus, benign := narrow(s26.Corpus(), k.Only), s26.Benign()
	rep := s26.NewReport()
	var cpu attackerCPU
	_ = p.RunWindows(context.Background(), func(ctx context.Context, _ int, hostile bool) {
		cpu0 := processCPU()
		switch {
		case hostile && k.Noise > 0:
			blocks, err := noise(ctx, k.Noise)
			rep.Hostile.Sent += blocks
			if err != nil {
				rep.Hostile.NBad++
				rep.Hostile.Bad = append(rep.Hostile.Bad, "noise: "+err.Error())
			}
		case hostile:
			s26.Attack(ctx, p.Target, corpus, rep.Hostile)
		default:
			var burner sync.WaitGroup
			if k.Burn > 0 {
				burner.Go(func() { spin(ctx, k.Burn) })
			}
			s26.Attack(ctx, p.Target, benign, rep.Benign)
			burner.Wait() // ends with ctx, as the attack did
		}
		if hostile {
			cpu.Hostile += processCPU() - cpu0
		} else {
			cpu.Benign += processCPU() - cpu0
		}
	})
	var err error
	if rep.Diag, err = json.Marshal(cpu); err != nil {
		fmt.Fprintln(os.Stderr, "attacker:", err)
		os.Exit(2)
	}
	s26.ExitWithReport(rep)
}

// spin spins ms/100 ms of every 10 ms (ms per s) until ctx ends.
func spin(ctx context.Context, ms int) {
	tk := time.NewTicker(10 * time.Millisecond)
	defer tk.Stop()
	for ctx.Err() == nil {
		for t0 := time.Now(); time.Since(t0) < time.Duration(ms)*time.Millisecond/100; {
		}
		select {
		case <-ctx.Done():
		case <-tk.C:
		}
	}
}

// noise sends mbps MB/s in 64 KiB blocks over 10 loopback connections
// of its own until ctx ends, and returns the blocks sent.
func noise(ctx context.Context, mbps int) (int, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer c.Close()
				stop := context.AfterFunc(ctx, func() { c.Close() })
				defer stop()
				buf := make([]byte, 64<<10)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
				}
			})
		}
	})
	var mu sync.Mutex
	blocks := 0
	block := make([]byte, 64<<10)
	every := time.Duration(float64(time.Second) * float64(len(block)) * 10 / (float64(mbps) * 1e6))
	for range 10 {
		wg.Go(func() {
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", ln.Addr().String())
			if err != nil {
				return
			}
			defer c.Close()
			tk := time.NewTicker(every)
			defer tk.Stop()
			for ctx.Err() == nil {
				if _, err := c.Write(block); err != nil {
					return
				}
				mu.Lock()
				blocks++
				mu.Unlock()
				select {
				case <-ctx.Done():
				case <-tk.C:
				}
			}
		})
	}
	<-ctx.Done()
	ln.Close()
	wg.Wait()
	return blocks, nil
}
