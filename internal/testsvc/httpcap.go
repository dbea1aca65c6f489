package testsvc

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/internal/netx"
)

// keepAlive is one HTTP/1.1 connection used by hand, so a test knows
// which connection a request went on.
type keepAlive struct {
	c net.Conn
	r *bufio.Reader
}

// get sends one request and reads its response (any status).
func (k *keepAlive) get(path string) error {
	k.c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(k.c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(k.r, nil)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return err
}

// CheckHTTPPortBounded asserts what every HTTP port served through
// netx.ServeHTTP does: perHost keep-alive connections from 127.0.0.1
// are served, one more is served by closing one of them that is idle, and a
// peer that connected while the process had no fd left is served once
// fds are back. It waits for addr to accept first. Not parallel (it
// starves the process of fds).
func CheckHTTPPortBounded(t *testing.T, addr, path string, perHost int) {
	t.Helper()
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 20*time.Second, 20*time.Millisecond)
	dial := func() *keepAlive {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return &keepAlive{c: c, r: bufio.NewReader(c)}
	}
	var conns []*keepAlive
	for range perHost {
		k := dial()
		require.NoError(t, k.get(path))
		conns = append(conns, k)
	}
	extra := dial()
	require.NoError(t, extra.get(path))
	// Exactly one was closed for it. Usually conns[0], but the server
	// marks a connection idle after writing its response, so on a
	// loaded host conns[1] may have gone idle first.
	var closed []int
	for i, k := range conns {
		if k.get(path) != nil {
			closed = append(closed, i)
		}
	}
	require.Len(t, closed, 1, "connections closed for one over the per-host cap: %v", closed)
	for _, k := range append(conns, extra) {
		k.c.Close()
	}

	finish := netx.StarveWithPeer(t, addr)
	time.Sleep(50 * time.Millisecond) // accepts fail with EMFILE meanwhile
	pc := finish()
	k := &keepAlive{c: pc, r: bufio.NewReader(pc)}
	require.NoError(t, k.get(path), "the port did not serve a peer after fd exhaustion")
}
