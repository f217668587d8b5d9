package archtest

import (
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
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
	{From: "registry/etcd", Allow: []string{"registry", "envelope", "internal/..."}, Direct: true, Why: "a backend imports the registry, nothing above it"},
	{From: "reliability", Allow: []string{"envelope", "internal/..."}, Direct: true, Why: "policies know no transport"},
	{From: "telemetry", Allow: []string{"envelope", "internal/..."}, Direct: true, Why: "telemetry is a leaf the others use"},
	{From: "auth", Allow: []string{"envelope", "internal/..."}, Direct: true, Why: "auth knows nothing of the hub"},
	{From: "internal/memnet", Allow: []string{}, Why: "a test network, usable by every package"},
	{From: "mesh/...", Deny: []string{module + "/internal/cli/...", module + "/registry/etcd/...", "go.etcd.io/etcd/client/v3/..."},
		Why: "the hub and client never need the etcd backend or the CLI: the binary wires them"},
	{From: "agents/...", Deny: []string{module + "/internal/cli/...", module + "/registry/etcd/...", "go.etcd.io/etcd/client/v3/..."},
		Why: "the agent SDK never needs the etcd backend or the CLI"},
	{From: "cmd/...", Allow: []string{"internal/cli"}, Direct: true, Why: "cmd/ is wiring only"},
	// The surfaces moved out of the hub (M10): each reaches the hub through
	// surface.Host only, and knows no other surface.
	{From: "surface/mcp", Allow: surfaceAllow, Why: surfaceWhy},
	{From: "surface/openai", Allow: surfaceAllow, Why: surfaceWhy},
	{From: "surface/multica", Allow: surfaceAllow, Why: surfaceWhy},
}

// What a protocol surface may import of the project, at any depth.
var surfaceAllow = []string{"surface", "envelope", "link", "auth", "contract/...", "telemetry", "registry", "internal/..."}

const surfaceWhy = "a surface reaches the hub through surface.Host only, never the hub, another surface or an agent"

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
		{ImportPath: module + "/agents", Deps: []string{"go.etcd.io/etcd/client/v3"}},
		{ImportPath: module + "/cmd/meshd", Imports: []string{module + "/mesh"}},
		{ImportPath: module + "/registry/etcd", Imports: []string{module + "/registry", module + "/envelope", module + "/internal/cow"}},
		{ImportPath: module + "/surface/openai", Deps: []string{module + "/surface", module + "/envelope", module + "/hub"}},
	}
	got := violations(pkgs, rules)
	for _, want := range []string{"envelope imports auth", "auth imports mesh", "agents imports go.etcd.io/etcd/client/v3", "cmd/meshd imports mesh", "surface/openai imports hub"} {
		if !slices.ContainsFunc(got, func(v string) bool { return strings.HasPrefix(v, want+":") }) {
			t.Errorf("no violation %q reported; got %q", want, got)
		}
	}
	if len(got) != 5 {
		t.Errorf("%d violations; want 5 (registry/etcd's imports are allowed): %q", len(got), got)
	}
}
