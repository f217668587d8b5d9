// Package mesh is the unified client of the mesh: what a caller imports.
// A Client calls methods by name over a hub's native WebSocket link
// (ws://, wss://) or its JSON-RPC endpoint (http://, https://), with the
// method's timeout, retry, breaker and bulkhead policy (package
// reliability) and one trace across every hop (package telemetry). It
// imports neither the hub nor any protocol surface.
package mesh
