package e2e_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/agentmesh/agentmesh/telemetry"
)

func repo(t *testing.T, rel string) string {
	t.Helper()
	return filepath.Join("..", rel)
}

func yamlDocs(t *testing.T, path string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []map[string]any
	for {
		var d map[string]any
		err := dec.Decode(&d)
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		docs = append(docs, d)
	}
}

// TestDeployFiles: the compose file, the Kubernetes manifests, the systemd
// unit and the Dockerfile parse, pin their images, probe endpoints that need
// no token, and every meshd command line in them passes `meshd --check`
// (with its environment, and its key, policy and certificate files replaced
// by real ones); every agent gets a token; Prometheus scrapes the hubs'
// admin ports; the dashboard asks only for metrics a hub really exports.
func TestDeployFiles(t *testing.T) {
	t.Parallel()
	compose := yamlDocs(t, repo(t, "deploy/compose/compose.yaml"))[0]
	services := compose["services"].(map[string]any)
	for _, want := range []string{"etcd", "hub-a", "hub-b", "hub-c", "agent-echo", "agent-kv", "jaeger", "prometheus", "grafana"} {
		if services[want] == nil {
			t.Errorf("compose has no service %s", want)
		}
	}
	for name, s := range services {
		img, _ := s.(map[string]any)["image"].(string)
		if img != "agentmesh:dev" && (img == "" || !strings.Contains(img, ":") || strings.HasSuffix(img, ":latest")) {
			t.Errorf("service %s: image %q is not pinned to a tag", name, img)
		}
	}
	hubEnv := services["hub-a"].(map[string]any)["environment"].(map[string]any)
	if hubEnv["OTEL_EXPORTER_OTLP_ENDPOINT"] != "http://jaeger:4318" || hubEnv["MESH_REGISTRY"] != "etcd" {
		t.Errorf("hub environment = %v", hubEnv)
	}

	kinds := map[string]bool{}
	for _, f := range k8sFiles(t) {
		for _, d := range yamlDocs(t, f) {
			kinds[d["kind"].(string)] = true
		}
	}
	for _, k := range []string{"Deployment", "Service", "PodDisruptionBudget", "Namespace", "Kustomization", "NetworkPolicy"} {
		if !kinds[k] {
			t.Errorf("Kubernetes manifests lack a %s", k)
		}
	}
	hub, _ := os.ReadFile(repo(t, "deploy/k8s/hub.yaml"))
	for _, want := range []string{"path: /readyz", "path: /livez", "status.podIP", "startupProbe", "fsGroup: 65532", "readOnlyRootFilesystem: true"} {
		if !bytes.Contains(hub, []byte(want)) {
			t.Errorf("hub.yaml lacks %q", want)
		}
	}
	// kustomize reads no file outside its directory: the policy ConfigMap
	// is made from a copy of deploy/mesh.yaml, which must not drift.
	a, _ := os.ReadFile(repo(t, "deploy/mesh.yaml"))
	if b, err := os.ReadFile(repo(t, "deploy/k8s/mesh.yaml")); err != nil || !bytes.Equal(a, b) {
		t.Errorf("deploy/k8s/mesh.yaml is not a copy of deploy/mesh.yaml (%v): copy it again", err)
	}
	yamlDocs(t, repo(t, "deploy/prometheus/prometheus.yml"))
	yamlDocs(t, repo(t, "deploy/grafana/provisioning/datasources/datasources.yaml"))
	unit, _ := os.ReadFile(repo(t, "deploy/systemd/meshd.service"))
	for _, want := range []string{"ExecStart=/usr/local/bin/meshd", "Type=notify", "WatchdogSec=", "NoNewPrivileges=yes", "LimitNOFILE=65536", "Restart=on-failure"} {
		if !bytes.Contains(unit, []byte(want)) {
			t.Errorf("meshd.service lacks %q", want)
		}
	}

	// Every meshd command line starts under meshd's security defaults, with
	// authentication on; every agent passes a token.
	k8sHubs, k8sAgents, probes := k8sCommands(t)
	composeHubs, composeAgents := composeCommands(t)
	hubs := slices.Concat(k8sHubs, composeHubs, systemdCommands(t), dockerfileCommands(t))
	if len(k8sHubs) == 0 || len(composeHubs) != 3 {
		t.Errorf("found %d meshd command lines in deploy/k8s and %d in deploy/compose; want some and 3", len(k8sHubs), len(composeHubs))
	}
	for _, c := range hubs {
		t.Run("check/"+c.where, func(t *testing.T) { c.check(t) })
	}
	agents := slices.Concat(k8sAgents, composeAgents)
	if len(k8sAgents) == 0 || len(composeAgents) != 2 {
		t.Errorf("found %d agents in deploy/k8s and %d in deploy/compose; want some and 2", len(k8sAgents), len(composeAgents))
	}
	for _, c := range agents {
		if c.env["MESH_TOKEN"] == "" && flagValue(c.argv, "--token") == "" {
			t.Errorf("%s: %s gets no token ($MESH_TOKEN or --token)", c.where, strings.Join(c.argv, " "))
		}
	}

	// The probes and the scraper reach endpoints that need no token: ask a
	// hub with a key, as the deployments run it.
	key := newKey(t, t.TempDir())
	h := startHub(t, "--auth-key", key, "--admin-addr", "127.0.0.1:0")
	var admin string
	waitFor(t, `meshd logging "admin listening"`, 5*time.Second, func() bool { admin = logAddr(h.stderr.String(), "admin listening"); return admin != "" })
	client := &http.Client{Timeout: 2 * time.Second}
	if code := httpStatus(client, h.base+"/metrics"); code != http.StatusUnauthorized {
		t.Errorf("/metrics on the gateway port without a token answered %d; want 401", code)
	}
	if code := httpStatus(client, "http://"+admin+"/metrics"); code != http.StatusOK {
		t.Errorf("/metrics on the admin port answered %d; want 200", code)
	}
	for _, p := range probes {
		base := h.base
		if p.admin {
			base = "http://" + admin
		}
		if code := httpStatus(client, base+p.path); code != http.StatusOK {
			t.Errorf("%s: the probe's %s answered %d without a token; want 200", p.where, p.path, code)
		}
	}
	checkPrometheus(t, composeHubs)

	// Every metric the dashboard queries is one the mesh exports.
	exported := map[string]bool{}
	for _, n := range append(telemetry.NewMetrics(nil).Names(), telemetry.GenAIMetricNames...) {
		exported[n] = true
	}
	raw, err := os.ReadFile(repo(t, "deploy/grafana/dashboards/agentmesh.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	// Metric names are followed by a selector, a range or a parenthesis;
	// label names (rpc_method...) come after "by (" and are skipped.
	name := regexp.MustCompile(`\b(agentmesh_[a-z_]+|rpc_[a-z_]+_seconds_[a-z]+|gen_ai_client_[a-z_]+_(?:bucket|count|sum))\b`)
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, n := range name.FindAllString(tg.Expr, -1) {
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_count"), "_sum")
				if !exported[base] {
					t.Errorf("panel %q queries %s, which the hub does not export", p.Title, n)
				}
			}
		}
	}
}

