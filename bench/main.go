// Command bench compares agentmesh with what a user would pick instead,
// on this machine, in one run: raw TCP ping-pong (the floor), NATS
// request-reply through an embedded nats-server, gRPC-Go unary echo, and
// agentmesh (client → hub → echo agent). Every server runs in its own
// process; the load generator is the same for all.
//
//	cd bench && go run . [-d 3s] [-c 1,16,128]
//	cd bench && go run . -stream [-d 3s] [-sizes 128,16384]   (stream.go)
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/gorilla/websocket"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/gcfloor"
	"github.com/agentmesh/agentmesh/link"
	"github.com/agentmesh/agentmesh/link/wsconn"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/telemetry"
)

// payload is 128 bytes; for agentmesh it is a JSON document of that size.
var payload = []byte(`{"data":"` + strings.Repeat("x", 128-11) + `"}`)

func main() {
	role := flag.String("role", "", "internal: run one server role")
	addr := flag.String("addr", "", "internal: address for the role")
	dur := flag.Duration("d", 3*time.Second, "duration of each measurement")
	concs := flag.String("c", "1,16,128", "concurrencies")
	only := flag.String("only", "", "comma-separated systems to run (tcp,nats,grpc,agentmesh)")
	jsonOut := flag.String("json", "", "also write the results as JSON to this file")
	rounds := flag.Int("rounds", 1, "measure every cell this many times, the systems interleaved, and report the medians")
	idle := flag.Int("idle", 0, "instead: measure the hub's memory per idle agent link with this many agents")
	heapProfile := flag.String("heapprofile", "", "with -idle: write the hub's heap profile here once the agents idled")
	settle := flag.Duration("idle-settle", 2*time.Second, "with -idle: how long the agents idle before the hub is measured (the runtime's forced GC, which shrinks idle stacks, runs every 2 min)")
	fleetN := flag.Int("fleet", 0, "instead: measure what this many idle agents cost one hub (registration, idle CPU, echo throughput beside them against -fleet-base, dropping them all)")
	fleetBase := flag.Int("fleet-base", 10, "with -fleet: the baseline's idle agents")
	fleetIdle := flag.Duration("fleet-idle", 10*time.Second, "with -fleet: how long the hub's idle CPU is measured")
	fleetParallel := flag.Int("fleet-parallel", 64, "with -fleet: registrations in flight at once")
	fleetRuns := flag.Int("fleet-runs", 1, "with -fleet: runs, each on a fresh hub")
	fleetRounds := flag.Int("fleet-rounds", 3, "with -fleet: rounds per run, each registering the agents, measuring echo beside them, killing them and measuring echo again without them")
	streamMode := flag.Bool("stream", false, "instead: measure streaming (chunks/s, MB/s, time to first chunk) at the chunk sizes of -sizes")
	sizes := flag.String("sizes", "128,16384", "with -stream: chunk sizes in bytes")
	win := flag.Int("window", 0, "with -stream: the agentmesh client's credit window in chunks (mesh.Window; 0: the client's default, stream.DefaultWindow)")
	flag.StringVar(&profileDir, "cpuprofile", "", "write CPU profiles of every process (servers per run, the load generator per cell) into this directory, as SYSTEM-cC-ROLE.pprof")
	gcMinHeap := flag.Int("gc-min-heap", gcfloor.DefaultFloor, "the hub's heap floor in bytes, as meshd's --gc-min-heap (0: GOGC alone)")
	flag.Parse()
	if *role == "" {
		// The roles the harness starts read it from their environment.
		os.Setenv("BENCH_GC_MIN_HEAP", strconv.Itoa(*gcMinHeap))
	}
	if *role != "" {
		if f := os.Getenv("BENCH_HEAP_PROFILE"); f != "" {
			// A heap profile when the harness asks (SIGUSR1: -idle's
			// -heapprofile, once the idle links settled).
			defer heapOnSignal(f)()
		}
		if f := os.Getenv("BENCH_WINDOW_PROFILE"); f != "" {
			// A profile of a window the harness marks: SIGUSR1 starts it,
			// SIGUSR2 ends it (-fleet's idle window).
			defer profileWindow(f)()
		} else if f := os.Getenv("BENCH_CPUPROFILE"); f != "" {
			stop, err := startProfile(f)
			if err != nil {
				fmt.Fprintln(os.Stderr, *role+":", err)
				os.Exit(1)
			}
			defer stop()
		}
		if err := runRole(*role, *addr); err != nil {
			fmt.Fprintln(os.Stderr, *role+":", err)
			os.Exit(1)
		}
		return
	}
	if *idle > 0 {
		if err := idleMemory(*idle, *settle, *heapProfile); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *fleetN > 0 {
		if err := fleet(fleetOpts{n: *fleetN, base: *fleetBase, idleFor: *fleetIdle, loadFor: *dur, parallel: *fleetParallel, runs: *fleetRuns, rounds: *fleetRounds}); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *streamMode {
		var ss []int
		for _, s := range strings.Split(*sizes, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || n < 1 || n > 1_000_000 {
				fmt.Fprintln(os.Stderr, "bad -sizes")
				os.Exit(2)
			}
			ss = append(ss, n)
		}
		cells, err := compareStreams(*dur, ss, *only, *rounds, *win)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		printStreamTable(os.Stdout, cells)
		if *jsonOut != "" {
			b, _ := json.MarshalIndent(cells, "", "  ")
			_ = os.WriteFile(*jsonOut, b, 0o644)
		}
		return
	}
	var cs []int
	for _, s := range strings.Split(*concs, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			fmt.Fprintln(os.Stderr, "bad -c")
			os.Exit(2)
		}
		cs = append(cs, n)
	}
	results, err := compare(*dur, cs, *only, *rounds)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	printTable(os.Stdout, results, cs)
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(results, "", "  ")
		_ = os.WriteFile(*jsonOut, b, 0o644)
	}
}

