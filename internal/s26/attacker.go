package s26

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"time"
)

// attackerEnv carries the Plan (JSON) to the attacker process.
const attackerEnv = "AGENTMESH_S26_ATTACKER"

// Plan is what the attacker process is told: where to aim, when.
type Plan struct {
	Target
	Schedule
	// Diag is the diagnostic command's own settings (s26diag: -only,
	// -noise, -burn), opaque here; the scenario sends none.
	Diag json.RawMessage `json:",omitempty"`
}

// Report is what the attacker process saw, in hostile and benign
// windows.
type Report struct {
	Hostile, Benign *Stats
	// Diag is the diagnostic command's own figures (s26diag: the attacker
	// process's CPU per window kind), opaque here.
	Diag json.RawMessage `json:",omitempty"`
}

// NewReport returns an empty Report.
func NewReport() *Report { return &Report{Hostile: NewStats(), Benign: NewStats()} }

// RunAttackers runs this program again as the attacker process, with
// args (a test binary: "-test.run=^$"), and returns what it reported.
// The program must call AttackerMain (or, for its own traffic,
// AttackerPlan and ExitWithReport) before anything else.
//
// The attackers run under SCHED_IDLE (chrt --idle, util-linux): on a
// 2-core machine they stand for clients on other machines, and their own
// CPU (generating ~1,000 messages/s, a third of them megabytes) must not
// be charged to the hub, nor run on the hub's Go scheduler and
// collector. Their traffic is the same; the kernel's loopback work of it
// still runs on the hub's cores. (nice 19, used before, still let them
// hold a core for a scheduler slice while a hub thread waited: the hub's
// threads were runnable but off CPU ~500 ms per second of attack.)
func RunAttackers(ctx context.Context, p Plan, args ...string) (*Report, error) {
	var rep Report
	if err := RunSelf(ctx, attackerEnv, p, p.End(), &rep, args...); err != nil {
		return nil, err
	}
	if rep.Hostile == nil || rep.Benign == nil {
		return nil, fmt.Errorf("its report has no stats")
	}
	return &rep, nil
}

// RunSelf runs this program again under SCHED_IDLE (chrt --idle, see
// RunAttackers) with args, cfg in the environment variable env as JSON,
// for at most until + 30 s, and decodes what it writes to stdout (one
// JSON value) into out: how a test's helper process (S26's attackers,
// S28's flood) is started and heard from.
func RunSelf(ctx context.Context, env string, cfg any, until time.Time, out any, args ...string) error {
	b, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cctx, cancel := context.WithDeadline(ctx, until.Add(30*time.Second))
	defer cancel()
	cmd := exec.CommandContext(cctx, "chrt", append([]string{"--idle", "0", self}, args...)...)
	cmd.Env = append(os.Environ(), env+"="+string(b))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%v (stderr: %.2000s)", err, stderr.String())
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		return fmt.Errorf("its report: %v (%.200q, stderr: %.2000s)", err, stdout.String(), stderr.String())
	}
	return nil
}

// AttackerPlan reports whether this process is an attacker process
// started by RunAttackers, and its plan. A plan that does not decode
// ends the process (exit status 2).
func AttackerPlan() (Plan, bool) {
	cfg := os.Getenv(attackerEnv)
	if cfg == "" {
		return Plan{}, false
	}
	var p Plan
	if err := json.Unmarshal([]byte(cfg), &p); err != nil {
		fmt.Fprintln(os.Stderr, "attacker:", err)
		os.Exit(2)
	}
	return p, true
}

// ExitWithReport writes rep for RunAttackers and ends the process.
func ExitWithReport(rep *Report) {
	if err := json.NewEncoder(os.Stdout).Encode(rep); err != nil {
		fmt.Fprintln(os.Stderr, "attacker:", err)
		os.Exit(2)
	}
	os.Exit(0)
}

// AttackerMain, in an attacker process, runs the scenario's attack
// (Attack with the Corpus in hostile windows, with Benign in benign
// ones), reports what it saw and exits; in any other process it
// returns at once.
func AttackerMain() {
	p, ok := AttackerPlan()
	if !ok {
		return
	}
	rep := NewReport()
	corpus, benign := Corpus(), Benign()
	_ = p.RunWindows(context.Background(), func(ctx context.Context, _ int, hostile bool) {
		if hostile {
			Attack(ctx, p.Target, corpus, rep.Hostile)
		} else {
			Attack(ctx, p.Target, benign, rep.Benign)
		}
	})
	ExitWithReport(rep)
}