func readFile(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(repo(t, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// logAddr finds the addr of meshd's JSON log line with message msg.
func logAddr(log, msg string) string {
	sc := bufio.NewScanner(strings.NewReader(log))
	for sc.Scan() {
		var line struct{ Msg, Addr string }
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == msg {
			return line.Addr
		}
	}
	return ""
}

// deployFile is where a file a deployment hands to meshd comes from.
type deployFile struct {
	src    string // the repository file that is its content (a policy file)
	secret bool   // made when deploying (a key, a certificate): never in the repository
}

// deployCmd is one command line of a deployment file, as the container
// runtime or systemd would run it.
type deployCmd struct {
	where string
	argv  []string // the program, then its arguments
	env   map[string]string
	files map[string]deployFile // the files the deployment provides, by path
	dirs  map[string]deployFile // directories it mounts: any file below
}

func (c deployCmd) lookup(p string) (deployFile, bool) {
	if f, ok := c.files[p]; ok {
		return f, true
	}
	for d, f := range c.dirs {
		if strings.HasPrefix(p, strings.TrimSuffix(d, "/")+"/") {
			return f, true
		}
	}
	return deployFile{}, false
}

// meshd's flags and variables that name files, and what the files hold.
var (
	fileFlags = map[string]string{"--config": "config", "--auth-key": "key", "--tls-cert": "cert", "--tls-key": "certkey", "--client-ca": "cert", "--tls-ca": "cert"}
	fileEnv   = map[string]string{"MESH_CONFIG": "config", "MESH_AUTH_KEY": "key", "MESH_TLS_CERT": "cert", "MESH_TLS_KEY": "certkey", "MESH_CLIENT_CA": "cert", "MESH_TLS_CA": "cert"}
)

// check runs the command line with --check: the file paths it names are
// replaced by real files in a temporary directory (a copy of the policy
// file the deployment mounts, keys from meshctl token keygen, a
// self-signed certificate), and it must exit 0 with authentication on. It
// never listens, so 0.0.0.0 is never bound.
func (c deployCmd) check(t *testing.T) {
	if len(c.argv) == 0 || path.Base(c.argv[0]) != "meshd" {
		t.Fatalf("not a meshd command line: %q", c.argv)
	}
	dir := t.TempDir()
	made := map[string]string{}
	sub := func(p, kind string) string {
		if k := kind + " " + p; made[k] != "" {
			return made[k]
		}
		f, ok := c.lookup(p)
		if !ok {
			t.Errorf("%s file %s: no volume, secret or documented step of the deployment provides it", kind, p)
			return p
		}
		out := filepath.Join(dir, fmt.Sprintf("%d-%s", len(made), path.Base(p)))
		switch kind {
		case "config":
			if f.src == "" {
				t.Errorf("policy file %s does not come from the repository", p)
				return p
			}
			b, err := os.ReadFile(repo(t, f.src))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(out, b, 0o644); err != nil {
				t.Fatal(err)
			}
		case "key":
			if !f.secret {
				t.Errorf("key file %s comes from the repository (%s)", p, f.src)
				return p
			}
			out = newKey(t, dir)
		default:
			cert, key := selfSigned(t, dir)
			if out = cert; kind == "certkey" {
				out = key
			}
		}
		made[kind+" "+p] = out
		return out
	}
	subList := func(v, kind string) string {
		if kind != "key" {
			return sub(v, kind)
		}
		var out []string
		for _, spec := range strings.Split(v, ",") {
			if label, p, ok := strings.Cut(spec, "="); ok {
				out = append(out, label+"="+sub(p, kind))
			} else {
				out = append(out, sub(spec, kind))
			}
		}
		return strings.Join(out, ",")
	}
	var args []string
	for i := 1; i < len(c.argv); i++ {
		a := c.argv[i]
		name, val, eq := strings.Cut(a, "=")
		kind, ok := fileFlags[name]
		switch {
		case ok && eq:
			a = name + "=" + subList(val, kind)
		case ok && i+1 < len(c.argv):
			args = append(args, a)
			i++
			a = subList(c.argv[i], kind)
		}
		args = append(args, a)
	}
	var environ []string
	for k, v := range c.env {
		if kind, ok := fileEnv[k]; ok && v != "" {
			v = subList(v, kind)
		}
		environ = append(environ, k+"="+v)
	}
	if t.Failed() {
		return
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "meshd"), append(args, "--check")...)
	cmd.Env, cmd.Dir = env(environ...), dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	t.Logf("meshd %s --check (env %s): %s", strings.Join(args, " "), strings.Join(environ, " "), strings.TrimSpace(stdout.String()))
	if err != nil {
		t.Fatalf("%s: meshd --check: %v\n%s", c.where, err, stderr.String())
	}
	if !strings.Contains(stdout.String(), "auth true") {
		t.Errorf("%s: meshd runs without --auth-key: %s", c.where, stdout.String())
	}
}

// newKey makes a key file with meshctl token keygen, as the deployments
// tell their operator to.
func newKey(t *testing.T, dir string) string {
	t.Helper()
	f, err := os.CreateTemp(dir, "auth-*.key")
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	os.Remove(f.Name())
	if r := meshctl(t, "token", "keygen", "--out", f.Name()); r.code != 0 {
		t.Fatalf("%v", r)
	}
	return f.Name()
}

// selfSigned writes a certificate for localhost and its key (PEM).
func selfSigned(t *testing.T, dir string) (cert, key string) {
	t.Helper()
	cert, key = filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if _, err := os.Stat(cert); err == nil {
		return cert, key
	}
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IsCA:        true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// flagValue is the value of --name in argv ("--name v" or "--name=v").
func flagValue(argv []string, name string) string {
	for i, a := range argv {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
		if a == name && i+1 < len(argv) {
			return argv[i+1]
		}
	}
	return ""
}

func asMap(v any) map[string]any { m, _ := v.(map[string]any); return m }
func asList(v any) []any         { l, _ := v.([]any); return l }
func asString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case nil:
		return ""
	default:
		return fmt.Sprint(v)
	}
}

// k8sFiles are the kustomization and the manifests it lists.
func k8sFiles(t *testing.T) []string {
	kz := yamlDocs(t, repo(t, "deploy/k8s/kustomization.yaml"))[0]
	files := []string{repo(t, "deploy/k8s/kustomization.yaml")}
	for _, r := range asList(kz["resources"]) {
		files = append(files, repo(t, path.Join("deploy/k8s", asString(r))))
	}
	return files
}

// probe is an HTTP probe of a Kubernetes manifest.
type probe struct {
	where, path string
	admin       bool // on the admin port, not the gateway's
}

// k8sCommands reads the Deployments of the kustomization: their meshd and
// meshctl agent command lines (args after $(VAR) expansion, env, and the
// files their ConfigMap and Secret volumes provide) and their probes.
func k8sCommands(t *testing.T) (hubs, agents []deployCmd, probes []probe) {
	kz := yamlDocs(t, repo(t, "deploy/k8s/kustomization.yaml"))[0]
	generated := map[string]map[string]string{} // ConfigMap → key → repository file
	for _, g := range asList(kz["configMapGenerator"]) {
		files := map[string]string{}
		for _, f := range asList(asMap(g)["files"]) {
			key, src, ok := strings.Cut(asString(f), "=")
			if !ok {
				key, src = path.Base(key), key
			}
			files[key] = path.Join("deploy/k8s", src)
		}
		generated[asString(asMap(g)["name"])] = files
	}
	for _, f := range k8sFiles(t)[1:] {
		for _, d := range yamlDocs(t, f) {
			if d["kind"] != "Deployment" {
				continue
			}
			pod := asMap(asMap(asMap(d["spec"])["template"])["spec"])
			volumes := map[string]map[string]any{}
			for _, v := range asList(pod["volumes"]) {
				volumes[asString(asMap(v)["name"])] = asMap(v)
			}
			for _, ct := range asList(pod["containers"]) {
				ct := asMap(ct)
				c := deployCmd{
					where: fmt.Sprintf("%s:%s/%s", filepath.Base(f), asString(asMap(d["metadata"])["name"]), asString(ct["name"])),
					env:   map[string]string{}, files: map[string]deployFile{}, dirs: map[string]deployFile{},
				}
				for _, e := range asList(ct["env"]) {
					e := asMap(e)
					v := asString(e["value"])
					if from := asMap(e["valueFrom"]); from != nil {
						switch {
						case asMap(from["fieldRef"])["fieldPath"] == "status.podIP":
							v = "10.0.0.7"
						case from["secretKeyRef"] != nil:
							v = "from-a-secret"
						default:
							v = "from-the-pod"
						}
					}
					c.env[asString(e["name"])] = v
				}
				ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
				for _, a := range slices.Concat(asList(ct["command"]), asList(ct["args"])) {
					c.argv = append(c.argv, ref.ReplaceAllStringFunc(asString(a), func(m string) string {
						if v, ok := c.env[m[2:len(m)-1]]; ok {
							return v
						}
						return m
					}))
				}
				for _, m := range asList(ct["volumeMounts"]) {
					mp := asString(asMap(m)["mountPath"])
					v := volumes[asString(asMap(m)["name"])]
					if cm := asMap(v["configMap"]); cm != nil {
						for key, src := range generated[asString(cm["name"])] {
							c.files[path.Join(mp, key)] = deployFile{src: src}
						}
					}
					if s := asMap(v["secret"]); s != nil {
						if items := asList(s["items"]); items != nil {
							for _, it := range items {
								c.files[path.Join(mp, asString(asMap(it)["path"]))] = deployFile{secret: true}
							}
						} else {
							c.dirs[mp] = deployFile{secret: true}
						}
					}
				}
				ports := map[string]int{}
				for _, p := range asList(ct["ports"]) {
					ports[asString(asMap(p)["name"])], _ = strconv.Atoi(asString(asMap(p)["containerPort"]))
				}
				switch {
				case len(c.argv) > 0 && path.Base(c.argv[0]) == "meshd":
					hubs = append(hubs, c)
					_, listen, _ := net.SplitHostPort(flagValue(c.argv, "--listen"))
					_, admin, _ := net.SplitHostPort(flagValue(c.argv, "--admin-addr"))
					for _, kind := range []string{"startupProbe", "readinessProbe", "livenessProbe"} {
						get := asMap(asMap(ct[kind])["httpGet"])
						if get == nil {
							t.Errorf("%s: %s is not an HTTP GET", c.where, kind)
							continue
						}
						port := asString(get["port"])
						if n, ok := ports[port]; ok {
							port = strconv.Itoa(n)
						}
						if port != listen && port != admin {
							t.Errorf("%s: %s on port %s, neither --listen's (%s) nor --admin-addr's (%s)", c.where, kind, port, listen, admin)
						}
						probes = append(probes, probe{where: c.where + " " + kind, path: asString(get["path"]), admin: port == admin})
					}
				case len(c.argv) > 2 && path.Base(c.argv[0]) == "meshctl" && c.argv[1] == "agent":
					agents = append(agents, c)
				}
			}
		}
	}
	return hubs, agents, probes
}

// composeCommands reads the compose file's meshd and meshctl agent
// services. ${VAR} is what the file's header tells the operator to put in
// .env; a key in a named volume must be one the keygen set-up service
// writes there.
func composeCommands(t *testing.T) (hubs, agents []deployCmd) {
	text := readFile(t, "deploy/compose/compose.yaml")
	dotenv := map[string]string{}
	for _, m := range regexp.MustCompile(`echo "([A-Z_][A-Z0-9_]*)=\$\(docker compose [^"]*\)" > deploy/compose/\.env`).FindAllStringSubmatch(text, -1) {
		dotenv[m[1]] = "value-of-" + m[1]
	}
	interp := regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?[-?]([^}]*))?\}`)
	expand := func(s string) string {
		return interp.ReplaceAllStringFunc(s, func(m string) string {
			sm := interp.FindStringSubmatch(m)
			if v, ok := dotenv[sm[1]]; ok {
				return v
			}
			t.Errorf("compose.yaml uses ${%s}, which its header does not set in .env", sm[1])
			return ""
		})
	}
	services := asMap(yamlDocs(t, repo(t, "deploy/compose/compose.yaml"))[0]["services"])
	argvOf := func(s map[string]any) []string {
		var argv []string
		if cmd, ok := s["command"].(string); ok {
			return strings.Fields(expand(cmd))
		}
		for _, a := range asList(s["command"]) {
			argv = append(argv, expand(asString(a)))
		}
		return argv
	}
	type volPath struct{ volume, rel string }
	// where maps a path in service s to a named volume and the path in it.
	where := func(s map[string]any, p string) (volPath, bool) {
		for _, v := range asList(s["volumes"]) {
			src, target, _ := strings.Cut(asString(v), ":")
			target, _, _ = strings.Cut(target, ":")
			if !strings.HasPrefix(src, ".") && !strings.HasPrefix(src, "/") && strings.HasPrefix(p, target+"/") {
				return volPath{src, strings.TrimPrefix(p, target+"/")}, true
			}
		}
		return volPath{}, false
	}
	keys := map[volPath]bool{} // written by meshctl token keygen
	for name, s := range services {
		s := asMap(s)
		argv := argvOf(s)
		if len(argv) > 3 && argv[0] == "meshctl" && argv[1] == "token" && argv[2] == "keygen" {
			vp, ok := where(s, flagValue(argv, "--out"))
			if !ok {
				t.Errorf("compose service %s writes its key outside a named volume", name)
			}
			keys[vp] = true
		}
	}
	for name, s := range services {
		s := asMap(s)
		c := deployCmd{where: "compose.yaml:" + name, argv: argvOf(s), env: map[string]string{}, files: map[string]deployFile{}, dirs: map[string]deployFile{}}
		if len(c.argv) > 3 && c.argv[0] == "meshctl" && c.argv[1] == "token" && c.argv[2] == "issue" {
			if vp, ok := where(s, flagValue(c.argv, "--key")); !ok || !keys[vp] {
				t.Errorf("compose service %s issues tokens with a key no keygen service makes", name)
			}
		}
		switch env := s["environment"].(type) {
		case map[string]any:
			for k, v := range env {
				c.env[k] = expand(asString(v))
			}
		case []any:
			for _, kv := range env {
				k, v, _ := strings.Cut(asString(kv), "=")
				c.env[k] = expand(v)
			}
		}
		for _, v := range asList(s["volumes"]) {
			src, target, _ := strings.Cut(asString(v), ":")
			target, _, _ = strings.Cut(target, ":")
			if strings.HasPrefix(src, ".") || strings.HasPrefix(src, "/") {
				c.files[target] = deployFile{src: path.Join("deploy/compose", src)}
			}
		}
		for vp := range keys {
			for _, v := range asList(s["volumes"]) {
				src, target, _ := strings.Cut(asString(v), ":")
				target, _, _ = strings.Cut(target, ":")
				if src == vp.volume {
					c.files[path.Join(target, vp.rel)] = deployFile{secret: true}
				}
			}
		}
		for _, sec := range asList(s["secrets"]) {
			target := asString(sec)
			if m := asMap(sec); m != nil {
				if target = asString(m["target"]); target == "" {
					target = asString(m["source"])
				}
			}
			if !path.IsAbs(target) {
				target = "/run/secrets/" + target
			}
			c.files[target] = deployFile{secret: true}
		}
		switch {
		case len(c.argv) > 0 && path.Base(c.argv[0]) == "meshd":
			hubs = append(hubs, c)
			// The healthcheck calls mesh.ping on /rpc: it needs a token.
			if hc := asList(asMap(s["healthcheck"])["test"]); slices.Contains(hc, any("call")) && c.env["MESH_TOKEN"] == "" && !slices.Contains(hc, any("--token")) {
				t.Errorf("compose service %s: its healthcheck %v calls the hub without a token", name, hc)
			}
		case len(c.argv) > 2 && c.argv[0] == "meshctl" && c.argv[1] == "agent":
			agents = append(agents, c)
		}
	}
	slices.SortFunc(hubs, func(a, b deployCmd) int { return strings.Compare(a.where, b.where) })
	return hubs, agents
}

// systemdCommands reads the unit's ExecStart with the environment of its
// EnvironmentFile (the example the unit's header installs there) and the
// files its header installs or makes and LoadCredential hands it.
func systemdCommands(t *testing.T) []deployCmd {
	const credDir = "/run/credentials/meshd.service"
	c := deployCmd{where: "meshd.service", env: map[string]string{}, files: map[string]deployFile{}}
	var execStart, envFiles, creds []string
	install := regexp.MustCompile(`^#\s+install -m \d+ (\S+) (/\S+[^/])$`)
	keygen := regexp.MustCompile(`meshctl token keygen --out (/\S+)`)
	for _, line := range strings.Split(readFile(t, "deploy/systemd/meshd.service"), "\n") {
		if m := install.FindStringSubmatch(line); m != nil {
			c.files[m[2]] = deployFile{src: m[1]}
		}
		if m := keygen.FindStringSubmatch(line); m != nil && strings.HasPrefix(line, "#") {
			c.files[m[1]] = deployFile{secret: true}
		}
		k, v, ok := strings.Cut(strings.TrimSpace(line), "=")
		switch {
		case !ok || strings.HasPrefix(line, "#"):
		case k == "ExecStart":
			execStart = append(execStart, v)
		case k == "EnvironmentFile":
			envFiles = append(envFiles, v)
		case k == "LoadCredential":
			creds = append(creds, v)
		case k == "Environment":
			for _, kv := range strings.Fields(v) {
				k, v, _ := strings.Cut(strings.Trim(kv, `"`), "=")
				c.env[k] = v
			}
		}
	}
	for _, ef := range envFiles {
		p := strings.TrimPrefix(ef, "-")
		f, ok := c.files[p]
		if !ok || f.src == "" {
			t.Errorf("meshd.service: EnvironmentFile %s: its header installs no example there", p)
			continue
		}
		for _, line := range strings.Split(readFile(t, f.src), "\n") {
			line = strings.TrimSpace(line)
			if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
				c.env[k] = strings.Trim(v, `"'`)
			}
		}
	}
	for _, cr := range creds {
		id, p, _ := strings.Cut(cr, ":")
		f, ok := c.files[p]
		if !ok {
			t.Errorf("meshd.service: LoadCredential %s: its header makes no %s", cr, p)
		}
		c.files[credDir+"/"+id] = f
	}
	if len(execStart) != 1 {
		t.Fatalf("meshd.service has %d ExecStart lines; want 1", len(execStart))
	}
	vars := func(k string) string {
		if k == "CREDENTIALS_DIRECTORY" && len(creds) > 0 {
			return credDir
		}
		return c.env[k]
	}
	line := strings.TrimLeft(execStart[0], "-@+!:")
	line = strings.ReplaceAll(line, "%d", credDir)
	for _, a := range strings.Fields(line) {
		c.argv = append(c.argv, os.Expand(a, vars))
	}
	return []deployCmd{c}
}

