// Streaming mode (-stream): chunks from a producer process to a consumer
// in the harness, as fast as the system delivers them.
//
//   - agentmesh: one mesh.Client over ws:// → hub process → echo agent
//     process serving echo.stream (credit-based flow control, a window of
//     -window chunks);
//   - nats: a publisher process publishing to a subject as fast as it can
//     (plain Publish, a Flush after every MiB) → nats-server process → a
//     subscription in the harness (no per-stream flow control: a
//     subscriber that falls behind drops messages).
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentmesh/agentmesh/mesh"
)

// StreamCell is one streaming measurement: one system at one chunk size.
type StreamCell struct {
	System string `json:"system"`
	Size   int    `json:"size"`
	// Chunks and Bytes were received in the measured window.
	Chunks      int64   `json:"chunks"`
	Bytes       int64   `json:"bytes"`
	ChunksPerS  float64 `json:"chunks_per_s"`
	MBPerS      float64 `json:"mb_per_s"` // 10^6 bytes of chunk data
	TTFCp50us   float64 `json:"ttfc_p50_us,omitempty"`
	TTFCp90us   float64 `json:"ttfc_p90_us,omitempty"`
	CPUusPerChk float64 `json:"cpu_us_per_chunk"`
	// ProcCPUus is each process's CPU per chunk in µs, by role (the
	// harness, the consumer, is "client").
	ProcCPUus map[string]float64 `json:"proc_cpu_us"`
	// NATS only: Published is what the publisher sent over the whole run
	// (warm-up included), Delivered what the subscription got, Drops the
	// difference once it drained; SubDropped is the subscription's own
	// count (nats.go's pending limits), SlowConsumer the async
	// slow-consumer errors, Disconnects the server closing the
	// subscriber's connection.
	Published    int64 `json:"published,omitempty"`
	Delivered    int64 `json:"delivered,omitempty"`
	Drops        int64 `json:"drops"`
	SubDropped   int64 `json:"sub_dropped,omitempty"`
	SlowConsumer int64 `json:"slow_consumer_errors,omitempty"`
	Disconnects  int64 `json:"disconnects,omitempty"`
}

type streamSystem struct {
	name    string
	measure func(size int, d time.Duration, window int) (StreamCell, error)
}

func streamSystems() []streamSystem {
	return []streamSystem{
		{"nats", natsStream},
		{"agentmesh", meshStream},
	}
}

// streamWarmup runs before each measured window.
const streamWarmup = 300 * time.Millisecond

// counters is what a consumer counts as chunks arrive.
type counters struct{ chunks, bytes atomic.Int64 }

// window measures the consumer's counters and the processes' CPU over d,
// after the warm-up.
func window(c *counters, procs []*proc, d time.Duration, cell *StreamCell) {
	time.Sleep(streamWarmup)
	cpu0 := selfCPU()
	pcpu0 := make([]time.Duration, len(procs))
	for i, p := range procs {
		pcpu0[i] = p.cpu()
	}
	n0, b0 := c.chunks.Load(), c.bytes.Load()
	start := time.Now()
	time.Sleep(d)
	n, b := c.chunks.Load()-n0, c.bytes.Load()-b0
	elapsed := time.Since(start)
	cpu := selfCPU() - cpu0
	per := map[string]float64{"client": float64(cpu.Microseconds()) / float64(max(n, 1))}
	for i, p := range procs {
		d := p.cpu() - pcpu0[i]
		cpu += d
		per[p.role] += float64(d.Microseconds()) / float64(max(n, 1))
	}
	cell.Chunks, cell.Bytes = n, b
	cell.ChunksPerS = float64(n) / elapsed.Seconds()
	cell.MBPerS = float64(b) / elapsed.Seconds() / 1e6
	cell.CPUusPerChk = float64(cpu.Microseconds()) / float64(max(n, 1))
	cell.ProcCPUus = per
}

func profileClient() (func(), error) {
	if profileDir == "" {
		return func() {}, nil
	}
	return startProfile(filepath.Join(profileDir, profileCell+"-client.pprof"))
}

// ---- agentmesh ----