// ---- server roles, each run in its own process ----

func runRole(role, addr string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	switch role {
	case "tcp-server":
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		go func() { <-ctx.Done(); ln.Close() }()
		for {
			c, err := ln.Accept()
			if err != nil {
				return nil
			}
			go func() {
				defer c.Close()
				r, w := bufio.NewReader(c), bufio.NewWriter(c)
				var hdr [4]byte
				buf := make([]byte, 64<<10)
				for {
					if _, err := io.ReadFull(r, hdr[:]); err != nil {
						return
					}
					n := binary.BigEndian.Uint32(hdr[:])
					if _, err := io.ReadFull(r, buf[:n]); err != nil {
						return
					}
					_, _ = w.Write(hdr[:])
					_, _ = w.Write(buf[:n])
					if r.Buffered() == 0 {
						if err := w.Flush(); err != nil {
							return
						}
					}
				}
			}()
		}
	case "nats-server":
		host, port, _ := net.SplitHostPort(addr)
		p, _ := strconv.Atoi(port)
		s, err := natsserver.NewServer(&natsserver.Options{Host: host, Port: p, NoSigs: true, NoLog: true})
		if err != nil {
			return err
		}
		go s.Start()
		if !s.ReadyForConnections(10 * time.Second) {
			return fmt.Errorf("nats-server not ready")
		}
		<-ctx.Done()
		s.Shutdown()
		return nil
	case "nats-responder":
		nc, err := nats.Connect("nats://" + addr)
		if err != nil {
			return err
		}
		defer nc.Close()
		if _, err := nc.Subscribe("echo", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
			return err
		}
		_ = nc.Flush()
		<-ctx.Done()
		return nil
	case "nats-publisher":
		return runNATSPublisher(ctx, addr)
	case "grpc-server":
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		s := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}), grpc.UnknownServiceHandler(func(_ any, st grpc.ServerStream) error {
			var b []byte
			if err := st.RecvMsg(&b); err != nil {
				return err
			}
			return st.SendMsg(&b)
		}))
		go func() { <-ctx.Done(); s.Stop() }()
		return s.Serve(ln)
	case "mesh-hub":
		// meshd as configured by default: reliability chain and metrics on,
		// trace export off, the heap floor of --gc-min-heap.
		floor, _ := strconv.Atoi(os.Getenv("BENCH_GC_MIN_HEAP"))
		defer gcfloor.Start(uint64(max(floor, 0))).Stop()
		h, err := hub.New(hub.Config{MaxConns: 50000}, // -idle runs 10,000 agents and more: over the default cap of 10,000 they were refused and redialled
			hub.WithTelemetry(telemetry.New(nil, telemetry.NewMetrics(nil))))
		if err != nil {
			return err
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		return h.Serve(ctx, ln)
	case "mesh-agent":
		return agents.NewEcho().Run(ctx, "ws://"+addr+"/ws")
	case "mesh-agent-v1":
		return agents.NewEcho(agents.WithConnConfig(link.Config{JSONFrames: true})).Run(ctx, "ws://"+addr+"/ws")
	case "ping-server":
		return runPingServer(ctx, addr)
	case "ping-clients":
		return runPingClients(ctx, addr)
	case "link-clients":
		return runLinkClients(ctx, addr)
	case "fleet-agents":
		return runFleetAgents(ctx, addr)
	case "idle-agents":
		// N agents in this one process, registered and then idle (they
		// heartbeat every 5 s).
		host, n, _ := strings.Cut(addr, ",")
		count, _ := strconv.Atoi(n)
		var wg sync.WaitGroup
		for range count {
			a := agents.NewEcho()
			wg.Go(func() { _ = a.Run(ctx, "ws://"+host+"/ws") })
			<-a.Registered()
		}
		fmt.Println("ready")
		wg.Wait()
		return nil
	}
	return fmt.Errorf("unknown role %q", role)
}

