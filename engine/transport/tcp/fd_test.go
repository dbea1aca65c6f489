package tcp_test

import (
	"bytes"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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

	var old syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old))
	fds := netx.ExhaustFDs(t, 64)
	restored := false
	defer func() {
		if !restored {
			netx.RestoreFDs(t, fds, old)
		}
	}()
	// One fd for a's lane: it connects and waits in the backlog while the
	// data port's accept fails.
	syscall.Close(fds[len(fds)-1])
	fds = fds[:len(fds)-1]
	c := newCollector()
	a.tr.Submit(b.peer(), []*transport.Task{c.task(transport.Write, a.buf[:64<<10], b.addr(0), time.Now().Add(20*time.Second))})
	select {
	case <-failed:
	case <-time.After(20 * time.Second):
		t.Log("no failed accept reported")
	}
	netx.RestoreFDs(t, fds, old)
	restored = true

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
