package link

import "errors"

// ErrHubUnreachable is the cause of the UNAVAILABLE error a client returns
// when it cannot connect to any hub.
var ErrHubUnreachable = errors.New("cannot reach the hub")
