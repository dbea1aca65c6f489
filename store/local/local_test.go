package local

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/store"
	"github.com/crescent-kv/crescent/store/errcode"
)

func val(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

// TestDummyAPI: every forwarded call answers as the real client would,
// batches per item.
func TestDummyAPI(t *testing.T) {
	s, _, _ := serve(t, shmCache())
	d := dial(t, s)
	ctx := tctx(t)
	v := val(100<<10, 1)
	require.NoError(t, d.Put(ctx, "a", v, store.ReplicateConfig{}))
	got, err := d.Get(ctx, "a")
	require.NoError(t, err)
	require.True(t, bytes.Equal(v, got))
	dst := make([]byte, len(v)+10)
	n, err := d.GetInto(ctx, "a", dst)
	require.NoError(t, err)
	require.Equal(t, len(v), n)
	require.True(t, bytes.Equal(v, dst[:n]))
	_, err = d.GetInto(ctx, "a", make([]byte, 10))
	require.ErrorIs(t, err, errcode.ErrBufferOverflow)
	ok, err := d.IsExist(ctx, "a")
	require.NoError(t, err)
	require.True(t, ok)
	_, err = d.Get(ctx, "missing")
	require.ErrorIs(t, err, errcode.ErrObjectNotFound)

	errs := d.BatchPut(ctx, []string{"b1", "b2", "a"}, [][]byte{val(10, 2), val(20, 3), v}, store.ReplicateConfig{})
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.ErrorIs(t, errs[2], errcode.ErrObjectAlreadyExists)
	vals, gerrs := d.BatchGet(ctx, []string{"b1", "nope", "b2"})
	require.NoError(t, gerrs[0])
	require.ErrorIs(t, gerrs[1], errcode.ErrObjectNotFound)
	require.Equal(t, val(20, 3), vals[2])
	oks, eerrs := d.BatchIsExist(ctx, []string{"b1", "nope"})
	require.NoError(t, eerrs[0])
	require.Equal(t, []bool{true, false}, oks)
	for _, err := range d.BatchRemove(ctx, []string{"b1", "b2"}, true) {
		require.NoError(t, err)
	}
	require.NoError(t, d.Remove(ctx, "a", true))
	_, err = d.Get(ctx, "a")
	require.ErrorIs(t, err, errcode.ErrObjectNotFound)
}

// TestGetBufferSharedHit: the second miss admits the key; then a
// GetBuffer is a view of the shared cache; the block is held until
// Release.
func TestGetBufferSharedHit(t *testing.T) {
	s, _, _ := serve(t, shmCache())
	d := dial(t, s)
	ctx := tctx(t)
	v := val(512<<10, 9)
	require.NoError(t, d.Put(ctx, "k", v, store.ReplicateConfig{}))
	b1, err := d.GetBuffer(ctx, "k") // miss, not admitted: a transient view
	require.NoError(t, err)
	require.True(t, bytes.Equal(v, b1.Bytes()))
	b1.Release()
	b2, err := d.GetBuffer(ctx, "k") // miss, admitted: published
	require.NoError(t, err)
	require.True(t, b2.Shared())
	b2.Release()
	b3, err := d.GetBuffer(ctx, "k") // hit
	require.NoError(t, err)
	require.True(t, b3.Shared())
	require.True(t, bytes.Equal(v, b3.Bytes()))
	st := s.Stats()
	assert.EqualValues(t, 1, st.Hits)
	assert.EqualValues(t, 1, st.Admissions)
	assert.EqualValues(t, 1, st.Dummies)
	require.Eventually(t, func() bool { return s.hot.held() == 1 }, 10*time.Second, 5*time.Millisecond)
	b3.Release()
	require.Eventually(t, func() bool { return s.hot.held() == 0 }, 10*time.Second, 5*time.Millisecond)
	bs, errs := d.BatchGetBuffer(ctx, []string{"k", "none"})
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], errcode.ErrObjectNotFound)
	require.True(t, bytes.Equal(v, bs[0].Bytes()))
	bs[0].Release()
}

// TestOverwriteInvalidates: a remove and a new put through the real
// client's server never leave the old bytes visible, even while a dummy
// still holds a view of them (that view keeps the old bytes intact).
func TestOverwriteInvalidates(t *testing.T) {
	s, _, _ := serve(t, shmCache())
	d := dial(t, s)
	ctx := tctx(t)
	old, cur := val(4096, 1), val(4096, 2)
	require.NoError(t, d.Put(ctx, "k", old, store.ReplicateConfig{}))
	for range 3 {
		b, err := d.GetBuffer(ctx, "k")
		require.NoError(t, err)
		b.Release()
	}
	held, err := d.GetBuffer(ctx, "k")
	require.NoError(t, err)
	require.NoError(t, d.Remove(ctx, "k", true))
	_, err = d.Get(ctx, "k")
	require.ErrorIs(t, err, errcode.ErrObjectNotFound, "a removed value served from the cache")
	require.NoError(t, d.Put(ctx, "k", cur, store.ReplicateConfig{}))
	got, err := d.Get(ctx, "k")
	require.NoError(t, err)
	require.Equal(t, cur, got)
	require.Equal(t, old, held.Bytes(), "a held view changed under its reader")
	held.Release()
}

