package tcp_test

import (
	"bytes"
	"net"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/engine/metadata"
	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/engine/transport/tcp"
	"github.com/crescent-kv/crescent/internal/netx"
)

// TestDataPortSurvivesFDExhaustion: while the process is out of fds the
// data port's accept fails with EMFILE; once fds are back, the lane that
// connected meanwhile and new initiators are served.
func TestDataPortSurvivesFDExhaustion(t *testing.T) {
	log, failed := netx.AcceptFailed()
	b := startNodeLog(t, "b", 1<<20, tcp.Config{}, log)
	t.Cleanup(b.close)
	a := newNode(t, "a", 1<<20, tcp.Config{Lanes: 1})
	for i := range a.buf {
		a.buf[i] = byte(i * 7)
	}

	// One fd for a's lane: it connects and waits in the backlog while the
	// data port's accept fails.
	restore := netx.StarveFDs(t, 1)
	c := newCollector()
	a.tr.Submit(b.peer(), []*transport.Task{c.task(transport.Write, a.buf[:64<<10], b.addr(0), time.Now().Add(20*time.Second))})
	select {
	case <-failed:
	case <-time.After(20 * time.Second):
		t.Log("no failed accept reported")
	}
	restore()

	r := c.wait(t, 1)[0]
	require.NoError(t, r.err, "the write queued during EMFILE")
	assert.True(t, bytes.Equal(a.buf[:64<<10], b.buf[:64<<10]), "written bytes differ")

	// A new initiator gets a new connection accepted.
	a2 := newNode(t, "a2", 1<<20, tcp.Config{Lanes: 1})
	a2.tr.Submit(b.peer(), []*transport.Task{c.task(transport.Read, a2.buf[:64<<10], b.addr(0), soon())})
	r = c.wait(t, 1)[0]
	require.NoError(t, r.err)
	assert.True(t, bytes.Equal(a.buf[:64<<10], a2.buf[:64<<10]), "read bytes differ")
}

// hangingPort is a loopback port whose accept queue is full: dials to it
// hang until their timeout.
func hangingPort(t *testing.T) int {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { syscall.Close(fd) })
	require.NoError(t, syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	require.NoError(t, syscall.Listen(fd, 0))
	sa, err := syscall.Getsockname(fd)
	require.NoError(t, err)
	port := sa.(*syscall.SockaddrInet4).Port
	filler, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	require.NoError(t, err)
	t.Cleanup(func() { filler.Close() })
	return port
}

// TestCloseWaitsForReplacedPeer: a peer whose descriptor names a new port
// has its old lanes drained in the background; Close waits for that
// drain, so no task completes after Close returned.
func TestCloseWaitsForReplacedPeer(t *testing.T) {
	stall := newStallServer(t, true)
	a := startNode(t, "a", 1<<20, tcp.Config{Lanes: 1, DialTimeout: 300 * time.Millisecond})
	defer a.close()
	var port atomic.Int64
	port.Store(int64(hangingPort(t)))
	p := &testPeer{name: "x", desc: func() *metadata.SegmentDesc { return rawPeer("x", int(port.Load()), 2).Desc() }}

	// The lane is still dialing, so the task waits in its queue and the
	// drain completes it; the completion is slow.
	closed := make(chan struct{})
	var done atomic.Bool
	slow := transport.NewTask(transport.Write, a.buf[:10], rawBase, time.Now().Add(time.Minute), func(*transport.Task, int, error) {
		select {
		case <-closed:
		case <-time.After(2 * time.Second):
		}
		done.Store(true)
	})
	a.tr.Submit(p, []*transport.Task{slow})
	port.Store(int64(stall.port()))
	c := newCollector()
	a.tr.Submit(p, []*transport.Task{c.task(transport.Write, a.buf[:10], rawBase, time.Now().Add(time.Minute))})
	require.NoError(t, a.tr.Close())
	assert.True(t, done.Load(), "Close returned while the replaced peer's drain was completing tasks")
	close(closed)
	assert.Error(t, c.wait(t, 1)[0].err, "a task still in flight at Close")
}

// TestDataPortCap: with MaxConns 1, a connection in the middle of a
// request keeps the slot; the next one is served once it closes.
func TestDataPortCap(t *testing.T) {
	b := newNode(t, "b", 1<<20, tcp.Config{MaxConns: 1})
	c1 := dialRaw(t, b)
	payload := make([]byte, 4096)
	send(t, c1, header(uint64(len(payload)), b.addr(0), tcp.OpWrite|tcp.V2Flag), payload[:10])
	c2 := dialRaw(t, b)
	send(t, c2, header(8, b.addr(8192), tcp.OpWrite|tcp.V2Flag), payload[:8])
	c2.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	_, err := c2.Read(make([]byte, 1))
	var ne net.Error
	require.ErrorAs(t, err, &ne, "a second connection was served past MaxConns")
	require.True(t, ne.Timeout(), "a second connection was served past MaxConns: %v", err)

	send(t, c1, payload[10:])
	assert.Equal(t, uint64(tcp.StatusOK), readStatus(t, c1))
	c1.Close()
	c2.SetReadDeadline(time.Now().Add(20 * time.Second))
	assert.Equal(t, uint64(tcp.StatusOK), readStatus(t, c2))
}

// TestDataPortEvictsIdle: connections that send nothing do not keep an
// initiator out at the cap.
func TestDataPortEvictsIdle(t *testing.T) {
	b := newNode(t, "b", 1<<20, tcp.Config{MaxConns: 2})
	for range 8 {
		dialRaw(t, b)
	}
	a := newNode(t, "a", 1<<20, tcp.Config{Lanes: 1})
	c := newCollector()
	a.tr.Submit(b.peer(), []*transport.Task{c.task(transport.Write, a.buf[:4096], b.addr(0), soon())})
	require.NoError(t, c.wait(t, 1)[0].err)
}
