//go:build !linux

package wsconn

import "net"

// tuneTCP: linear retransmission timeouts for thin streams are Linux's.
func tuneTCP(net.Conn) {}