// TestDirtyReadFillAfterRemove is the reference's dirty read: a fill
// that read the value, then a remove, then the fill publishing; the
// cache must not bring the removed value back.
func TestDirtyReadFillAfterRemove(t *testing.T) {
	s, _, tm := serve(t, Options{CacheSize: 4 << 20, BlockSize: 1 << 20}) // private cache: async fills
	d := dial(t, s)
	ctx := tctx(t)
	other := newRealClient(t, tm) // a replica off the real client: a private cache keeps those
	require.NoError(t, other.Put(ctx, "k", val(1000, 5), store.ReplicateConfig{Preferred: []string{other.SegmentName()}}))
	read, resume := make(chan struct{}), make(chan struct{})
	s.hot.beforePublish = func(string) {
		close(read)
		<-resume
	}
	_, err := d.Get(ctx, "k")
	require.NoError(t, err)
	_, err = d.Get(ctx, "k") // second miss: admitted, queued
	require.NoError(t, err)
	select { // the fill has the old bytes
	case <-read:
	case <-time.After(30 * time.Second):
		t.Fatal("no fill")
	}
	require.NoError(t, d.Remove(ctx, "k", true))
	close(resume)
	require.Eventually(t, func() bool { return s.hot.startFill("probe") != 0 }, 10*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return s.hot.held() == 0 }, 10*time.Second, time.Millisecond)
	_, err = d.Get(ctx, "k")
	require.ErrorIs(t, err, errcode.ErrObjectNotFound, "the removed value came back from the cache")
	require.Nil(t, s.hot.acquire("k"))
}

// TestRegisteredPool: values in a pool the dummy registered are put and
// read in place; an out-of-bounds span is refused.
func TestRegisteredPool(t *testing.T) {
	s, c, _ := serve(t, shmCache())
	d := dial(t, s)
	ctx := tctx(t)
	p, err := mempool.New(mempool.Options{Size: 4 << 20, Name: "dummy-test"})
	require.NoError(t, err)
	defer p.Close()
	require.NoError(t, d.RegisterPool(ctx, p))
	src, err := p.Alloc(256 << 10)
	require.NoError(t, err)
	copy(src, val(len(src), 3))
	staged := c.Stats().StagedBytes
	require.NoError(t, d.PutFrom(ctx, "r", src, store.ReplicateConfig{}))
	dst, err := p.Alloc(256 << 10)
	require.NoError(t, err)
	n, err := d.GetInto(ctx, "r", dst)
	require.NoError(t, err)
	require.Equal(t, len(src), n)
	require.True(t, bytes.Equal(src, dst))
	require.Equal(t, staged, c.Stats().StagedBytes, "a registered pool's values went through staging")

	// A forged span past the region's end.
	dc, err := d.conn(ctx)
	require.NoError(t, err)
	e := newEnc(opGet, 0, dc.tok)
	e.str("r")
	e.u8(refRegion)
	e.u32(dc.pools[p])
	e.u64(uint64(p.Size()) - 10)
	e.u64(1 << 20)
	_, err = dc.call(ctx, e, -1)
	require.ErrorIs(t, err, errcode.ErrInvalidParams)
	require.ErrorContains(t, err, "outside buffer")
	// The session survives a refused request.
	_, err = d.Get(ctx, "r")
	require.NoError(t, err)

	require.NoError(t, d.UnregisterPool(ctx, p))
	require.ErrorIs(t, d.UnregisterPool(ctx, p), errcode.ErrInvalidParams)
	n, err = d.GetInto(ctx, "r", dst) // now carried inline
	require.NoError(t, err)
	require.Equal(t, len(src), n)
}

// TestSocketInUse: a second server does not take over a live socket; a
// dead server's socket file is replaced.
func TestSocketInUse(t *testing.T) {
	s, c, _ := serve(t, Options{})
	_, err := Serve(c, s.Path(), Options{})
	require.ErrorContains(t, err, "in use")
	path := t.TempDir() + "/stale.sock"
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	ln.Close()
	s2, err := Serve(c, path, Options{})
	require.NoError(t, err)
	require.NoError(t, s2.Close())
}

