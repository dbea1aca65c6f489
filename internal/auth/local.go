package auth

import (
	"net"
	"sync"
	"time"
)

// SameHost admits what LoopbackOnly admits and also peers whose address
// is one of this host's own (a same-host process that dialled the
// host's network address, as engines named after it do). A remote host
// cannot complete a TCP handshake from one of our addresses, so this
// keeps the network out as LoopbackOnly does. The host's addresses are
// cached for a second; a miss reads them again (at most every 50 ms), so
// an address added a moment ago is known.
func SameHost(a net.Addr) bool {
	if LoopbackOnly(a) {
		return true
	}
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return false
	}
	return hostAddrs.has(ta.IP)
}

// AllowSameHost is m.Allow with same-host peers admitted in Protected mode
// (SameHost): for listeners bound to a host address rather than loopback.
func (m Mode) AllowSameHost() func(net.Addr) bool {
	if m == Protected {
		return SameHost
	}
	return nil
}

var hostAddrs ownAddrs

type ownAddrs struct {
	mu   sync.Mutex
	at   time.Time
	ips  []net.IP
	read func() ([]net.Addr, error) // net.InterfaceAddrs unless set
}

func (o *ownAddrs) has(ip net.IP) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if time.Since(o.at) > time.Second || o.ips == nil {
		o.refresh()
	}
	if o.contains(ip) {
		return true
	}
	if time.Since(o.at) > 50*time.Millisecond {
		o.refresh()
		return o.contains(ip)
	}
	return false
}

func (o *ownAddrs) refresh() {
	read := o.read
	if read == nil {
		read = net.InterfaceAddrs
	}
	addrs, err := read()
	o.ips = o.ips[:0]
	if err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				o.ips = append(o.ips, n.IP)
			}
		}
	}
	o.at = time.Now()
}

func (o *ownAddrs) contains(ip net.IP) bool {
	for _, own := range o.ips {
		if own.Equal(ip) {
			return true
		}
	}
	return false
}
