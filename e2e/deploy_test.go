package e2e_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

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

// TestDeployFiles: the compose file, the Kubernetes manifests and the
// Prometheus and Grafana files parse, pin their images, probe /readyz, and
// the dashboard asks only for metrics a hub really exports.
func TestDeployFiles(t *testing.T) {
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
	for _, f := range []string{"deploy/k8s/hub.yaml", "deploy/k8s/namespace.yaml", "deploy/k8s/kustomization.yaml"} {
		for _, d := range yamlDocs(t, repo(t, f)) {
			kinds[d["kind"].(string)] = true
		}
	}
	for _, k := range []string{"Deployment", "Service", "PodDisruptionBudget", "Namespace", "Kustomization"} {
		if !kinds[k] {
			t.Errorf("Kubernetes manifests lack a %s", k)
		}
	}
	hub, _ := os.ReadFile(repo(t, "deploy/k8s/hub.yaml"))
	for _, want := range []string{"path: /readyz", "path: /livez", "status.podIP", "startupProbe"} {
		if !bytes.Contains(hub, []byte(want)) {
			t.Errorf("hub.yaml lacks %q", want)
		}
	}
	yamlDocs(t, repo(t, "deploy/prometheus/prometheus.yml"))
	yamlDocs(t, repo(t, "deploy/grafana/provisioning/datasources/datasources.yaml"))
	unit, _ := os.ReadFile(repo(t, "deploy/systemd/meshd.service"))
	for _, want := range []string{"ExecStart=/usr/local/bin/meshd", "Type=notify", "WatchdogSec=", "NoNewPrivileges=yes", "LimitNOFILE=65536", "Restart=on-failure"} {
		if !bytes.Contains(unit, []byte(want)) {
			t.Errorf("meshd.service lacks %q", want)
		}
	}

	// Every metric the dashboard queries is one the mesh exports.
	exported := map[string]bool{}
	for _, n := range telemetry.NewMetrics(nil).Names() {
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
	name := regexp.MustCompile(`\b(agentmesh_[a-z_]+|rpc_[a-z_]+_seconds_[a-z]+)\b`)
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
