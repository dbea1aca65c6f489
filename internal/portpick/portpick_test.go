package portpick

import (
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPortBelowEphemeralRange: picks are bindable, distinct, and outside
// the range the kernel hands to outgoing connections and port-0 listeners.
func TestPortBelowEphemeralRange(t *testing.T) {
	lo, hi := window()
	require.Less(t, lo, hi)
	ps, err := Ports(50)
	require.NoError(t, err)
	seen := map[int]bool{}
	for _, p := range ps {
		assert.False(t, seen[p], "port %d handed out twice", p)
		seen[p] = true
		assert.GreaterOrEqual(t, p, lo)
		assert.Less(t, p, hi)
	}
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(ps[0]))
	require.NoError(t, err)
	l.Close()
}

// TestPortSkipsBound: a port something listens on is never returned.
func TestPortSkipsBound(t *testing.T) {
	lo, hi := window()
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	// Hold every port of a small window and check that picks avoid them:
	// shrink the window by handing its other ports out first.
	mu.Lock()
	saved := handed
	handed = map[int]bool{}
	t.Cleanup(func() { mu.Lock(); handed = saved; mu.Unlock() })
	for p := lo; p < hi; p++ {
		handed[p] = true
	}
	mu.Unlock()
	free := []int{}
	for p := lo; p < hi && len(free) < 4; p++ {
		if l, err := net.Listen("tcp", ":"+strconv.Itoa(p)); err == nil {
			l.Close()
			free = append(free, p)
		}
	}
	require.Len(t, free, 4)
	mu.Lock()
	for _, p := range free {
		delete(handed, p)
	}
	mu.Unlock()
	for _, p := range free[:3] {
		l, err := net.Listen("tcp", ":"+strconv.Itoa(p))
		require.NoError(t, err)
		held = append(held, l)
	}
	p, err := Port()
	require.NoError(t, err)
	assert.Equal(t, free[3], p, "the one unbound port")
	_, err = Port()
	assert.Error(t, err, "every port is bound or handed out")
}
