// Package netlab is the tier-B network lab of RELIABILITY.md §1.2: each
// "host" of a scenario (a hub, etcd, a group of agents) is a Linux network
// namespace with one veth on a bridge, so that faults are injected by the
// kernel (nftables drop and random loss, link down) and not by a proxy in
// the path. It needs root, iproute2 and nftables; New skips the test with
// a clear message when any of them is missing (the lab tests run behind
// the faultlab build tag, and .ci/run installs nftables).
//
// Layout: the bridge lives in a namespace of its own, so the lab never
// touches the host's network except for one veth (AddHost) that lets the
// test process itself reach the lab's addresses. Every name carries a
// random prefix, and t.Cleanup deletes the namespaces, which takes the
// veths and the nft tables with them, even when the test failed.
//
// In each node's namespace, New loads an nft table "netlab" with input and
// output chains whose rules are the faults (Node.Drop, Node.Loss, ...;
// Node.Heal flushes them), and a conntrack rule ("ct state established")
// from the start: a `ct state` rule only recognises flows opened after
// conntrack was switched on in that namespace (RELIABILITY.md §1.2).
package netlab

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math/big"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// Lab is one network: a bridge and the nodes on it.
type Lab struct {
	tb     testing.TB
	Prefix string // unique prefix of every namespace name
	Subnet string // "10.77.N" (a /24)
	bridge string // the bridge's namespace

	mu    sync.Mutex
	nodes []*Node
	hostV string // the host's veth, if AddHost was called
}

// Node is one namespace on the lab's bridge.
type Node struct {
	lab  *Lab
	Name string // as given to AddNode
	NS   string // the namespace ("" for the host)
	IP   string // its address on the bridge
	If   string // its interface's name in its namespace
}

// run runs a command and returns its combined output with the error.
func run(ctx context.Context, stdin string, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// must runs a command, failing the test if it fails.
func (l *Lab) must(name string, args ...string) string {
	l.tb.Helper()
	out, err := run(context.Background(), "", name, args...)
	if err != nil {
		l.tb.Fatal(err)
	}
	return out
}

// Available says why a lab cannot be built here ("" when it can): not
// root, or ip or nft missing.
func Available() string {
	if os.Geteuid() != 0 {
		return "the network lab needs root (network namespaces, nftables)"
	}
	for _, bin := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(bin); err != nil {
			return bin + " is not installed (apt-get install -y iproute2 nftables; .ci/run installs nftables)"
		}
	}
	return ""
}

// New builds an empty lab (the bridge) and registers its removal. It skips
// the test when the lab cannot be built here: not root, no ip or nft, or
// `ip netns add` fails (no permission to create namespaces).
func New(tb testing.TB) *Lab {
	tb.Helper()
	if why := Available(); why != "" {
		if os.Getenv("CI") != "" && os.Geteuid() == 0 {
			tb.Fatal("netlab: " + why) // .ci/run installs nftables: not a reason to skip there
		}
		tb.Skip("netlab: " + why)
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	l := &Lab{tb: tb, Prefix: "nl" + hex.EncodeToString(b[:2]) + "-"}
	l.Subnet = l.freeSubnet()
	l.bridge = l.Prefix + "br"
	if out, err := run(context.Background(), "", "ip", "netns", "add", l.bridge); err != nil {
		tb.Skipf("netlab: ip netns add fails here, so no lab: %v %s", err, out)
	}
	tb.Cleanup(l.destroy)
	l.must("ip", "-n", l.bridge, "link", "add", "br0", "type", "bridge")
	l.must("ip", "-n", l.bridge, "link", "set", "br0", "up")
	l.must("ip", "-n", l.bridge, "link", "set", "lo", "up")
	return l
}

// freeSubnet picks a 10.77.N.0/24 that no address of the host is in.
func (l *Lab) freeSubnet() string {
	addrs := l.must("ip", "-4", "-o", "addr")
	for range 100 {
		n, _ := rand.Int(rand.Reader, big.NewInt(250))
		s := fmt.Sprintf("10.77.%d", n.Int64()+2)
		if !strings.Contains(addrs, s+".") {
			return s
		}
	}
	l.tb.Fatal("netlab: no free 10.77.N.0/24")
	return ""
}

// destroy deletes every namespace of the lab (and with them their veths
// and nft tables) and the host's veth.
func (l *Lab) destroy() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, n := range l.nodes {
		if n.NS != "" {
			if _, err := run(context.Background(), "", "ip", "netns", "del", n.NS); err != nil {
				l.tb.Logf("netlab cleanup: %v", err)
			}
		}
	}
	if l.hostV != "" {
		_, _ = run(context.Background(), "", "ip", "link", "del", l.hostV) // usually gone with its peer
	}
	if _, err := run(context.Background(), "", "ip", "netns", "del", l.bridge); err != nil {
		l.tb.Logf("netlab cleanup: %v", err)
	}
}

// baseRules is the nft table loaded in every node: empty fault chains and
// the conntrack switch (a ct rule with no verdict).
const baseRules = `table inet netlab {
	chain input { type filter hook input priority 0; policy accept; }
	chain output { type filter hook output priority 0; policy accept; }
	chain conntrack { type filter hook prerouting priority -150; policy accept; ct state established counter; }
}
`

