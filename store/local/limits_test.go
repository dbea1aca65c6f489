package local

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/crescent-kv/crescent/internal/testutil"
	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/errcode"
)

// unixPair is a connected pair of real Unix stream sockets.
func unixPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "pair")
		defer f.Close() // FileConn holds its own descriptor
		c, err := net.FileConn(f)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// rawHeader is a frame header claiming n bytes after the length field.
func rawHeader(n uint32, op byte) []byte {
	b := make([]byte, hdrLen)
	h := header{n: n, op: op, id: 1}
	h.put(b)
	return b
}

// TestFrameBodyGrowsAsBytesArrive: a header claiming the largest frame,
// followed by a few bytes and EOF, costs about one read chunk, not the
// size it claims; a large frame arriving in pieces is read whole.
func TestFrameBodyGrowsAsBytesArrive(t *testing.T) {
	w, r := unixPair(t)
	_, err := w.Write(append(rawHeader(maxFrame, opPut), make([]byte, 100)...))
	require.NoError(t, err)
	require.NoError(t, w.CloseWrite())
	f := newFconn(r)
	var rerr error
	n := testutil.Allocated(func() { _, _, rerr = f.read(10*time.Second, 10*time.Second) })
	require.ErrorIs(t, rerr, io.ErrUnexpectedEOF)
	require.Less(t, n, uint64(1<<20), "a header of %d bytes and 100 bytes of body allocated %d bytes", maxFrame, n)

	w, r = unixPair(t)
	e := newEnc(opPut, 7, token{})
	body := val(3<<20+5, 3)
	e.b = append(e.b, body...)
	frame := e.frame(stOK)
	done := make(chan error, 1)
	go func() {
		var err error
		for p := frame; len(p) > 0 && err == nil; p = p[min(len(p), 100_003):] {
			_, err = w.Write(p[:min(len(p), 100_003)])
		}
		done <- err
	}()
	h, got, err := newFconn(r).read(10*time.Second, 10*time.Second)
	require.NoError(t, <-done)
	require.NoError(t, err)
	require.EqualValues(t, 7, h.id)
	require.True(t, bytes.Equal(body, got), "body read in pieces differs")
}

// TestOversizedHelloRefused: a hello header claiming 65 MiB from a peer
// not yet registered is refused with an error and the connection closed,
// without its size being allocated; the server goes on serving dummies.
func TestOversizedHelloRefused(t *testing.T) {
	// The reader alone: header only, then EOF.
	w, r := unixPair(t)
	_, err := w.Write(rawHeader(0x04100000, opHello))
	require.NoError(t, err)
	require.NoError(t, w.CloseWrite())
	f := newFconn(r)
	var rerr error
	n := testutil.Allocated(func() { _, _, rerr = f.readMax(10*time.Second, 10*time.Second, helloFrame) })
	require.ErrorIs(t, rerr, ErrProtocol)
	require.Less(t, n, uint64(1<<20), "an oversized hello header allocated %d bytes", n)

	// Against a server: the peer sends the header and goes quiet.
	s, _, _ := serve(t, Options{})
	c, err := net.Dial("unix", s.Path())
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write(rawHeader(0x04100000, opHello))
	require.NoError(t, err)
	rf := newFconn(c.(*net.UnixConn))
	defer rf.closeFDs()
	h, body, err := rf.read(10*time.Second, 10*time.Second)
	require.NoError(t, err, "no answer to an oversized hello")
	require.Equal(t, stErr, h.status)
	d := dec{b: body}
	rep := d.errReply()
	require.ErrorIs(t, rep, errcode.ErrInvalidParams)
	require.ErrorContains(t, rep, "hello frame")
	_, _, err = rf.read(10*time.Second, 10*time.Second)
	require.Error(t, err, "connection still open after an oversized hello")
	require.EqualValues(t, 1, s.Stats().Refused)

	dm := dial(t, s)
	require.NoError(t, dm.Ping(tctx(t)))
}

