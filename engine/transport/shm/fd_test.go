package shm_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/engine/transport"
	"github.com/crescent-kv/crescent/engine/transport/shm"
	"github.com/crescent-kv/crescent/internal/netx"
)

// TestServerSurvivesFDExhaustion: while the process is out of fds the
// shm server's accept fails with EMFILE; once fds are back, the peer that
// connected meanwhile gets its regions and copies, and so do new peers.
func TestServerSurvivesFDExhaustion(t *testing.T) {
	log, failed := netx.AcceptFailed()
	b := newNode(t, "b", 1<<20, nodeOpts{log: log})
	a := newNode(t, "a", 1<<20, nodeOpts{cfg: shm.Config{RevokeTimeout: 30 * time.Second}})
	for i := range a.buf {
		a.buf[i] = byte(i * 3)
	}

	// One fd for a's control connection: it waits in the backlog, its
	// list request unanswered, while the server's accept fails.
	restore := netx.StarveFDs(t, 1)
	accepted := make(chan bool, 1)
	go func() { accepted <- a.tr.Accepts(b.peer(), b.addr(0), 4096) }()
	select {
	case <-failed:
	case <-time.After(20 * time.Second):
		t.Log("no failed accept reported")
	}
	restore()

	require.True(t, <-accepted, "the peer that connected during EMFILE was not served")
	r := do(t, a.tr, b.peer(), transport.Write, a.buf[:64<<10], b.addr(0))
	require.NoError(t, r.err)
	assert.True(t, bytes.Equal(a.buf[:64<<10], b.buf[:64<<10]), "written bytes differ")

	a2 := newNode(t, "a2", 1<<20, nodeOpts{})
	require.True(t, a2.tr.Accepts(b.peer(), b.addr(0), 64<<10), "a new peer after EMFILE")
	r = do(t, a2.tr, b.peer(), transport.Read, a2.buf[:64<<10], b.addr(0))
	require.NoError(t, r.err)
	assert.True(t, bytes.Equal(a.buf[:64<<10], a2.buf[:64<<10]), "read bytes differ")
}

// TestServerCap: at MaxConns a connection that sent nothing makes room
// for a real peer; a peer that has listed keeps its slot (it may hold
// mappings only its connection can revoke), so the next peer waits.
func TestServerCap(t *testing.T) {
	b := newNode(t, "b", 1<<20, nodeOpts{cfg: shm.Config{MaxConns: 1}})
	rawDial(t, b) // sends nothing
	a := newNode(t, "a", 1<<20, nodeOpts{cfg: shm.Config{RevokeTimeout: 20 * time.Second}})
	require.True(t, a.tr.Accepts(b.peer(), b.addr(0), 4096), "a silent connection kept a peer out")

	a2 := newNode(t, "a2", 1<<20, nodeOpts{cfg: shm.Config{RevokeTimeout: 200 * time.Millisecond, RetryAfter: time.Millisecond}})
	require.False(t, a2.tr.Accepts(b.peer(), b.addr(0), 4096), "a second peer was served past MaxConns")
	a.close()
	require.Eventually(t, func() bool { return a2.tr.Accepts(b.peer(), b.addr(0), 4096) }, 20*time.Second, 10*time.Millisecond,
		"the next peer once the slot freed")
}
