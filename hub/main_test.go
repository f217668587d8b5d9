package hub_test

import (
	"testing"

	"go.uber.org/goleak"
)

// helperMains, which test files append to, run first, in turn: in a test
// binary re-executed as a helper process (the S26 attackers, the S28
// flood) the one that recognizes its environment does its work and exits
// instead of returning.
var helperMains []func()

func TestMain(m *testing.M) {
	for _, h := range helperMains {
		h()
	}
	goleak.VerifyTestMain(m,
		// net/http's keep-alive connections of the default transport used
		// by raw HTTP requests in tests.
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}