// rawHello registers on a plain connection and returns it with the token.
func rawHello(t *testing.T, s *Server) (*fconn, token) {
	t.Helper()
	c, err := net.Dial("unix", s.Path())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	f := newFconn(c.(*net.UnixConn))
	t.Cleanup(f.closeFDs)
	e := newEnc(opHello, 1, token{})
	e.u32(protoVersion)
	require.NoError(t, f.write(e.frame(stOK), -1))
	h, body, err := f.read(10*time.Second, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, stOK, h.status)
	var tok token
	copy(tok[:], body[:16])
	return f, tok
}

// TestForgedToken: a request with another token is refused and the
// connection closed.
func TestForgedToken(t *testing.T) {
	s, _, _ := serve(t, shmCache())
	f, tok := rawHello(t, s)
	tok[3] ^= 0xff
	e := newEnc(opExist, 7, tok)
	e.str("k")
	require.NoError(t, f.write(e.frame(stOK), -1))
	h, body, err := f.read(10*time.Second, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, stErr, h.status)
	d := dec{b: body}
	require.ErrorIs(t, d.errReply(), errcode.ErrIllegalClient)
	_, _, err = f.read(10*time.Second, 10*time.Second)
	require.Error(t, err, "connection still open after a forged token")
	require.EqualValues(t, 1, s.Stats().BadTokens)
}

// TestSilentDummyExpires: a dummy that stops pinging is dropped with
// its references.
func TestSilentDummyExpires(t *testing.T) {
	s, _, _ := serve(t, Options{CacheSize: 4 << 20, BlockSize: 1 << 20, Shm: true, PingInterval: 50 * time.Millisecond, ExpireAfter: 300 * time.Millisecond})
	d := dial(t, s)
	ctx := tctx(t)
	require.NoError(t, d.Put(ctx, "k", val(1000, 1), store.ReplicateConfig{}))
	f, tok := rawHello(t, s)
	e := newEnc(opGetBuffer, 9, tok)
	e.str("k")
	require.NoError(t, f.write(e.frame(stOK), -1))
	h, _, err := f.read(10*time.Second, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, stOK, h.status)
	require.Equal(t, 1, s.hot.held())
	// d keeps pinging and stays; the raw one is silent and goes.
	require.Eventually(t, func() bool { return s.Stats().Expired == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return s.hot.held() == 0 }, 10*time.Second, 10*time.Millisecond)
	require.Equal(t, 1, s.Dummies())
	ok, err := d.IsExist(ctx, "k")
	require.NoError(t, err)
	require.True(t, ok)
}

// TestMalformedFrames: oversized frames and batches are refused before
// allocation; the connection is closed.
func TestMalformedFrames(t *testing.T) {
	s, _, _ := serve(t, Options{})
	for _, tc := range []struct {
		name string
		mod  func(b []byte) []byte
	}{
		{"huge frame", func(b []byte) []byte { b[0], b[1], b[2], b[3] = 0xff, 0xff, 0xff, 0x7f; return b[:hdrLen] }},
		{"unknown op", func(b []byte) []byte { b[4] = 200; return b }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, tok := rawHello(t, s)
			e := newEnc(opPing, 1, tok)
			require.NoError(t, f.write(tc.mod(e.frame(stOK)), -1))
			_, _, err := f.read(10*time.Second, 10*time.Second)
			require.Error(t, err)
		})
	}
	f, tok := rawHello(t, s)
	e := newEnc(opBatchExist, 1, tok)
	e.u32(maxBatch + 1)
	require.NoError(t, f.write(e.frame(stOK), -1))
	h, body, err := f.read(10*time.Second, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, stErr, h.status)
	d := dec{b: body}
	require.ErrorContains(t, d.errReply(), "batch of")
}

