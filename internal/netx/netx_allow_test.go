package netx

import (
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Allow turns a peer away before its handler runs.
func TestAllowRefuses(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	handled := make(chan struct{}, 1)
	refused := make(chan net.Addr, 1)
	counted := make(chan uint64, 1)
	loop := make(chan *Loop, 1)
	l := Serve(ln, Config{Allow: func(net.Addr) bool { return false }, OnRefuse: func(a net.Addr) {
		counted <- (<-loop).Refused()
		refused <- a
	}}, func(c *Conn) { handled <- struct{}{} })
	loop <- l
	defer l.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	select {
	case a := <-refused:
		assert.Equal(t, c.LocalAddr().String(), a.String())
	case <-time.After(5 * time.Second):
		t.Fatal("not refused")
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Read(make([]byte, 1))
	assert.Error(t, err, "the refused connection is closed")
	assert.Equal(t, uint64(1), <-counted, "counted before OnRefuse runs")
	assert.Equal(t, uint64(1), l.Refused())
	assert.Empty(t, handled)
}

func TestAllowAdmits(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	handled := make(chan struct{}, 1)
	l := Serve(ln, Config{Allow: func(a net.Addr) bool { return a.(*net.TCPAddr).IP.IsLoopback() }},
		func(c *Conn) { handled <- struct{}{} })
	defer l.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	select {
	case <-handled:
	case <-time.After(5 * time.Second):
		t.Fatal("not handled")
	}
	assert.Zero(t, l.Refused())
}
