package e2e_test

import (
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSystemdNotify: meshd under systemd's Type=notify protocol, with a
// real notify socket: READY=1 once it serves, WATCHDOG=1 at half the
// watchdog interval, STOPPING=1 when SIGTERM starts the drain.
func TestSystemdNotify(t *testing.T) {
	t.Parallel()
	sock := filepath.Join(t.TempDir(), "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	msgs := make(chan string, 64)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				close(msgs)
				return
			}
			msgs <- string(buf[:n])
		}
	}()
	started := time.Now()
	p := startWithEnv(t, []string{"NOTIFY_SOCKET=" + sock, "WATCHDOG_USEC=400000"}, "meshd", "--listen", "127.0.0.1:0")
	next := func(want string, within time.Duration) time.Duration {
		t.Helper()
		deadline := time.After(within)
		for {
			select {
			case m := <-msgs:
				if strings.Contains(m, want) {
					return time.Since(started)
				}
			case <-deadline:
				t.Fatalf("no %s from meshd within %v", want, within)
			}
		}
	}
	ready := next("READY=1", 10*time.Second)
	// Ready means serving: the port answers at once.
	var addr string
	waitFor(t, "the listen address in the log", 2*time.Second, func() bool { addr = listeningAddr(p.stderr.String()); return addr != "" })
	if code := httpStatus(&http.Client{Timeout: time.Second}, "http://"+addr+"/healthz"); code != http.StatusOK {
		t.Errorf("after READY=1, /healthz answered %d", code)
	}
	w1 := next("WATCHDOG=1", time.Second)
	w2 := next("WATCHDOG=1", time.Second)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	stopping := next("STOPPING=1", 5*time.Second)
	t.Logf("READY=1 at %v, watchdog at %v and %v (interval 400 ms), STOPPING=1 at %v",
		ready.Round(time.Millisecond), w1.Round(time.Millisecond), w2.Round(time.Millisecond), stopping.Round(time.Millisecond))
	if gap := w2 - w1; gap < 100*time.Millisecond || gap > 400*time.Millisecond {
		t.Errorf("watchdog keep-alives %v apart; want about 200 ms (half of WatchdogSec)", gap)
	}
}