// TestConcurrentDummies: several dummies put and read at once.
func TestConcurrentDummies(t *testing.T) {
	s, _, _ := serve(t, shmCache())
	ctx := tctx(t)
	errc := make(chan error, 3)
	for w := range 3 {
		d := dial(t, s)
		go func() {
			errc <- func() error {
				for i := range 20 {
					k := fmt.Sprintf("w%d-%d", w, i)
					v := val(8192+i, byte(w))
					if err := d.Put(ctx, k, v, store.ReplicateConfig{}); err != nil {
						return err
					}
					for range 3 {
						b, err := d.GetBuffer(ctx, k)
						if err != nil {
							return err
						}
						if !bytes.Equal(b.Bytes(), v) {
							return fmt.Errorf("%s: wrong bytes", k)
						}
						b.Release()
					}
				}
				return nil
			}()
		}()
	}
	for range 3 {
		require.NoError(t, <-errc)
	}
	require.Eventually(t, func() bool { return s.hot.held() == 0 }, 10*time.Second, 5*time.Millisecond)
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// TestNoLeaks: dummies that register pools, hold views and go away leave
// no descriptor or mapping behind in either side.
func TestNoLeaks(t *testing.T) {
	s, _, _ := serve(t, shmCache())
	ctx := tctx(t)
	d0 := dial(t, s)
	require.NoError(t, d0.Put(ctx, "k", val(5000, 1), store.ReplicateConfig{}))
	before := openFDs(t)
	for range 5 {
		d, err := Dial(ctx, s.Path())
		require.NoError(t, err)
		p, err := mempool.New(mempool.Options{Size: 1 << 20, Name: "leak"})
		require.NoError(t, err)
		require.NoError(t, d.RegisterPool(ctx, p))
		b, err := d.GetBuffer(ctx, "k")
		require.NoError(t, err)
		require.NoError(t, d.Close())
		require.Equal(t, val(5000, 1), b.Bytes()) // still mapped until released
		b.Release()
		require.NoError(t, p.Close())
	}
	require.Eventually(t, func() bool { return s.Dummies() == 1 && openFDs(t) == before && s.hot.held() == 0 },
		10*time.Second, 5*time.Millisecond, "fds %d, before %d", openFDs(t), before)
}

// TestPrivateCacheSkipsLocal: without shm, values in the real client's
// own segment are not cached (reading them is already a local copy).
func TestPrivateCacheSkipsLocal(t *testing.T) {
	s, c, _ := serve(t, Options{CacheSize: 4 << 20, BlockSize: 1 << 20})
	d := dial(t, s)
	ctx := tctx(t)
	require.NoError(t, d.Put(ctx, "k", val(100, 1), store.ReplicateConfig{Preferred: []string{c.SegmentName()}}))
	b, err := s.fill(ctx, "k", s.hot.startFill("k"))
	require.ErrorIs(t, err, errLocal)
	require.Nil(t, b)
	require.EqualValues(t, 0, s.Stats().Admissions)
	require.NotZero(t, s.hot.startFill("k"), "the cancelled fill kept its token")
}

// TestCacheNeverReusesHeldBlock: eviction skips blocks with references.
func TestCacheNeverReusesHeldBlock(t *testing.T) {
	c, err := newCache(2<<16, 1<<16, 1)
	require.NoError(t, err)
	defer c.close()
	loc := store.Location{Size: 10, Replicas: []store.ReplicaLoc{{Segment: "s", Addr: 1}}, Deadline: time.Now().Add(time.Hour)}
	for _, k := range []string{"a", "b"} {
		b := c.take()
		require.NotNil(t, b)
		require.True(t, c.publish(k, c.startFill(k), b, 10, loc))
		c.release(b)
	}
	held := c.acquire("b") // "a" is now the least recently used
	held2 := c.acquire("a")
	c.release(held2) // ... and "a" is most recent, but free of references
	got := c.take()
	require.NotNil(t, got)
	require.False(t, held == got, "a held block was reused")
	require.Nil(t, c.take(), "every block is held: nothing to take")
	require.NotNil(t, c.acquire("b"))
	require.Nil(t, c.acquire("a"))
	require.EqualValues(t, 1, c.evictions.Load())
}

// TestFrameLimitOnDummy: a request over the frame limit is refused by
// the dummy before it is sent; the connection stays up.
func TestFrameLimitOnDummy(t *testing.T) {
	s, _, _ := serve(t, Options{})
	d := dial(t, s)
	ctx := tctx(t)
	v := make([]byte, 16<<20)
	errs := d.BatchPut(ctx, []string{"a", "b", "c", "d", "e"}, [][]byte{v, v, v, v, v}, store.ReplicateConfig{})
	for _, err := range errs {
		require.ErrorIs(t, err, errcode.ErrInvalidParams)
	}
	require.NoError(t, d.Ping(ctx))
}

// TestLocateReadAt: the split Get the server uses; a read past the
// lease is LEASE_EXPIRED.
func TestLocateReadAt(t *testing.T) {
	_, c, _ := serve(t, Options{})
	ctx := tctx(t)
	v := val(3000, 4)
	require.NoError(t, c.Put(ctx, "k", v, store.ReplicateConfig{}))
	loc, err := c.Locate(ctx, "k")
	require.NoError(t, err)
	require.EqualValues(t, len(v), loc.Size)
	require.NotEmpty(t, loc.Replicas)
	dst := make([]byte, len(v))
	require.NoError(t, c.ReadAt(ctx, "k", loc, dst))
	require.Equal(t, v, dst)
	require.ErrorIs(t, c.ReadAt(ctx, "k", loc, dst[:10]), errcode.ErrBufferOverflow)
	loc.Deadline = time.Now().Add(-time.Second)
	require.ErrorIs(t, c.ReadAt(ctx, "k", loc, dst), errcode.ErrLeaseExpired)
}
