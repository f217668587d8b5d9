package archtest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/agentmesh/agentmesh"

// pkg is what `go list -json` says of one package.
type pkg struct {
	ImportPath string
	Imports    []string // direct
	Deps       []string // transitive
}

// rule: packages matching From may import (directly: Direct, or at any
// depth: !Direct) only project packages matching Allow, and no package
// matching Deny (project or not). A pattern "x/..." matches x and every
// package under it.
type rule struct {
	From   string
	Allow  []string // project packages allowed; nil: any
	Deny   []string // packages denied, project or third-party
	Direct bool
	Why    string
}

var rules = []rule{
	{From: "envelope", Allow: []string{}, Why: "the wire imports nothing of the project"},
	{From: "registry", Allow: []string{"envelope", "internal/..."}, Direct: true, Why: "the registry knows no sockets, hub or surface"},
	{From: "registry/memory", Allow: []string{"registry", "envelope", "internal/..."}, Direct: true, Why: "a backend imports the registry, nothing above it"},
	{From: "registry/etcd", Allow: []string{"registry", "envelope", "auth", "internal/..."}, Direct: true, Why: "a backend imports the registry (and auth's seal), nothing above it"},
	{From: "reliability", Allow: []string{"envelope", "internal/..."}, Direct: true, Why: "policies know no transport"},
	{From: "telemetry", Allow: []string{"envelope", "internal/..."}, Direct: true, Why: "telemetry is a leaf the others use"},
	{From: "auth", Allow: []string{"envelope", "internal/..."}, Direct: true, Why: "auth knows nothing of the hub"},
	{From: "contract/...", Allow: []string{"envelope"}, Direct: true, Why: "a contract is the JSON both sides speak: it holds no logic and imports nothing above the wire"},
	{From: "envelope/binframe", Allow: []string{"envelope"}, Direct: true, Why: "the binary frames are the wire's second encoding of the same frames"},
	{From: "internal/memnet", Allow: []string{}, Why: "a test network, usable by every package"},
	{From: "stream", Allow: []string{"envelope"}, Direct: true, Why: "the streams' flow-control contract sits just above the wire"},
	{From: "link/wsconn", Allow: []string{"envelope", "internal/..."}, Direct: true,
		Why: "the connection layer is one WebSocket with its queue and bounds: it knows no calls"},
	{From: "link", Allow: []string{"link/wsconn", "stream", "envelope", "envelope/binframe", "telemetry", "internal/..."}, Direct: true,
		Why: "the link is one framed WebSocket: it knows no principal, hub or surface"},
	{From: "hub/peering", Allow: []string{"link", "auth", "envelope", "internal/..."}, Direct: true,
		Why: "the peer pool knows links and the peer handshake; the hub hands it the rest (tracking, the registry's view)"},
	{From: "hub/guard", Allow: []string{"auth", "envelope", "internal/..."}, Direct: true,
		Why: "the hub's compiled security policy knows tokens and requests, not links or routing"},
	{From: "hub/listing", Allow: []string{"registry", "contract/control", "envelope"}, Direct: true,
		Why: "the listings know a registry snapshot and the control-plane contract, not the hub"},
	{From: "hub/sse", Allow: []string{"envelope", "stream"}, Direct: true,
		Why: "the SSE answer of /rpc knows a call and its stream, not the hub"},
	{From: "hub/...", Allow: []string{"hub/peering", "hub/guard", "hub/sse", "hub/listing", "hub/callwatch", "link", "stream", "registry", "registry/memory", "reliability", "telemetry", "auth", "envelope", "contract/...", "internal/..."}, Direct: true,
		Why: "the hub never imports a surface, the client or agents: the binary mounts the surfaces on it"},
	{From: "hub/...", Deny: []string{module + "/registry/etcd/...", "go.etcd.io/etcd/client/v3/...", "github.com/modelcontextprotocol/..."},
		Why: "the hub needs neither the etcd backend (the binary hands it one) nor the MCP SDK (a surface's)"},
	{From: "surface", Allow: []string{"envelope", "link", "stream", "auth", "registry", "telemetry", "contract/...", "internal/..."}, Direct: true,
		Why: "the surfaces' view of the hub is an interface: it imports nothing of the hub's implementation"},
	{From: "surface/agentick", Allow: surfaceAllow, Direct: true, Why: "a surface speaks one protocol over surface.Host: never the hub, another surface or agents"},
	{From: "surface/openai", Allow: surfaceAllow, Direct: true, Why: "a surface speaks one protocol over surface.Host: never the hub, another surface or agents"},
	{From: "surface/multica", Allow: surfaceAllow, Direct: true, Why: "a surface speaks one protocol over surface.Host: never the hub, another surface or agents"},
	{From: "surface/nexus3", Allow: surfaceAllow, Direct: true, Why: "a surface speaks one protocol over surface.Host: never the hub, another surface or agents"},
	{From: "surface/mcp", Allow: surfaceAllow, Direct: true, Why: "a surface speaks one protocol over surface.Host: never the hub, another surface or agents"},
	{From: "mesh", Allow: []string{"link", "stream", "envelope", "reliability", "telemetry", "contract/...", "internal/..."}, Direct: true,
		Why: "the client is what a caller imports: never the hub or a surface"},
	{From: "mesh", Deny: []string{module + "/hub/...", module + "/surface/...", module + "/registry/etcd/...", "go.etcd.io/etcd/client/v3/...", "github.com/modelcontextprotocol/..."},
		Why: "a caller compiles no hub, surface, etcd client or MCP SDK"},
	{From: "agents", Allow: []string{"link", "stream", "contract/control", "envelope", "registry", "telemetry", "internal/..."}, Direct: true,
		Why: "the agent SDK speaks the link and the control-plane contract: never the hub, a surface or the client"},
	{From: "agents", Deny: []string{module + "/hub/...", module + "/surface/...", module + "/mesh", "github.com/modelcontextprotocol/...", "github.com/golang-jwt/...", "github.com/google/jsonschema-go/...", "github.com/sony/gobreaker/...", "go.etcd.io/etcd/client/v3/..."},
		Why: "an agent compiles no hub, surface, MCP SDK, JWT, jsonschema, breaker or etcd client"},
	{From: "agents/...", Deny: []string{module + "/internal/cli/...", module + "/hub/...", module + "/surface/...", module + "/registry/etcd/...", "go.etcd.io/etcd/client/v3/..."},
		Why: "the agent SDK and the built-in agents never need the hub, a surface, the etcd backend or the CLI"},
	{From: "cmd/...", Allow: []string{"internal/cli"}, Direct: true, Why: "cmd/ is wiring only"},
}

