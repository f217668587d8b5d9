package mesh

import "errors"

// ErrNotSent is the cause of an error for a request that provably never
// left this side (no link, link closed before the send). Such a request is
// safe to retry even when its method is not idempotent.
var ErrNotSent = errors.New("request was not sent")

// ErrHubUnreachable is the cause of the UNAVAILABLE error a client returns
// when it cannot connect to any hub.
var ErrHubUnreachable = errors.New("cannot reach the hub")
