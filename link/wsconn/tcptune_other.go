//go:build !linux

package wsconn

import "net"

// tuneTCP: the retransmission timeouts it bounds are Linux's options.
func tuneTCP(net.Conn) {}
