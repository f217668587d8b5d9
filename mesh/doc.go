// Package mesh owns the hub (gateway, dispatcher, router), the unified
// client, and the link: one WebSocket with its reader, its writer, its
// pending map and its heartbeats. It holds no agent business logic.
package mesh
