// Package cli holds the cobra command trees of meshd and meshctl. Commands
// write to the writers they are given, so tests run them with buffers.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"
)

// Exit codes shared by the commands.
const (
	ExitOK          = 0
	ExitError       = 1 // the call failed with a coded error
	ExitUsage       = 2 // bad flags or arguments
	ExitUnreachable = 3 // no hub could be reached
)

// exitError carries an exit code through cobra.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func withCode(code int, err error) error { return &exitError{code, err} }

func usageErr(format string, args ...any) error {
	return withCode(ExitUsage, fmt.Errorf(format, args...))
}

// Run executes cmd with args and returns the process exit code, printing
// errors (other than those already reported) on stderr.
func Run(ctx context.Context, cmd *cobra.Command, args []string, stderr io.Writer) int {
	cmd.SetArgs(args)
	cmd.SilenceErrors = true
	cmd.SilenceUsage = true
	err := cmd.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != errReported {
			fmt.Fprintln(stderr, "error:", ee.err)
		}
		return ee.code
	}
	fmt.Fprintln(stderr, "error:", err)
	return ExitUsage
}

// errReported marks an error whose message the command already printed.
var errReported = errors.New("reported")

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