func meshStream(size int, d time.Duration, win int) (StreamCell, error) {
	cell := StreamCell{System: "agentmesh", Size: size}
	profileCell = fmt.Sprintf("stream-agentmesh-s%d", size)
	addr, procs, stop, err := startMesh("mesh-agent")
	if err != nil {
		return cell, err
	}
	defer stop()
	cl, err := mesh.NewClient([]string{"ws://" + addr + "/ws"}, mesh.WithWaitForReady())
	if err != nil {
		return cell, err
	}
	defer cl.Close()
	ctx := context.Background()
	// Wait for the agent.
	for range 200 {
		if err := cl.Call(ctx, "echo.echo", map[string]any{"x": 1}, nil); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopProf, err := profileClient()
	if err != nil {
		return cell, err
	}
	defer stopProf()

	// Time to first chunk: 5 streams of one chunk to warm up, then 50
	// measured, from Stream to the first chunk in hand.
	one := map[string]any{"n": 1, "size": size}
	var ttfc []float64
	for i := range 55 {
		t := time.Now()
		s, err := cl.Stream(ctx, "echo.stream", one, mesh.Window(win))
		if err != nil {
			return cell, fmt.Errorf("ttfc stream: %w", err)
		}
		if _, err := s.Recv(); err != nil {
			s.Close()
			return cell, fmt.Errorf("ttfc stream: %w", err)
		}
		el := time.Since(t)
		if _, err := s.Recv(); err != io.EOF {
			s.Close()
			return cell, fmt.Errorf("ttfc stream: want its end, got %v", err)
		}
		s.Close()
		if i >= 5 {
			ttfc = append(ttfc, float64(el.Nanoseconds())/1e3)
		}
	}
	sort.Float64s(ttfc)
	cell.TTFCp50us = ttfc[len(ttfc)/2]
	cell.TTFCp90us = ttfc[len(ttfc)*9/10]

	// Throughput: streams of 10M chunks back to back, read by one
	// goroutine until the window is over.
	var c counters
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		params := map[string]any{"n": 10_000_000, "size": size}
		for rctx.Err() == nil {
			s, err := cl.Stream(rctx, "echo.stream", params, mesh.Window(win))
			if err != nil {
				done <- err
				return
			}
			for {
				chunk, err := s.Recv()
				if err != nil {
					s.Close()
					if err != io.EOF && rctx.Err() == nil {
						done <- err
						return
					}
					break
				}
				c.chunks.Add(1)
				c.bytes.Add(int64(len(chunk)))
			}
		}
		done <- nil
	}()
	window(&c, procs, d, &cell)
	cancel()
	if err := <-done; err != nil {
		return cell, fmt.Errorf("stream: %w", err)
	}
	return cell, nil
}

// ---- nats ----

const (
	natsChunks = "bench.chunks"
	natsStart  = "bench.start"
	natsStop   = "bench.stop"
)

// runNATSPublisher is the nats-publisher role: on a request to
// bench.start it publishes chunks of size bytes to bench.chunks as fast
// as it can (the echo agent's chunk, {"i":k,"pad":"xx..."}), with a Flush
// (a round trip to the server) after every MiB, until a request to
// bench.stop, which it answers with the count published.
func runNATSPublisher(ctx context.Context, addr string) error {
	host, sz, _ := strings.Cut(addr, ",")
	size, _ := strconv.Atoi(sz)
	nc, err := nats.Connect("nats://" + host)
	if err != nil {
		return err
	}
	defer nc.Close()
	var stop atomic.Bool
	var sent atomic.Int64
	finished := make(chan struct{})
	pad := strings.Repeat("x", max(size-24, 0))
	flushEvery := max(1, (1<<20)/max(size, 1))
	loop := func() {
		defer close(finished)
		buf := make([]byte, 0, len(pad)+48)
		for i := int64(1); !stop.Load(); i++ {
			buf = append(buf[:0], `{"i":`...)
			buf = strconv.AppendInt(buf, i, 10)
			buf = append(buf, `,"pad":"`...)
			buf = append(buf, pad...)
			buf = append(buf, `"}`...)
			if err := nc.Publish(natsChunks, buf); err != nil {
				fmt.Fprintln(os.Stderr, "nats-publisher:", err)
				return
			}
			sent.Add(1)
			if i%int64(flushEvery) == 0 {
				if err := nc.Flush(); err != nil {
					fmt.Fprintln(os.Stderr, "nats-publisher: flush:", err)
				}
			}
		}
		_ = nc.Flush()
	}
	var started atomic.Bool
	if _, err := nc.Subscribe(natsStart, func(m *nats.Msg) {
		if started.CompareAndSwap(false, true) {
			go loop()
		}
		_ = m.Respond(nil)
	}); err != nil {
		return err
	}
	if _, err := nc.Subscribe(natsStop, func(m *nats.Msg) {
		stop.Store(true)
		if started.Load() {
			<-finished
		}
		_ = m.Respond(binary.BigEndian.AppendUint64(nil, uint64(sent.Load())))
	}); err != nil {
		return err
	}
	_ = nc.Flush()
	<-ctx.Done()
	stop.Store(true)
	return nil
}

