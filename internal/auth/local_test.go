package auth

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSameHost(t *testing.T) {
	require.True(t, SameHost(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}))
	require.True(t, SameHost(&net.TCPAddr{IP: net.IPv6loopback, Port: 1}))
	require.True(t, SameHost(&net.UnixAddr{Name: "@x", Net: "unix"}))
	require.False(t, SameHost(nil))
	require.False(t, SameHost(&net.TCPAddr{IP: net.ParseIP("203.0.113.9"), Port: 1}))
	addrs, err := net.InterfaceAddrs()
	require.NoError(t, err)
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			require.True(t, SameHost(&net.TCPAddr{IP: n.IP, Port: 1}), "own address %s", n.IP)
		}
	}

	require.NotNil(t, Protected.AllowSameHost())
	require.Nil(t, Authenticated.AllowSameHost())
	require.Nil(t, Insecure.AllowSameHost())
}

func TestSameHostSeesNewAddress(t *testing.T) {
	o := &ownAddrs{}
	added := net.ParseIP("198.51.100.7")
	list := []net.Addr{&net.IPNet{IP: net.ParseIP("198.51.100.1"), Mask: net.CIDRMask(32, 32)}}
	o.read = func() ([]net.Addr, error) { return list, nil }
	require.False(t, o.has(added))
	list = append(list, &net.IPNet{IP: added, Mask: net.CIDRMask(32, 32)})
	o.at = o.at.Add(-51 * time.Millisecond) // the last read is older than the miss limit
	require.True(t, o.has(added))
}
