// Package hub is the mesh's hub: admission (authentication, roles, rate
// limits, idempotency), the dispatcher and its built-in methods, the
// router and forward path to agents on this hub or on a peer hub, and
// the drain. It serves agents and clients over the native link (/ws) and
// JSON-RPC (/rpc); the foreign protocols (package surface/...) mount on
// it from outside through the narrow interface it implements
// (surface.Host) and it imports none of them.
package hub
