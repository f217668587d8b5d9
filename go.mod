module github.com/agentmesh/agentmesh

go 1.26.0

require (
	github.com/cenkalti/backoff/v5 v5.0.3
	github.com/gorilla/websocket v1.5.3
	github.com/sony/gobreaker/v2 v2.4.0
	github.com/spf13/cobra v1.10.2
	go.uber.org/goleak v1.3.0
	golang.org/x/term v0.47.0
)

require (
	github.com/inconshreveable/mousetrap v1.1.0 // indirect
	github.com/spf13/pflag v1.0.9 // indirect
	golang.org/x/sys v0.49.0 // indirect
)
