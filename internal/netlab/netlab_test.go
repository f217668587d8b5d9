//go:build faultlab

package netlab_test

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/internal/netlab"
)

// TestHelperEchoServer is not a test: run in a lab node by TestLab (through
// NETLAB_ECHO_ADDR), it echoes lines on that address until killed.
func TestHelperEchoServer(t *testing.T) {
	addr := os.Getenv("NETLAB_ECHO_ADDR")
	if addr == "" {
		t.Skip("helper process of TestLab")
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println("listening")
	for {
		c, err := ln.Accept()
		if err != nil {
			os.Exit(1)
		}
		go func() {
			defer c.Close()
			sc := bufio.NewScanner(c)
			for sc.Scan() {
				fmt.Fprintln(c, sc.Text())
			}
		}()
	}
}

// echo sends line on c and waits up to d for it to come back.
func echo(c net.Conn, r *bufio.Reader, line string, d time.Duration) error {
	_ = c.SetDeadline(time.Now().Add(d))
	if _, err := fmt.Fprintln(c, line); err != nil {
		return err
	}
	got, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if strings.TrimSpace(got) != line {
		return fmt.Errorf("got %q back; want %q", got, line)
	}
	return nil
}

// TestLab checks the lab itself: a process in a node is reachable from the
// host; Drop silences an established connection without closing it and
// new connections time out; after Heal the same connection delivers what
// was held back; Loss drops packets without breaking TCP; and the
// namespaces are gone after the lab's test ends.
func TestLab(t *testing.T) {
	var prefix string
	t.Run("faults", func(t *testing.T) {
		lab := netlab.New(t)
		prefix = lab.Prefix
		host := lab.AddHost()
		a := lab.AddNode("a")
		addr := net.JoinHostPort(a.IP, "7001")
		cmd := a.Command(t.Context(), os.Args[0], "-test.run=^TestHelperEchoServer$")
		cmd.Env = append(os.Environ(), "NETLAB_ECHO_ADDR="+addr)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "listening\n" {
			t.Fatalf("echo server in node a: %q %v", line, err)
		}
		t.Logf("lab %s: subnet %s.0/24, host %s, node a %s (%s)", lab.Prefix, lab.Subnet, host.IP, a.IP, a.NS)

		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			t.Fatalf("host to node a: %v", err)
		}
		defer c.Close()
		r := bufio.NewReader(c)
		if err := echo(c, r, "hello", 2*time.Second); err != nil {
			t.Fatalf("echo through the bridge: %v", err)
		}

		if err := a.Drop(host); err != nil {
			t.Fatal(err)
		}
		if err := echo(c, r, "held", time.Second); err == nil {
			t.Fatal("an echo crossed the partition")
		} else if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
			t.Fatalf("during the partition the connection failed with %v; want it silent (a timeout), not closed", err)
		}
		if _, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			t.Fatal("a new connection crossed the partition")
		}
		dropped, err := a.Dropped()
		if err != nil || dropped == 0 {
			t.Fatalf("drop counters: %d, %v; want > 0", dropped, err)
		}
		if err := a.Heal(); err != nil {
			t.Fatal(err)
		}
		healed := time.Now()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		got, err := r.ReadString('\n')
		if err != nil || got != "held\n" {
			t.Fatalf("after heal the held line came back as %q, %v; want it delivered by TCP's retransmit", got, err)
		}
		t.Logf("partition: %d packets dropped; the held line arrived %v after heal", dropped, time.Since(healed).Round(time.Millisecond))

		if err := a.Loss(10); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		for i := range 50 {
			if err := echo(c, r, fmt.Sprint("lossy ", i), 10*time.Second); err != nil {
				t.Fatalf("echo %d under 10%% loss: %v", i, err)
			}
		}
		lossDropped, _ := a.Dropped()
		_ = a.Heal()
		t.Logf("10%% loss: 50 echoes in %v, %d packets dropped", time.Since(start).Round(time.Millisecond), lossDropped)
		if lossDropped == 0 {
			t.Error("Loss(10) dropped no packet")
		}
	})
	if prefix == "" {
		return // skipped
	}
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), prefix) {
		t.Errorf("namespaces of the lab left after its test:\n%s", out)
	}
	links, _ := exec.Command("ip", "-o", "link").CombinedOutput()
	if strings.Contains(string(links), strings.TrimSuffix(prefix, "-")) {
		t.Errorf("the lab's host veth left after its test:\n%s", links)
	}
}