type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	p := v.(*[]byte)
	*p = append((*p)[:0], data...)
	return nil
}
func (rawCodec) Name() string { return "raw" }

// ---- processes ----

type proc struct {
	cmd  *exec.Cmd
	role string
}

// profileDir, when set (-cpuprofile), receives a CPU profile of every
// process of every cell; profileCell names the cell being set up.
var profileDir, profileCell string

// startProfile writes a CPU profile to path until the returned func runs.
func startProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

func startRole(role, addr string) (*proc, error) {
	cmd := exec.Command(os.Args[0], "-role", role, "-addr", addr)
	cmd.Stderr = os.Stderr
	if profileDir != "" {
		cmd.Env = append(os.Environ(), "BENCH_CPUPROFILE="+filepath.Join(profileDir, profileCell+"-"+role+".pprof"))
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &proc{cmd, role}, nil
}

func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
}

// cpu returns the user+system CPU time a process has used.
func (p *proc) cpu() time.Duration { return procCPU(p.cmd.Process.Pid) }

func procCPU(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // clock ticks (USER_HZ 100)
}

// procIO returns the read and write system calls a process has made
// (/proc/PID/io syscr, syscw: read(2), readv(2), write(2), writev(2) and
// their kin; not recvmsg, sendmsg or epoll_wait).
func procIO(pid int) (r, w int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ": ")
		n, _ := strconv.ParseInt(v, 10, 64)
		switch k {
		case "syscr":
			r = n
		case "syscw":
			w = n
		}
	}
	return r, w
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func waitDial(addr string) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s did not come up", addr)
}

// ---- the load generator ----

// Cell is one measurement.
type Cell struct {
	Concurrency int     `json:"concurrency"`
	Calls       int64   `json:"calls"`
	Errors      int64   `json:"errors"`
	RPS         float64 `json:"rps"`
	P50us       float64 `json:"p50_us"`
	P99us       float64 `json:"p99_us"`
	CPUmsPer1k  float64 `json:"cpu_ms_per_1k"`
	// ProcCPUus is each process's CPU per call in µs, by role (the
	// harness's own process, the callers, is "client").
	ProcCPUus map[string]float64 `json:"proc_cpu_us"`
	// ProcReads and ProcWrites are each process's read and write system
	// calls per call, by role (procIO), the harness's own as "client".
	ProcReads  map[string]float64 `json:"proc_reads"`
	ProcWrites map[string]float64 `json:"proc_writes"`
}

// Result is one system's row.
type Result struct {
	System string `json:"system"`
	Cells  []Cell `json:"cells"`
}

// system is something to measure: setup returns a call function made for
// c workers, the processes whose CPU counts, and a teardown.
type system struct {
	name  string
	setup func(c int) (call func(worker int) error, procs []*proc, teardown func(), err error)
}