// AddNode adds a namespace with one veth on the bridge, its address the
// next of the subnet, lo up and the nft base table loaded.
func (l *Lab) AddNode(name string) *Node {
	l.tb.Helper()
	l.mu.Lock()
	idx := len(l.nodes)
	n := &Node{lab: l, Name: name, NS: l.Prefix + name, IP: fmt.Sprintf("%s.%d", l.Subnet, idx+10), If: "eth0"}
	l.mu.Unlock()
	l.must("ip", "netns", "add", n.NS)
	l.mu.Lock()
	l.nodes = append(l.nodes, n)
	l.mu.Unlock()
	port := fmt.Sprintf("p%d", idx)
	l.must("ip", "link", "add", "eth0", "netns", n.NS, "type", "veth", "peer", "name", port, "netns", l.bridge)
	l.must("ip", "-n", l.bridge, "link", "set", port, "master", "br0", "up")
	l.must("ip", "-n", n.NS, "addr", "add", n.IP+"/24", "dev", "eth0")
	l.must("ip", "-n", n.NS, "link", "set", "eth0", "up")
	l.must("ip", "-n", n.NS, "link", "set", "lo", "up")
	if err := n.NFT(baseRules); err != nil {
		l.tb.Fatal(err)
	}
	return n
}

// AddHost connects the test process's own namespace to the bridge (one
// veth, address SUBNET.1), so that it can reach the nodes. The host node
// takes no faults: put them on the nodes.
func (l *Lab) AddHost() *Node {
	l.tb.Helper()
	v := strings.TrimSuffix(l.Prefix, "-") + "h"
	l.must("ip", "link", "add", v, "type", "veth", "peer", "name", "ph", "netns", l.bridge)
	l.mu.Lock()
	l.hostV = v
	l.mu.Unlock()
	l.must("ip", "-n", l.bridge, "link", "set", "ph", "master", "br0", "up")
	ip := l.Subnet + ".1"
	l.must("ip", "addr", "add", ip+"/24", "dev", v)
	l.must("ip", "link", "set", v, "up")
	return &Node{lab: l, Name: "host", IP: ip, If: v}
}

// Command is cmd to run name with args in the node's namespace (through
// `ip netns exec`, which execs the program: the process's pid is the
// program's own, so signals reach it directly).
func (n *Node) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	if n.NS == "" {
		return exec.CommandContext(ctx, name, args...)
	}
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.NS, name}, args...)...)
}

// NFT loads an nft script in the node's namespace.
func (n *Node) NFT(script string) error {
	if n.NS == "" {
		return fmt.Errorf("netlab: no faults on the host node")
	}
	_, err := run(context.Background(), script, "ip", "netns", "exec", n.NS, "nft", "-f", "-")
	return err
}

// Rules adds rules to the node's fault chains: in to input, out to output
// (either may be empty), e.g. Rules("ip saddr 10.77.3.10 drop", "ip daddr
// 10.77.3.10 drop").
func (n *Node) Rules(in, out string) error {
	var b strings.Builder
	if in != "" {
		fmt.Fprintf(&b, "add rule inet netlab input %s\n", in)
	}
	if out != "" {
		fmt.Fprintf(&b, "add rule inet netlab output %s\n", out)
	}
	return n.NFT(b.String())
}

// Drop drops every packet between the node and the peers, both directions,
// without closing anything: established TCP connections stay open and
// silent, new ones time out (a partition).
func (n *Node) Drop(peers ...*Node) error {
	ips := make([]string, len(peers))
	for i, p := range peers {
		ips[i] = p.IP
	}
	set := "{ " + strings.Join(ips, ", ") + " }"
	return n.Rules("ip saddr "+set+" counter drop", "ip daddr "+set+" counter drop")
}

// Loss drops pct % of the packets on the node's interface, at random
// (nft numgen), in both directions.
func (n *Node) Loss(pct int) error {
	return n.Rules(
		fmt.Sprintf("iifname %q numgen random mod 100 < %d counter drop", n.If, pct),
		fmt.Sprintf("oifname %q numgen random mod 100 < %d counter drop", n.If, pct))
}

// Heal removes every fault rule of the node.
func (n *Node) Heal() error {
	return n.NFT("flush chain inet netlab input\nflush chain inet netlab output\n")
}

// Dropped is the sum of the packet counters of the node's fault rules:
// how many packets the faults dropped so far.
func (n *Node) Dropped() (int64, error) {
	out, err := run(context.Background(), "", "ip", "netns", "exec", n.NS, "nft", "list", "table", "inet", "netlab")
	if err != nil {
		return 0, err
	}
	var sum int64
	for line := range strings.SplitSeq(out, "\n") {
		if !strings.Contains(line, " drop") {
			continue
		}
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "packets" {
				var v int64
				if _, err := fmt.Sscan(f[i+1], &v); err == nil {
					sum += v
				}
			}
		}
	}
	return sum, nil
}
