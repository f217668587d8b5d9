package hub_test

import (
	"testing"

	"go.uber.org/goleak"
)

// helperMain, when a test file sets it, runs first: in a test binary
// re-executed as a helper process (the S26 attackers) it does its work and
// exits instead of returning.
var helperMain func()

func TestMain(m *testing.M) {
	if helperMain != nil {
		helperMain()
	}
	goleak.VerifyTestMain(m,
		// net/http's keep-alive connections of the default transport used
		// by raw HTTP requests in tests.
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}