// dockerfileCommands reads the image's default command and environment; a
// file under /run/secrets is one the operator mounts.
func dockerfileCommands(t *testing.T) []deployCmd {
	c := deployCmd{where: "Dockerfile", env: map[string]string{}, files: map[string]deployFile{}, dirs: map[string]deployFile{"/run/secrets": {secret: true}}}
	stage := 0
	for _, line := range strings.Split(readFile(t, "Dockerfile"), "\n") {
		instr, rest, _ := strings.Cut(strings.TrimSpace(line), " ")
		switch strings.ToUpper(instr) {
		case "FROM":
			stage++
			c.argv, c.env = nil, map[string]string{}
		case "ENV":
			for _, kv := range strings.Fields(rest) {
				k, v, _ := strings.Cut(kv, "=")
				c.env[k] = strings.Trim(v, `"`)
			}
		case "CMD", "ENTRYPOINT":
			var argv []string
			if err := json.Unmarshal([]byte(rest), &argv); err != nil {
				t.Fatalf("Dockerfile: %s %s: %v (want the exec form)", instr, rest, err)
			}
			if strings.ToUpper(instr) == "CMD" {
				c.argv = argv
			} else if len(argv) > 0 {
				t.Fatalf("Dockerfile: ENTRYPOINT %s: this test expects ENTRYPOINT []", rest)
			}
		}
	}
	if stage == 0 || c.argv == nil {
		t.Fatal("Dockerfile: no CMD")
	}
	delete(c.env, "PATH")
	return []deployCmd{c}
}

