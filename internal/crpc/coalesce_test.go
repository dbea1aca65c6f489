package crpc

import (
	"encoding/binary"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// TestRepliesCoalesce: replies that come while another reply is being
// written queue and leave together in one write, each intact and once;
// one over maxCoalesce waits its turn instead of being copied.
func TestRepliesCoalesce(t *testing.T) {
	lis := listen(t)
	s, _, _ := serveOn(t, lis, ServerConfig{IdleTimeout: time.Hour})
	c := rawConn(t, lis.Addr().String())
	c.SetWriteDeadline(time.Now().Add(30 * time.Second))
	// The first reply (32 MiB) fills the socket buffers while the test
	// does not read: its write blocks.
	big := strings.Repeat("b", 32<<20)
	_, err := c.Write(request(1, "/crpc.test.Svc/Echo", big, 0))
	require.NoError(t, err)
	var sc *serverConn
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for x := range s.conns {
			sc = x
		}
		if sc == nil {
			return false
		}
		sc.wmu.Lock()
		defer sc.wmu.Unlock()
		return sc.writing
	}, 30*time.Second, time.Millisecond)
	const small = 20
	want := map[uint32]string{1: "echo:" + big}
	queued := 0
	for i := range small {
		id := uint32(10 + i)
		v := fmt.Sprint("small-", i)
		want[id] = "echo:" + v
		_, err := c.Write(request(id, "/crpc.test.Svc/Echo", v, 0))
		require.NoError(t, err)
		queued += headerLen + proto.Size(wrapperspb.String("echo:"+v))
	}
	medium := strings.Repeat("m", 2*maxCoalesce)
	want[99] = "echo:" + medium
	_, err = c.Write(request(99, "/crpc.test.Svc/Echo", medium, 0))
	require.NoError(t, err)
	// Every small reply queues behind the blocked write; the medium one
	// waits outside the queue.
	require.Eventually(t, func() bool {
		sc.wmu.Lock()
		defer sc.wmu.Unlock()
		return len(sc.wq) == queued
	}, 30*time.Second, time.Millisecond)
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	got := map[uint32]string{}
	for len(got) < len(want) {
		var hdr [headerLen]byte
		_, err := io.ReadFull(c, hdr[:])
		require.NoError(t, err)
		f := frame{id: binary.LittleEndian.Uint32(hdr[4:]), kind: hdr[8], body: make([]byte, binary.LittleEndian.Uint32(hdr[0:]))}
		_, err = io.ReadFull(c, f.body)
		require.NoError(t, err)
		require.Equal(t, byte(kindReply), f.kind)
		var out wrapperspb.StringValue
		require.NoError(t, proto.Unmarshal(f.body, &out))
		_, dup := got[f.id]
		require.False(t, dup, "reply %d twice", f.id)
		got[f.id] = out.Value
	}
	require.Equal(t, want, got)
	sc.wmu.Lock()
	defer sc.wmu.Unlock()
	require.Equal(t, uint64(2), sc.fill, "the queued replies left in one batch")
	require.Equal(t, uint64(1), sc.sent)
}