// TestViewsCap: a dummy that never releases gets NO_AVAILABLE_HANDLE
// past maxViews; the views it holds stay valid, and after a release
// GetBuffer works again.
func TestViewsCap(t *testing.T) {
	s, _, _ := serve(t, shmCache())
	d := dial(t, s)
	ctx := tctx(t)
	v := val(1000, 6)
	require.NoError(t, d.Put(ctx, "k", v, store.ReplicateConfig{}))
	keys := make([]string, maxBatch)
	for i := range keys {
		keys[i] = "k"
	}
	var held []*Buffer
	defer func() {
		d.Close() // the session drops the server's side; releases here only unmap
		for _, b := range held {
			b.Release()
		}
	}()
	for range maxViews / maxBatch {
		bs, errs := d.BatchGetBuffer(ctx, keys)
		for i := range bs {
			require.NoError(t, errs[i])
			require.True(t, bs[i].Shared())
		}
		held = append(held, bs...)
	}
	_, err := d.GetBuffer(ctx, "k")
	require.ErrorIs(t, err, errcode.ErrNoAvailableHandle)
	_, errs := d.BatchGetBuffer(ctx, []string{"k", "k"})
	require.ErrorIs(t, errs[0], errcode.ErrNoAvailableHandle)
	require.ErrorIs(t, errs[1], errcode.ErrNoAvailableHandle)
	require.Equal(t, v, held[0].Bytes(), "a held view changed after the cap was hit")
	require.Equal(t, v, held[len(held)-1].Bytes())

	held[0].Release() // sent before the next request: the server has it first
	b, err := d.GetBuffer(ctx, "k")
	require.NoError(t, err)
	held[0] = b
	require.Equal(t, v, b.Bytes())
	_, err = d.GetBuffer(ctx, "k")
	require.ErrorIs(t, err, errcode.ErrNoAvailableHandle)
	require.NoError(t, d.Ping(ctx), "the session survives a refused view")
}

// TestBlockShare: with two dummies registered, one may hold views of at
// most half the cache's blocks; past that it gets copies, and the other
// dummy still gets views. Alone, a dummy may hold every block.
func TestBlockShare(t *testing.T) {
	opts := shmCache() // 4 blocks
	opts.AdmissionThreshold = 1
	s, _, _ := serve(t, opts)
	a := dial(t, s)
	b := dial(t, s)
	ctx := tctx(t)
	vals := map[string][]byte{}
	for i := range 6 {
		k := fmt.Sprintf("k%d", i)
		vals[k] = val(1000, byte(i))
		require.NoError(t, a.Put(ctx, k, vals[k], store.ReplicateConfig{}))
	}
	view := func(d *Dummy, k string, shared bool) *Buffer {
		t.Helper()
		buf, err := d.GetBuffer(ctx, k)
		require.NoError(t, err)
		require.Equal(t, shared, buf.Shared(), "%s shared", k)
		require.Equal(t, vals[k], buf.Bytes())
		return buf
	}

	a0 := view(a, "k0", true)
	a1 := view(a, "k1", true)
	view(a, "k2", false).Release()
	require.EqualValues(t, 1, s.Stats().ShareCopies)
	a0b := view(a, "k0", true) // a block it already holds costs nothing
	b3 := view(b, "k3", true)
	b4 := view(b, "k4", true)

	a0.Release()
	a0b.Release()
	a5 := view(a, "k5", true) // room in its share again

	b3.Release()
	b4.Release()
	b.Close()
	require.Eventually(t, func() bool { return s.Stats().Dummies == 1 }, 10*time.Second, 10*time.Millisecond)
	a0 = view(a, "k0", true)
	a2 := view(a, "k2", true) // alone: every block
	require.EqualValues(t, 1, s.Stats().ShareCopies)
	for _, v := range []*Buffer{a0, a1, a2, a5} {
		v.Release()
	}
}
