// Command meshd runs an agentmesh hub. See internal/cli for its flags.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/agentmesh/agentmesh/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, cli.NewMeshd(os.Stdout, os.Stderr), os.Args[1:], os.Stderr)
	stop()
	os.Exit(code)
}
