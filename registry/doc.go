// Package registry owns discovery: the Registration an agent makes, the
// Registry interface its backends implement (memory here, etcd for
// clusters), heartbeat expiry, the immutable Snapshot that routers read on
// the hot path, and the power-of-two-choices balancer.
//
// It knows nothing of sockets or HTTP: the hub binds instances to links.
package registry