// surfaceAllow is what a protocol surface may import of the project.
var surfaceAllow = []string{"surface", "envelope", "link", "stream", "auth", "registry", "telemetry", "contract/...", "internal/..."}

func match(pattern, path string) bool {
	if p, ok := strings.CutSuffix(pattern, "/..."); ok {
		return path == p || strings.HasPrefix(path, p+"/")
	}
	return path == pattern
}

// violations returns every import of pkgs that breaks one of rs.
func violations(pkgs []pkg, rs []rule) []string {
	var out []string
	for _, p := range pkgs {
		rel, ok := strings.CutPrefix(p.ImportPath, module+"/")
		if !ok {
			continue
		}
		for _, r := range rs {
			if !match(r.From, rel) {
				continue
			}
			imports := p.Deps
			if r.Direct {
				imports = p.Imports
			}
			for _, imp := range imports {
				for _, d := range r.Deny {
					if match(d, imp) {
						out = append(out, fmt.Sprintf("%s imports %s: %s", rel, imp, r.Why))
					}
				}
				irel, own := strings.CutPrefix(imp, module+"/")
				if !own || r.Allow == nil || irel == rel {
					continue
				}
				if !slices.ContainsFunc(r.Allow, func(a string) bool { return match(a, irel) }) {
					out = append(out, fmt.Sprintf("%s imports %s: %s", rel, irel, r.Why))
				}
			}
		}
	}
	return out
}

