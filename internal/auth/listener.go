package auth

import "net"

// Filter wraps an HTTP server's listener (which has its own accept loop,
// http.Server.Serve) so that peers allow refuses are closed before a byte
// is read: the same decision netx.Config.Allow makes for the RPC ports.
// onRefuse, when set, is told each refused peer. A nil allow is l.
func Filter(l net.Listener, allow func(net.Addr) bool, onRefuse func(net.Addr)) net.Listener {
	if allow == nil {
		return l
	}
	return &filtered{Listener: l, allow: allow, onRefuse: onRefuse}
}

type filtered struct {
	net.Listener
	allow    func(net.Addr) bool
	onRefuse func(net.Addr)
}

func (f *filtered) Accept() (net.Conn, error) {
	for {
		c, err := f.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if f.allow(c.RemoteAddr()) {
			return c, nil
		}
		if f.onRefuse != nil {
			f.onRefuse(c.RemoteAddr())
		}
		c.Close()
	}
}