func natsStream(size int, d time.Duration, _ int) (StreamCell, error) {
	cell := StreamCell{System: "nats", Size: size}
	profileCell = fmt.Sprintf("stream-nats-s%d", size)
	addr := freeAddr()
	srv, err := startRole("nats-server", addr)
	if err != nil {
		return cell, err
	}
	defer srv.stop()
	if err := waitDial(addr); err != nil {
		return cell, err
	}
	pub, err := startRole("nats-publisher", addr+","+strconv.Itoa(size))
	if err != nil {
		return cell, err
	}
	defer pub.stop()
	var slow, disc atomic.Int64
	nc, err := nats.Connect("nats://"+addr,
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrSlowConsumer) {
				slow.Add(1)
			}
		}),
		nats.DisconnectErrHandler(func(*nats.Conn, error) { disc.Add(1) }))
	if err != nil {
		return cell, err
	}
	defer nc.Close()
	var c counters
	// The subscription with nats.go's default pending limits (512k
	// messages, 64 MiB): beyond them it drops.
	sub, err := nc.Subscribe(natsChunks, func(m *nats.Msg) {
		c.chunks.Add(1)
		c.bytes.Add(int64(len(m.Data)))
	})
	if err != nil {
		return cell, err
	}
	if err := nc.Flush(); err != nil {
		return cell, err
	}
	stopProf, err := profileClient()
	if err != nil {
		return cell, err
	}
	defer stopProf()
	// Start the publisher (it may still be connecting).
	var started bool
	for range 200 {
		if _, err := nc.Request(natsStart, nil, 100*time.Millisecond); err == nil {
			started = true
			break
		}
		time.Sleep(20 * time.Millisecond) // no responders yet
	}
	if !started {
		return cell, fmt.Errorf("the publisher did not answer")
	}
	window(&c, []*proc{srv, pub}, d, &cell)
	res, err := nc.Request(natsStop, nil, 10*time.Second)
	if err != nil || len(res.Data) != 8 {
		return cell, fmt.Errorf("stopping the publisher: %v", err)
	}
	cell.Published = int64(binary.BigEndian.Uint64(res.Data))
	// Let the subscription drain: what never arrives was dropped.
	last, still := c.chunks.Load(), time.Now()
	for c.chunks.Load() < cell.Published && time.Since(still) < time.Second {
		time.Sleep(20 * time.Millisecond)
		if n := c.chunks.Load(); n != last {
			last, still = n, time.Now()
		}
	}
	cell.Delivered = c.chunks.Load()
	cell.Drops = cell.Published - cell.Delivered
	if n, err := sub.Dropped(); err == nil {
		cell.SubDropped = int64(n)
	}
	cell.SlowConsumer, cell.Disconnects = slow.Load(), disc.Load()
	return cell, nil
}

// ---- the run ----

func compareStreams(d time.Duration, sizes []int, only string, rounds, win int) ([]StreamCell, error) {
	var sys []streamSystem
	for _, s := range streamSystems() {
		if only == "" || strings.Contains(","+only+",", ","+s.name+",") {
			sys = append(sys, s)
		}
	}
	if len(sys) == 0 {
		return nil, fmt.Errorf("-only names no streaming system (nats, agentmesh)")
	}
	cells := make([][][]StreamCell, len(sys)) // [system][size][round]
	for i := range sys {
		cells[i] = make([][]StreamCell, len(sizes))
	}
	for r := range rounds {
		for i, s := range sys {
			for k, size := range sizes {
				fmt.Fprintf(os.Stderr, "round %d/%d: streaming %s at %d B for %v...\n", r+1, rounds, s.name, size, d)
				cell, err := s.measure(size, d, win)
				if err != nil {
					return nil, fmt.Errorf("%s %d B: %w", s.name, size, err)
				}
				cells[i][k] = append(cells[i][k], cell)
			}
		}
	}
	var out []StreamCell
	for i := range sys {
		for k := range sizes {
			out = append(out, medianStreamCell(cells[i][k]))
		}
	}
	return out, nil
}