func load(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json=ImportPath,Imports,Deps", module+"/...")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(out)
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	return pkgs
}

// TestImportRules holds the rules on the project as it is.
func TestImportRules(t *testing.T) {
	pkgs := load(t)
	if len(pkgs) < 10 {
		t.Fatalf("go list found %d packages; the module is larger", len(pkgs))
	}
	for _, r := range rules {
		if !slices.ContainsFunc(pkgs, func(p pkg) bool { return match(r.From, strings.TrimPrefix(p.ImportPath, module+"/")) }) {
			t.Errorf("rule for %s matches no package: the layout changed, update the rule", r.From)
		}
	}
	for _, v := range violations(pkgs, rules) {
		t.Error(v)
	}
}

// TestRulesCatchViolations: each kind of rule reports a forbidden import
// (a test that could not fail would hold nothing).
func TestRulesCatchViolations(t *testing.T) {
	pkgs := []pkg{
		{ImportPath: module + "/envelope", Imports: []string{"strings", module + "/auth"}, Deps: []string{"strings", module + "/auth"}},
		{ImportPath: module + "/auth", Imports: []string{module + "/mesh"}, Deps: []string{module + "/mesh"}},
		{ImportPath: module + "/agents", Imports: []string{module + "/link"}, Deps: []string{module + "/link", "github.com/sony/gobreaker/v2"}},
		{ImportPath: module + "/cmd/meshd", Imports: []string{module + "/mesh"}},
		{ImportPath: module + "/registry/etcd", Imports: []string{module + "/registry", module + "/envelope", module + "/internal/cow"}},
		{ImportPath: module + "/hub", Imports: []string{module + "/link", module + "/surface/agentick"}},
		{ImportPath: module + "/surface/openai", Imports: []string{module + "/surface", module + "/hub"}},
		{ImportPath: module + "/surface/mcp", Imports: []string{module + "/surface", module + "/surface/nexus3"}},
		{ImportPath: module + "/mesh", Imports: []string{module + "/link"}, Deps: []string{module + "/link", module + "/hub"}},
		{ImportPath: module + "/link", Imports: []string{module + "/envelope", module + "/auth"}},
	}
	got := violations(pkgs, rules)
	want := []string{"envelope imports auth", "auth imports mesh", "agents imports github.com/sony/gobreaker/v2", "cmd/meshd imports mesh",
		"hub imports surface/agentick", "surface/openai imports hub", "surface/mcp imports surface/nexus3", "mesh imports " + module + "/hub", "link imports auth"}
	for _, w := range want {
		if !slices.ContainsFunc(got, func(v string) bool { return strings.HasPrefix(v, w+":") }) {
			t.Errorf("no violation %q reported; got %q", w, got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d violations; want %d (registry/etcd's imports are allowed): %q", len(got), len(want), got)
	}
}

// Size bounds: a package a reader can hold in mind, files a reader can
// find their way in (issue [M10]).
const (
	maxPackageLines = 3000
	maxFileLines    = 700
)

// TestSizes: no project package has more than maxPackageLines product
// lines (test files excluded), no product file more than maxFileLines.
func TestSizes(t *testing.T) {
	cmd := exec.Command("go", "list", "-json=ImportPath,Dir,GoFiles", module+"/...")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p struct {
			ImportPath, Dir string
			GoFiles         []string
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		total := 0
		for _, f := range p.GoFiles {
			n := lines(t, filepath.Join(p.Dir, f))
			if n > maxFileLines {
				t.Errorf("%s/%s: %d lines; at most %d", p.ImportPath, f, n, maxFileLines)
			}
			total += n
		}
		if total > maxPackageLines {
			t.Errorf("%s: %d product lines; at most %d", p.ImportPath, total, maxPackageLines)
		}
	}
}

func lines(t *testing.T, path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Count(b, []byte("\n"))
}
