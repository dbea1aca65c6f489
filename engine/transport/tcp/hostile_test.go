package tcp_test

import (
	"bytes"
	"context"
	"io"
	"math"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/transport/tcp"
	"github.com/crescent-kv/crescent/internal/testutil"
)

// TestAcceptsOnlyPorts: a descriptor whose tcp_data_port is not a port
// is not accepted (before, any positive number was, and the request
// then failed at dial time).
func TestAcceptsOnlyPorts(t *testing.T) {
	n := newNode(t, "a", 1<<20, tcp.Config{})
	for _, port := range []int{0, -1, 65536, 70000, math.MaxInt} {
		p := &testPeer{name: "b", desc: func() *metadata.SegmentDesc {
			return &metadata.SegmentDesc{Name: "127.0.0.1:1", TCPDataPort: port, TCPDataHost: "127.0.0.1",
				Buffers: []metadata.Buffer{{Name: "cpu:0", Addr: rawBase, Length: 4096}}}
		}}
		require.False(t, n.tr.Accepts(p, rawBase, 64), "port %d accepted", port)
	}
	p := &testPeer{name: "b", desc: func() *metadata.SegmentDesc {
		return &metadata.SegmentDesc{Name: "127.0.0.1:1", TCPDataPort: 65535, Buffers: []metadata.Buffer{{Name: "cpu:0", Addr: rawBase, Length: 4096}}}
	}}
	require.True(t, n.tr.Accepts(p, rawBase, 64))
}

// TestServerBoundsPendingReads: one-byte v1 READs pipelined without
// reading the replies pin at most 1024 leases (maxReplyReads); older
// replies are sent and their regions released. Before, the server held
// a lease and an iov entry per request until it ran out of requests, so
// a region read thousands of requests earlier could not be removed.
func TestServerBoundsPendingReads(t *testing.T) {
	const (
		big  = 16 << 20 // more than the socket buffers: sending it blocks the server
		tiny = 5000     // one-byte READs of the other region
		tail = 1024     // one-byte READs of b.buf: at the cap, none of the tiny ones is pending after them
	)
	b := newNode(t, "b", big, tcp.Config{SocketBuffer: 1 << 20})
	testutil.Fill(b.buf, 11)
	other := make([]byte, 4096)
	testutil.Fill(other, 12)
	r, err := b.reg.Add(other, "cpu:0", -1, 0, 0)
	require.NoError(t, err)

	c := dialRaw(t, b)
	require.NoError(t, c.SetReadBuffer(64<<10))
	require.NoError(t, c.SetWriteBuffer(1<<20))
	var req bytes.Buffer
	// The server blocks sending the first reply until every request is
	// queued in its socket, then reads them all without running dry
	// (which would flush the replies anyway).
	req.Write(header(big, b.addr(0), tcp.OpRead))
	for i := range tiny {
		req.Write(header(1, r.Addr+uint64(i%len(other)), tcp.OpRead))
	}
	for i := range tail {
		req.Write(header(1, b.addr(i), tcp.OpRead))
	}
	req.Write(header(big, b.addr(0), tcp.OpRead))
	before := b.tr.Stats().ServerBytesOut
	send(t, c, req.Bytes())
	testutil.Eventually(t, "all requests to reach the server", func() bool { return unsent(t, c) == 0 })
	got := make([]byte, big)
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	require.True(t, bytes.Equal(b.buf, got), "first big read")

	// Now the server blocks sending the last big reply, holding the leases
	// of whatever it has not sent yet.
	testutil.Eventually(t, "the server to take every request", func() bool {
		return b.tr.Stats().ServerBytesOut-before == 2*big+tiny+tail
	})
	ended, cancel := context.WithCancel(context.Background())
	cancel() // Remove does not wait: it fails if a lease is left
	_, err = b.reg.Remove(ended, r.Addr)
	require.NoError(t, err, "READs more than %d requests back still pin their region", tail)

	rest := make([]byte, tiny+tail+big)
	_, err = io.ReadFull(c, rest)
	require.NoError(t, err)
	for i := range tiny {
		require.Equal(t, other[i%len(other)], rest[i], "tiny read %d", i)
	}
	require.True(t, bytes.Equal(b.buf[:tail], rest[tiny:tiny+tail]), "tail reads")
	require.True(t, bytes.Equal(b.buf, rest[tiny+tail:]), "last big read")
}

// unsent is how many bytes c has sent that the peer has not taken yet.
func unsent(tb testing.TB, c *net.TCPConn) int {
	tb.Helper()
	rc, err := c.SyscallConn()
	require.NoError(tb, err)
	var n int
	var ierr error
	require.NoError(tb, rc.Control(func(fd uintptr) { n, ierr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) }))
	require.NoError(tb, ierr)
	return n
}