// medianStreamCell is the cell of medians (each figure's own) over
// rounds; counts are summed.
func medianStreamCell(rs []StreamCell) StreamCell {
	med := func(f func(StreamCell) float64) float64 {
		v := make([]float64, len(rs))
		for i, c := range rs {
			v[i] = f(c)
		}
		return median(v)
	}
	out := StreamCell{System: rs[0].System, Size: rs[0].Size, ProcCPUus: map[string]float64{}}
	for _, c := range rs {
		out.Chunks += c.Chunks
		out.Bytes += c.Bytes
		out.Published += c.Published
		out.Delivered += c.Delivered
		out.Drops += c.Drops
		out.SubDropped += c.SubDropped
		out.SlowConsumer += c.SlowConsumer
		out.Disconnects += c.Disconnects
	}
	out.ChunksPerS = med(func(c StreamCell) float64 { return c.ChunksPerS })
	out.MBPerS = med(func(c StreamCell) float64 { return c.MBPerS })
	out.TTFCp50us = med(func(c StreamCell) float64 { return c.TTFCp50us })
	out.TTFCp90us = med(func(c StreamCell) float64 { return c.TTFCp90us })
	out.CPUusPerChk = med(func(c StreamCell) float64 { return c.CPUusPerChk })
	for role := range rs[0].ProcCPUus {
		out.ProcCPUus[role] = med(func(c StreamCell) float64 { return c.ProcCPUus[role] })
	}
	return out
}

// streamRoles orders a system's processes: server, producer, consumer.
var streamRoles = map[string][]string{
	"agentmesh": {"mesh-hub", "mesh-agent", "client"},
	"nats":      {"nats-server", "nats-publisher", "client"},
}

func printStreamTable(w io.Writer, cells []StreamCell) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprint(tw, "system\tchunk\tchunks/s\tMB/s\tttfc p50\tCPU µs/chunk (server · producer · consumer)\tdrops\n")
	for _, c := range cells {
		ttfc, drops := "-", "-"
		if c.TTFCp50us > 0 {
			ttfc = fmt.Sprintf("%.0f µs", c.TTFCp50us)
		}
		if c.System == "nats" {
			drops = fmt.Sprintf("%d of %d", c.Drops, c.Published)
		}
		var parts []string
		for _, r := range streamRoles[c.System] {
			parts = append(parts, fmt.Sprintf("%s %.2f", r, c.ProcCPUus[r]))
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.1f\t%s\t%.2f (%s)\t%s\n", c.System, sizeName(c.Size), c.ChunksPerS, c.MBPerS,
			ttfc, c.CPUusPerChk, strings.Join(parts, " · "), drops)
	}
	_ = tw.Flush()
	for _, c := range cells {
		if c.System == "nats" && (c.SubDropped > 0 || c.SlowConsumer > 0 || c.Disconnects > 0) {
			fmt.Fprintf(w, "nats %s: the subscription dropped %d (slow-consumer errors %d, disconnects %d)\n",
				sizeName(c.Size), c.SubDropped, c.SlowConsumer, c.Disconnects)
		}
	}
	find := func(sys string, size int) *StreamCell {
		for i := range cells {
			if cells[i].System == sys && cells[i].Size == size {
				return &cells[i]
			}
		}
		return nil
	}
	first := true
	for _, a := range cells {
		if a.System != "agentmesh" {
			continue
		}
		b := find("nats", a.Size)
		if b == nil {
			continue
		}
		if first {
			fmt.Fprintln(w)
			first = false
		}
		fmt.Fprintf(w, "agentmesh / nats at %s: chunks/s %.2fx, MB/s %.2fx, CPU/chunk %.2fx (server %.2fx)\n", sizeName(a.Size),
			a.ChunksPerS/b.ChunksPerS, a.MBPerS/b.MBPerS, a.CPUusPerChk/b.CPUusPerChk, a.ProcCPUus["mesh-hub"]/b.ProcCPUus["nats-server"])
	}
}

func sizeName(n int) string {
	if n >= 1024 && n%1024 == 0 {
		return fmt.Sprintf("%d KiB", n/1024)
	}
	return fmt.Sprintf("%d B", n)
}