// checkPrometheus: Prometheus scrapes each compose hub on its admin port,
// where /metrics needs no token.
func checkPrometheus(t *testing.T, hubs []deployCmd) {
	adminPort := map[string]string{}
	for _, c := range hubs {
		addr := flagValue(c.argv, "--admin-addr")
		if addr == "" {
			addr = c.env["MESH_ADMIN_ADDR"]
		}
		_, port, err := net.SplitHostPort(addr)
		if err != nil {
			t.Errorf("%s: no --admin-addr for Prometheus (%v)", c.where, err)
		}
		host := strings.TrimPrefix(c.where, "compose.yaml:")
		adminPort[host] = port
	}
	var targets []string
	for _, sc := range asList(yamlDocs(t, repo(t, "deploy/prometheus/prometheus.yml"))[0]["scrape_configs"]) {
		for _, st := range asList(asMap(sc)["static_configs"]) {
			for _, tg := range asList(asMap(st)["targets"]) {
				targets = append(targets, asString(tg))
			}
		}
	}
	for host, port := range adminPort {
		if !slices.Contains(targets, net.JoinHostPort(host, port)) {
			t.Errorf("prometheus.yml does not scrape %s's admin port: targets %v", host, targets)
		}
	}
	for _, tg := range targets {
		host, port, _ := net.SplitHostPort(tg)
		if p, ok := adminPort[host]; ok && p != "" && p != port {
			t.Errorf("prometheus.yml scrapes %s, not %s's admin port %s", tg, host, p)
		}
	}
}
