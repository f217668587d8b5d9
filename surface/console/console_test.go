package console_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/agentmesh/agentmesh/agents"
	"github.com/agentmesh/agentmesh/auth"
	"github.com/agentmesh/agentmesh/envelope"
	"github.com/agentmesh/agentmesh/hub"
	"github.com/agentmesh/agentmesh/internal/testkit"
	"github.com/agentmesh/agentmesh/mesh"
	"github.com/agentmesh/agentmesh/mesh/meshtest"
	"github.com/agentmesh/agentmesh/surface/console"
	"github.com/agentmesh/agentmesh/telemetry"
)

func start(t *testing.T, sec *hub.Security) *meshtest.Mesh {
	t.Helper()
	m := meshtest.StartMounted(t, hub.Config{HeartbeatInterval: time.Second, Security: sec},
		func(h *hub.Hub) { console.Mount(h, console.Config{Tick: 100 * time.Millisecond, SlowAfter: time.Hour}) },
		hub.WithTelemetry(telemetry.New(nil, telemetry.NewMetrics(nil))))
	return m
}

// events reads the stream's events into a channel until ctx ends.
func events(t *testing.T, ctx context.Context, url, token string) (<-chan [2]string, int) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if res.StatusCode != http.StatusOK {
		res.Body.Close()
		return nil, res.StatusCode
	}
	ch := make(chan [2]string, 64)
	go func() {
		defer res.Body.Close()
		defer close(ch)
		sc := bufio.NewScanner(res.Body)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		var event string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				event = line[7:]
			case strings.HasPrefix(line, "data: "):
				select {
				case ch <- [2]string{event, line[6:]}:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return ch, http.StatusOK
}

type methodView struct {
	Name     string
	Ready    int
	Total    int
	Rate     float64
	ErrorPct float64
	P99Ms    float64
	Breaker  string
}

type viewT struct {
	Cluster struct {
		Hub, Registry  string
		RegistrySynced bool
	}
	Agents  []struct{ ID, Name, State string }
	Methods []methodView
}

// TestConsoleLive: the console's stream pushes the agents and methods the
// registry holds, the rate and error ratio of a method under calls from
// the hub's own histogram, and each failed call; the call form's endpoint
// calls through the hub with a trace id; nothing is left running when the
// page goes.
func TestConsoleLive(t *testing.T) {
	m := start(t, nil)
	m.RunAgent(t, agents.NewEcho(agents.WithID("echo-1")))
	m.RunAgent(t, agents.NewChaos(agents.ChaosConfig{FailRate: 1}, agents.WithID("chaos-1")))
	c := m.Client(t, mesh.WithoutReliability())
	meshtest.WaitFor(t, 5*time.Second, func() bool {
		return c.Call(t.Context(), "echo.echo", map[string]int{"a": 1}, nil) == nil &&
			envelope.CodeOf(c.Call(t.Context(), "chaos.echo", nil, nil)) == envelope.CodeUnavailable
	})
	base := runtime.NumGoroutine()

	ctx, cancel := context.WithCancel(t.Context())
	evs, status := events(t, ctx, "http://"+m.Addr+"/ui/api/stream", "")
	if status != http.StatusOK {
		t.Fatalf("stream: %d", status)
	}
	if e := <-evs; e[0] != "hello" {
		t.Fatalf("first event %v; want hello", e)
	}
	stopLoad := make(chan struct{})
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		for {
			select {
			case <-stopLoad:
				return
			default:
			}
			_ = c.Call(t.Context(), "echo.echo", map[string]int{"a": 1}, nil)
			_ = c.Call(t.Context(), "chaos.echo", nil, nil)
		}
	}()
	var echo, fail methodView
	var sawAgent, sawFailed bool
	deadline := time.After(10 * time.Second)
	for !(sawAgent && echo.Rate > 0 && fail.ErrorPct == 100 && sawFailed) {
		select {
		case e, ok := <-evs:
			if !ok {
				t.Fatal("stream ended")
			}
			switch e[0] {
			case "view":
				var v viewT
				if err := json.Unmarshal([]byte(e[1]), &v); err != nil {
					t.Fatal(err)
				}
				if v.Cluster.Hub != m.Hub.ID() || v.Cluster.Registry != "memory" || !v.Cluster.RegistrySynced {
					t.Fatalf("cluster %+v; want this hub, its memory registry, synced", v.Cluster)
				}
				for _, a := range v.Agents {
					sawAgent = sawAgent || (a.ID == "echo-1" && a.Name == "echo" && a.State == "ready")
				}
				for _, mv := range v.Methods {
					switch mv.Name {
					case "echo.echo":
						echo = mv
					case "chaos.echo":
						fail = mv
					}
				}
			case "call":
				var rec telemetry.CallRecord
				_ = json.Unmarshal([]byte(e[1]), &rec)
				sawFailed = sawFailed || (rec.Method == "chaos.echo" && rec.Code != "OK" && rec.RequestID != "")
			}
		case <-deadline:
			t.Fatalf("after 10 s: agent seen %v, echo.echo %+v, chaos.echo %+v, a failed call in the tail %v", sawAgent, echo, fail, sawFailed)
		}
	}
	close(stopLoad)
	<-loadDone
	t.Logf("echo.echo %+v; chaos.echo %+v", echo, fail)
	if echo.Ready != 1 || echo.Total != 1 || echo.Breaker == "" || echo.P99Ms <= 0 {
		t.Errorf("echo.echo %+v: want 1/1 instances, a breaker state and a p99", echo)
	}

	// The call form.
	res, err := http.Post("http://"+m.Addr+"/ui/api/call", "application/json", strings.NewReader(`{"method":"echo.echo","params":{"from":"the console"}}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var out struct {
		Result  json.RawMessage
		TraceID string
		Error   *struct{ Code, Message string }
	}
	if json.Unmarshal(b, &out) != nil || string(out.Result) != `{"from":"the console"}` || len(out.TraceID) != 32 {
		t.Errorf("call: %s; want the echo and a trace id", b)
	}
	res, _ = http.Post("http://"+m.Addr+"/ui/api/call", "application/json", strings.NewReader(`{"method":"chaos.echo"}`))
	b, _ = io.ReadAll(res.Body)
	res.Body.Close()
	if json.Unmarshal(b, &out) != nil || out.Error == nil || out.Error.Code == "" {
		t.Errorf("failing call: %s; want its coded error", b)
	}

	// Params checked against the declared schema before the call.
	res, _ = http.Post("http://"+m.Addr+"/ui/api/call", "application/json", strings.NewReader(`{"method":"echo.sleep","params":{"ms":"soon"}}`))
	b, _ = io.ReadAll(res.Body)
	res.Body.Close()
	out.Error = nil
	if json.Unmarshal(b, &out) != nil || out.Error == nil || out.Error.Code != "INVALID_PARAMS" || !strings.Contains(out.Error.Message, "declared schema") {
		t.Errorf("echo.sleep with a string for ms: %s; want INVALID_PARAMS from the declared schema", b)
	}

	cancel()
	for range evs {
	}
	meshtest.WaitFor(t, 5*time.Second, func() bool { return runtime.NumGoroutine() <= base })
}

// TestConsoleAuth: with a key, the console's data needs an admin-role
// token: none, a bad one and a reader's are refused, an admin's is not;
// the page itself and /ui/api/info are served (they hold no data).
func TestConsoleAuth(t *testing.T) {
	m := start(t, &hub.Security{Key: testkit.TestKey})
	get := func(path, token string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, "http://"+m.Addr+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(res.Body, 512))
		return res.StatusCode, string(b)
	}
	if code, body := get("/ui/", ""); code != 200 || !strings.Contains(body, "agentmesh") {
		t.Errorf("/ui/: %d", code)
	}
	if code, body := get("/ui/api/info", ""); code != 200 || !strings.Contains(body, `"authRequired":true`) {
		t.Errorf("/ui/api/info: %d %s", code, body)
	}
	reader := testkit.Token(t, auth.Claims{Subject: "r", Roles: []string{"reader"}}, time.Hour)
	admin := testkit.Token(t, auth.Claims{Subject: "a", Roles: []string{auth.RoleAdmin}}, time.Hour)
	for _, tc := range []struct {
		token string
		want  int
	}{{"", 401}, {"abc.def.ghi", 401}, {reader, 403}, {admin, 200}} {
		ctx, cancel := context.WithCancel(t.Context())
		_, status := events(t, ctx, "http://"+m.Addr+"/ui/api/stream", tc.token)
		cancel()
		if status != tc.want {
			t.Errorf("stream with token %.12q: %d; want %d", tc.token, status, tc.want)
		}
		if code, body := get("/ui/api/whoami", tc.token); code != 200 || strings.Contains(body, `"ok":true`) != (tc.want == 200) {
			t.Errorf("whoami with token %.12q: %d %s", tc.token, code, body)
		}
	}
	res, _ := http.Post("http://"+m.Addr+"/ui/api/call", "application/json", strings.NewReader(`{"method":"mesh.ping"}`))
	res.Body.Close()
	if res.StatusCode != 401 {
		t.Errorf("call without a token: %d; want 401", res.StatusCode)
	}
}
