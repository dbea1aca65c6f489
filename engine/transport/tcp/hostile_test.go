package tcp_test

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/transport/tcp"
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
