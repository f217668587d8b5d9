//go:build !linux

package wsconn

import "net"

// tuneTCP: the retransmission timeouts it bounds are Linux's options.
func tuneTCP(net.Conn) {}

func tuneRTO(net.Conn) {}

// TuneLink: the retransmission timeout bounds are Linux's options.
func TuneLink(net.Conn) {}