func measure(s system, c int, d time.Duration) (Cell, error) {
	profileCell = fmt.Sprintf("%s-c%d", s.name, c)
	call, procs, teardown, err := s.setup(c)
	if err != nil {
		return Cell{}, err
	}
	defer teardown()
	if profileDir != "" {
		stop, err := startProfile(filepath.Join(profileDir, profileCell+"-client.pprof"))
		if err != nil {
			return Cell{}, err
		}
		defer stop()
	}
	// Warm up: connections, JIT of caches, the hub's first snapshot.
	warm := time.Now().Add(300 * time.Millisecond)
	var wg sync.WaitGroup
	for w := range c {
		wg.Go(func() {
			for time.Now().Before(warm) {
				_ = call(w)
			}
		})
	}
	wg.Wait()
	cpu0 := selfCPU()
	pcpu0 := make([]time.Duration, len(procs))
	io0 := make([][2]int64, len(procs)+1)
	for i, p := range procs {
		pcpu0[i] = p.cpu()
		io0[i][0], io0[i][1] = procIO(p.cmd.Process.Pid)
	}
	io0[len(procs)][0], io0[len(procs)][1] = procIO(os.Getpid())
	hists := make([]*hdrhistogram.Histogram, c)
	var calls, errs atomic.Int64
	start := time.Now()
	end := start.Add(d)
	for w := range c {
		hists[w] = hdrhistogram.New(1, int64(time.Minute), 3)
		wg.Go(func() {
			for {
				t := time.Now()
				if t.After(end) {
					return
				}
				err := call(w)
				_ = hists[w].RecordValue(int64(time.Since(t)))
				calls.Add(1)
				if err != nil && errs.Add(1) == 1 {
					fmt.Fprintf(os.Stderr, "%s c=%d: first error: %v\n", s.name, c, err)
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	n := calls.Load()
	cpu := selfCPU() - cpu0
	per := map[string]float64{"client": float64(cpu.Microseconds()) / float64(max(n, 1))}
	reads, writes := map[string]float64{}, map[string]float64{}
	perCall := func(role string, pid int, at [2]int64) {
		r, w := procIO(pid)
		reads[role] += float64(r-at[0]) / float64(max(n, 1))
		writes[role] += float64(w-at[1]) / float64(max(n, 1))
	}
	perCall("client", os.Getpid(), io0[len(procs)])
	for i, p := range procs {
		d := p.cpu() - pcpu0[i]
		cpu += d
		per[p.role] += float64(d.Microseconds()) / float64(max(n, 1))
		perCall(p.role, p.cmd.Process.Pid, io0[i])
	}
	h := hdrhistogram.New(1, int64(time.Minute), 3)
	for _, x := range hists {
		h.Merge(x)
	}
	return Cell{
		Concurrency: c, Calls: n, Errors: errs.Load(), RPS: float64(n) / elapsed.Seconds(),
		P50us: float64(h.ValueAtQuantile(50)) / 1e3, P99us: float64(h.ValueAtQuantile(99)) / 1e3,
		CPUmsPer1k: float64(cpu.Milliseconds()) / float64(n) * 1000, ProcCPUus: per,
		ProcReads: reads, ProcWrites: writes,
	}, nil
}

func systems() []system {
	return []system{
		{"tcp", func(c int) (func(int) error, []*proc, func(), error) {
			addr := freeAddr()
			p, err := startRole("tcp-server", addr)
			if err != nil {
				return nil, nil, nil, err
			}
			if err := waitDial(addr); err != nil {
				p.stop()
				return nil, nil, nil, err
			}
			conns := make([]net.Conn, c)
			bufs := make([][]byte, c)
			for i := range conns {
				conns[i], err = net.Dial("tcp", addr)
				if err != nil {
					p.stop()
					return nil, nil, nil, err
				}
				bufs[i] = make([]byte, 4+len(payload))
			}
			frame := make([]byte, 4+len(payload))
			binary.BigEndian.PutUint32(frame, uint32(len(payload)))
			copy(frame[4:], payload)
			call := func(w int) error {
				if _, err := conns[w].Write(frame); err != nil {
					return err
				}
				_, err := io.ReadFull(conns[w], bufs[w])
				return err
			}
			return call, []*proc{p}, func() {
				for _, cn := range conns {
					cn.Close()
				}
				p.stop()
			}, nil
		}},
		{"nats", func(c int) (func(int) error, []*proc, func(), error) {
			addr := freeAddr()
			srv, err := startRole("nats-server", addr)
			if err != nil {
				return nil, nil, nil, err
			}
			if err := waitDial(addr); err != nil {
				srv.stop()
				return nil, nil, nil, err
			}
			resp, err := startRole("nats-responder", addr)
			if err != nil {
				srv.stop()
				return nil, nil, nil, err
			}
			nc, err := nats.Connect("nats://" + addr)
			if err != nil {
				resp.stop()
				srv.stop()
				return nil, nil, nil, err
			}
			// Wait for the responder's subscription.
			for range 200 {
				if _, err := nc.Request("echo", payload, 100*time.Millisecond); err == nil {
					break
				}
			}
			call := func(int) error { _, err := nc.Request("echo", payload, 5*time.Second); return err }
			return call, []*proc{srv, resp}, func() { nc.Close(); resp.stop(); srv.stop() }, nil
		}},
		{"grpc", func(c int) (func(int) error, []*proc, func(), error) {
			addr := freeAddr()
			p, err := startRole("grpc-server", addr)
			if err != nil {
				return nil, nil, nil, err
			}
			if err := waitDial(addr); err != nil {
				p.stop()
				return nil, nil, nil, err
			}
			cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
			if err != nil {
				p.stop()
				return nil, nil, nil, err
			}
			call := func(int) error {
				in, out := payload, []byte(nil)
				return cc.Invoke(context.Background(), "/echo.Echo/Echo", &in, &out)
			}
			return call, []*proc{p}, func() { cc.Close(); p.stop() }, nil
		}},
		{"agentmesh", func(c int) (func(int) error, []*proc, func(), error) {
			return meshRow(false)
		}},
		{"agentmesh-v1", func(c int) (func(int) error, []*proc, func(), error) {
			return meshRow(true) // the JSON frames (agentmesh.v1), client and agent
		}},
		{"agentmesh-jsonrpc", func(c int) (func(int) error, []*proc, func(), error) {
			return rawClientRow(c, dialJSONRPC)
		}},
		{"agentmesh-jsonrpc-wsconn", func(c int) (func(int) error, []*proc, func(), error) {
			return rawClientRow(c, dialJSONRPCConn) // the same calls through the link layer's writer
		}},
		{"agentmesh-native-gorilla", func(c int) (func(int) error, []*proc, func(), error) {
			return rawClientRow(c, dialNativeWS) // agentmesh-jsonrpc's writes, the native frames
		}},
	}
}

// rawClient is a client of the hub's /ws without the SDK: worker w's call
// is call(w).
type rawClient interface {
	call(int) error
	close()
}

// rawClientRow starts a hub and an echo agent and dials a client without
// the SDK: the plain JSON-RPC client over gorilla (one write per call,
// dialJSONRPC) or over the link layer's connection (dialJSONRPCConn), or
// the native frames written one call at a time (dialNativeWS).
func rawClientRow[C rawClient](c int, dial func(url string, c int) (C, error)) (func(int) error, []*proc, func(), error) {
	addr, procs, stop, err := startMesh("mesh-agent")
	if err != nil {
		return nil, nil, nil, err
	}
	cl, err := dial("ws://"+addr+"/ws", c)
	if err != nil {
		stop()
		return nil, nil, nil, err
	}
	for range 200 {
		if err := cl.call(0); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return cl.call, procs, func() { cl.close(); stop() }, nil
}

// meshRow starts a hub and an echo agent and dials the client as users
// get it (the full reliability chain); v1: client and agent speak the JSON
// frames.
func meshRow(v1 bool) (func(int) error, []*proc, func(), error) {
	role := "mesh-agent"
	if v1 {
		role = "mesh-agent-v1"
	}
	addr, procs, stop, err := startMesh(role)
	if err != nil {
		return nil, nil, nil, err
	}
	cl, err := mesh.NewClient([]string{"ws://" + addr + "/ws"}, mesh.WithWaitForReady(), mesh.WithConnConfig(link.Config{JSONFrames: v1}))
	if err != nil {
		stop()
		return nil, nil, nil, err
	}
	for range 200 {
		if err := cl.Call(context.Background(), "echo.echo", json.RawMessage(payload), nil); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	call := func(int) error {
		var out json.RawMessage
		return cl.Call(context.Background(), "echo.echo", json.RawMessage(payload), &out)
	}
	return call, procs, func() { cl.Close(); stop() }, nil
}

// startMesh starts a hub and an echo agent (agentRole), each in its own process.
func startMesh(agentRole string) (addr string, procs []*proc, stop func(), err error) {
	addr = freeAddr()
	hub, err := startRole("mesh-hub", addr)
	if err != nil {
		return "", nil, nil, err
	}
	if err := waitDial(addr); err != nil {
		hub.stop()
		return "", nil, nil, err
	}
	agent, err := startRole(agentRole, addr)
	if err != nil {
		hub.stop()
		return "", nil, nil, err
	}
	return addr, []*proc{hub, agent}, func() { agent.stop(); hub.stop() }, nil
}

// jsonRPCWS is a plain JSON-RPC 2.0 client over the hub's /ws, as a user
// without the SDK writes one: every caller multiplexed on one
// connection, worker w's call carrying id w (one call in flight each),
// one reader handing each answer to its caller by id.
type jsonRPCWS struct {
	ws  *websocket.Conn
	wmu sync.Mutex
	jsonCallers
}

// answers are the answer channels of a client's c workers, one call in
// flight each: worker w's outcome comes on ans[w].
type answers struct {
	ans  []chan error
	done chan struct{} // closed when the connection ends
}

func newAnswers(c int) answers {
	a := answers{done: make(chan struct{})}
	for range c {
		a.ans = append(a.ans, make(chan error, 1))
	}
	return a
}

// wait waits for worker w's answer.
func (a *answers) wait(w int) error {
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case err := <-a.ans[w]:
		return err
	case <-a.done:
		return fmt.Errorf("connection closed")
	case <-t.C:
		return fmt.Errorf("no answer in 5 s")
	}
}

// jsonCallers are a plain JSON-RPC client's callers: worker w's request
// (id w) and its answer.
type jsonCallers struct {
	reqs [][]byte
	answers
}

func newJSONCallers(c int) jsonCallers {
	cs := jsonCallers{answers: newAnswers(c)}
	for w := range c {
		cs.reqs = append(cs.reqs, []byte(`{"jsonrpc":"2.0","id":`+strconv.Itoa(w)+`,"method":"echo.echo","params":`+string(payload)+`}`))
	}
	return cs
}

// deliver hands an answer to its caller by id.
func (cs *jsonCallers) deliver(msg []byte) {
	var head struct {
		ID    int             `json:"id"`
		Error json.RawMessage `json:"error"`
	}
	head.ID = -1
	if json.Unmarshal(msg, &head) != nil || head.ID < 0 || head.ID >= len(cs.ans) {
		fmt.Fprintf(os.Stderr, "jsonrpc: unexpected answer %.200q\n", msg)
		return
	}
	if head.Error != nil {
		fmt.Fprintf(os.Stderr, "jsonrpc: error answer to id %d: %s\n", head.ID, head.Error)
		cs.ans[head.ID] <- fmt.Errorf("error answer: %s", head.Error)
		return
	}
	cs.ans[head.ID] <- nil
}

func dialJSONRPC(url string, c int) (*jsonRPCWS, error) {
	ws, _, err := websocket.DefaultDialer.Dial(url, nil)
	if err != nil {
		return nil, err
	}
	cl := &jsonRPCWS{ws: ws, jsonCallers: newJSONCallers(c)}
	go cl.read()
	return cl, nil
}

func (cl *jsonRPCWS) read() {
	defer close(cl.done)
	for {
		_, msg, err := cl.ws.ReadMessage()
		if err != nil {
			return
		}
		cl.deliver(msg)
	}
}

func (cl *jsonRPCWS) call(w int) error {
	cl.wmu.Lock()
	err := cl.ws.WriteMessage(websocket.TextMessage, cl.reqs[w])
	cl.wmu.Unlock()
	if err != nil {
		return err
	}
	return cl.wait(w)
}

func (cl *jsonRPCWS) close() { cl.ws.Close(); <-cl.done }

// jsonRPCConn is jsonRPCWS over the link layer's connection (wsconn), whose
// writer coalesces the callers' messages into few writes as mesh.Client's
// does: the same JSON-RPC calls, the transport held equal to the native row's.
type jsonRPCConn struct {
	c *wsconn.Conn
	jsonCallers
}

func dialJSONRPCConn(url string, c int) (*jsonRPCConn, error) {
	ws, _, err := websocket.DefaultDialer.Dial(url, nil)
	if err != nil {
		return nil, err
	}
	cl := &jsonRPCConn{c: wsconn.NewConn(ws, wsconn.Config{}), jsonCallers: newJSONCallers(c)}
	cl.c.Start(func(msg []byte, refused *envelope.Error) {
		if refused != nil {
			fmt.Fprintf(os.Stderr, "jsonrpc: refused answer: %v\n", refused)
			return
		}
		cl.deliver(msg)
	}, func(error) { close(cl.done) })
	return cl, nil
}

func (cl *jsonRPCConn) call(w int) error {
	b := wsconn.GetBuf()
	*b = append(*b, cl.reqs[w]...)
	if !cl.c.Send(b) {
		return fmt.Errorf("connection closed")
	}
	return cl.wait(w)
}

func (cl *jsonRPCConn) close() { cl.c.Close(); <-cl.done }

func compare(d time.Duration, cs []int, only string, rounds int) ([]Result, error) {
	var sys []system
	for _, s := range systems() {
		if only == "" || strings.Contains(","+only+",", ","+s.name+",") {
			sys = append(sys, s)
		}
	}
	// Rounds interleave the systems (round 1: every system, then round
	// 2, ...): the machine's drift reaches them alike; medians are kept.
	cells := make([][][]Cell, len(sys)) // [system][c][round]
	for i := range sys {
		cells[i] = make([][]Cell, len(cs))
	}
	for r := range rounds {
		for i, s := range sys {
			for k, c := range cs {
				fmt.Fprintf(os.Stderr, "round %d/%d: measuring %s at c=%d for %v...\n", r+1, rounds, s.name, c, d)
				cell, err := measure(s, c, d)
				if err != nil {
					return nil, fmt.Errorf("%s c=%d: %w", s.name, c, err)
				}
				cells[i][k] = append(cells[i][k], cell)
			}
		}
	}
	var out []Result
	for i, s := range sys {
		r := Result{System: s.name}
		for k := range cs {
			r.Cells = append(r.Cells, medianCell(cells[i][k]))
		}
		out = append(out, r)
	}
	return out, nil
}

// medianCell is the cell of medians (each figure's own) over rounds;
// calls and errors are summed.
func medianCell(rs []Cell) Cell {
	med := func(f func(Cell) float64) float64 {
		v := make([]float64, len(rs))
		for i, c := range rs {
			v[i] = f(c)
		}
		return median(v)
	}
	out := Cell{Concurrency: rs[0].Concurrency, ProcCPUus: map[string]float64{}, ProcReads: map[string]float64{}, ProcWrites: map[string]float64{}}
	for _, c := range rs {
		out.Calls += c.Calls
		out.Errors += c.Errors
	}
	out.RPS = med(func(c Cell) float64 { return c.RPS })
	out.P50us = med(func(c Cell) float64 { return c.P50us })
	out.P99us = med(func(c Cell) float64 { return c.P99us })
	out.CPUmsPer1k = med(func(c Cell) float64 { return c.CPUmsPer1k })
	for role := range rs[0].ProcCPUus {
		out.ProcCPUus[role] = med(func(c Cell) float64 { return c.ProcCPUus[role] })
		out.ProcReads[role] = med(func(c Cell) float64 { return c.ProcReads[role] })
		out.ProcWrites[role] = med(func(c Cell) float64 { return c.ProcWrites[role] })
	}
	return out
}

func printTable(w io.Writer, rs []Result, cs []int) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprint(tw, "system")
	for _, c := range cs {
		fmt.Fprintf(tw, "\tc=%d calls/s\tc=%d p50\tc=%d p99", c, c, c)
	}
	fmt.Fprint(tw, "\tCPU ms/1k calls (max c)\terrors\n")
	for _, r := range rs {
		fmt.Fprint(tw, r.System)
		var errs int64
		for _, cell := range r.Cells {
			fmt.Fprintf(tw, "\t%.0f\t%.0f µs\t%.0f µs", cell.RPS, cell.P50us, cell.P99us)
			errs += cell.Errors
		}
		last := r.Cells[len(r.Cells)-1]
		fmt.Fprintf(tw, "\t%.1f\t%d\n", last.CPUmsPer1k, errs)
	}
	_ = tw.Flush()
	fmt.Fprintf(w, "\nCPU µs per call by process at c=%d:\n", cs[len(cs)-1])
	for _, r := range rs {
		last := r.Cells[len(r.Cells)-1]
		fmt.Fprintf(w, "  %s: %.1f", r.System, last.CPUmsPer1k)
		sep := " ("
		for _, role := range slices.Sorted(maps.Keys(last.ProcCPUus)) {
			fmt.Fprintf(w, "%s%s %.1f", sep, role, last.ProcCPUus[role])
			sep = " · "
		}
		fmt.Fprintln(w, ")")
	}
	fmt.Fprintf(w, "\nread · write system calls per call by process at c=%d:\n", cs[len(cs)-1])
	for _, r := range rs {
		last := r.Cells[len(r.Cells)-1]
		fmt.Fprintf(w, "  %s:", r.System)
		sep := " "
		for _, role := range slices.Sorted(maps.Keys(last.ProcReads)) {
			fmt.Fprintf(w, "%s%s %.2f · %.2f", sep, role, last.ProcReads[role], last.ProcWrites[role])
			sep = "; "
		}
		fmt.Fprintln(w)
	}
	find := func(name string) *Result {
		for i := range rs {
			if rs[i].System == name {
				return &rs[i]
			}
		}
		return nil
	}
	am := find("agentmesh")
	if am == nil {
		return
	}
	fmt.Fprintln(w)
	for _, base := range []string{"nats", "tcp"} {
		b := find(base)
		if b == nil {
			continue
		}
		fmt.Fprintf(w, "agentmesh / %s:", base)
		for i, c := range cs {
			fmt.Fprintf(w, "  c=%d throughput %.2fx, p50 %.2fx, p99 %.2fx;", c,
				am.Cells[i].RPS/b.Cells[i].RPS, am.Cells[i].P50us/b.Cells[i].P50us, am.Cells[i].P99us/b.Cells[i].P99us)
		}
		fmt.Fprintf(w, "  CPU/call %.2fx\n", am.Cells[len(cs)-1].CPUmsPer1k/b.Cells[len(cs)-1].CPUmsPer1k)
	}
	if v1 := find("agentmesh-v1"); v1 != nil {
		a, b := am.Cells[len(cs)-1], v1.Cells[len(cs)-1]
		fmt.Fprintf(w, "agentmesh (v2 frames) / agentmesh-v1 (JSON frames) at c=%d: throughput %.2fx, CPU/call %.2fx, hub CPU/call %.2fx\n", cs[len(cs)-1],
			a.RPS/b.RPS, a.CPUmsPer1k/b.CPUmsPer1k, a.ProcCPUus["mesh-hub"]/b.ProcCPUus["mesh-hub"])
	}
	// The write pattern held equal: the JSON-RPC client over gorilla (one
	// write per call) against the native frames written the same way.
	if j, n := find("agentmesh-jsonrpc"), find("agentmesh-native-gorilla"); j != nil && n != nil {
		a, b := j.Cells[len(cs)-1], n.Cells[len(cs)-1]
		fmt.Fprintf(w, "agentmesh-jsonrpc / agentmesh-native-gorilla (one write per call, both) at c=%d: throughput %.2fx, CPU/call %.2fx, hub CPU/call %.2fx\n", cs[len(cs)-1],
			a.RPS/b.RPS, a.CPUmsPer1k/b.CPUmsPer1k, a.ProcCPUus["mesh-hub"]/b.ProcCPUus["mesh-hub"])
	}
	// Each row without the SDK against agentmesh, and what the servers can
	// do about it: a client's CPU is its own (one writing once per call
	// pays for each write, and for waking the hub that reads it). Beside
	// agentmesh's whole call, the client alone shows how far any hub could
	// bring the row; hub and agent are what the mesh spends on it.
	servers := func(c Cell) float64 { return c.ProcCPUus["mesh-hub"] + c.ProcCPUus["mesh-agent"] }
	for _, name := range []string{"agentmesh-jsonrpc", "agentmesh-jsonrpc-wsconn", "agentmesh-native-gorilla"} {
		if j := find(name); j != nil {
			a, b := j.Cells[len(cs)-1], am.Cells[len(cs)-1]
			fmt.Fprintf(w, "%s / agentmesh at c=%d: throughput %.2fx, CPU/call %.2fx, hub CPU/call %.2fx; its client alone %.1f µs per call = %.2fx agentmesh's whole call; hub + agent %.1f µs = %.2fx agentmesh's\n", name, cs[len(cs)-1],
				a.RPS/b.RPS, a.CPUmsPer1k/b.CPUmsPer1k, a.ProcCPUus["mesh-hub"]/b.ProcCPUus["mesh-hub"],
				a.ProcCPUus["client"], a.ProcCPUus["client"]/b.CPUmsPer1k, servers(a), servers(a)/servers(b))
		}
	}
}

// rss returns a process's resident memory.
func rss(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") {
			f := strings.Fields(l)
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// idleMemory attaches n idle agents to a hub process and reports the
// hub's resident memory per agent link.
func idleMemory(n int, settle time.Duration, heapProfile string) error {
	addr := freeAddr()
	hub, err := startRoleEnv("mesh-hub", addr, heapProfile != "", "BENCH_HEAP_PROFILE="+heapProfile)
	if err != nil {
		return err
	}
	defer hub.stop()
	if err := waitDial(addr); err != nil {
		return err
	}
	time.Sleep(500 * time.Millisecond)
	before := rss(hub.cmd.Process.Pid)
	heap0, stack0 := goMem(addr)
	cmd := exec.Command(os.Args[0], "-role", "idle-agents", "-addr", fmt.Sprintf("%s,%d", addr, n))
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.Stderr = os.Stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return err
	}
	defer func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() }()
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		return fmt.Errorf("agents did not come up: %w", err)
	}
	fmt.Printf("%d agents dialled and registered in %v\n", n, time.Since(start).Round(time.Millisecond))
	time.Sleep(settle) // let the hub settle (GC, heartbeats)
	after := rss(hub.cmd.Process.Pid)
	heap1, stack1 := goMem(addr)
	if heapProfile != "" {
		_ = hub.cmd.Process.Signal(syscall.SIGUSR1)
		time.Sleep(3 * time.Second) // a GC and the profile's write
		fmt.Println("hub heap profile:", heapProfile)
	}
	fmt.Printf("hub RSS %.1f MiB with no agents, %.1f MiB with %d idle agents after %v: %.1f KiB per idle agent link\n",
		float64(before)/(1<<20), float64(after)/(1<<20), n, settle, float64(after-before)/float64(n)/1024)
	if heap0 == 0 || heap1 == 0 {
		fmt.Println("the hub's /metrics could not be read: no heap and stack split")
		return nil
	}
	fmt.Printf("Go heap in use +%.1f KiB and goroutine stacks +%.1f KiB per idle agent link (from the hub's /metrics)\n",
		float64(heap1-heap0)/float64(n)/1024, float64(stack1-stack0)/float64(n)/1024)
	return nil
}

// heapOnSignal writes a heap profile to path (after a GC) on SIGUSR1;
// the returned func stops listening.
func heapOnSignal(path string) func() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-sig:
			case <-done:
				return
			}
			runtime.GC()
			if f, err := os.Create(path); err == nil {
				_ = pprof.WriteHeapProfile(f)
				_ = f.Close()
			}
			if f, err := os.Create(path + ".goroutines"); err == nil {
				_ = pprof.Lookup("goroutine").WriteTo(f, 1)
				_ = f.Close()
			}
		}
	}()
	return func() { signal.Stop(sig); close(done) }
}

// goMem scrapes the hub's heap and stack in use from /metrics.
func goMem(addr string) (heap, stack float64) {
	res, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, 0
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		v, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "go_memstats_heap_inuse_bytes":
			heap = v
		case "go_memstats_stack_inuse_bytes":
			stack = v
		}
	}
	return heap, stack
}
