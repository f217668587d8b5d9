//go:build !linux

package tcptune

import "net"

// Thin: the options it sets are Linux's.
func Thin(net.Conn) {}

// BoundRTO: the retransmission timeout bounds are Linux's options.
func BoundRTO(net.Conn) {}
