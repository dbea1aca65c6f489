package shm_test

import (
	"fmt"
	"log/slog"
	"math"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/crescent-kv/crescent/engine/transport/shm"
	"github.com/crescent-kv/crescent/internal/syncbuf"
	"github.com/crescent-kv/crescent/internal/testutil"
)

// TestHostileRegion: a target lists a region whose offset and length do
// not fit its memfd (a length that is negative as int64, an offset past
// the end). The peer refuses the listing instead of mapping or slicing
// past the mapping (a panic before the bounds were checked first).
func TestHostileRegion(t *testing.T) {
	const size = 1 << 20
	const addr = 0x7e0000000000
	cases := []struct {
		name string
		addr uint64
		len  uint64
		off  int64
	}{
		// int64(len) = -50: the rounded end lands one page past start.
		{"length negative as int64", 1, math.MaxUint64 - 49, 4096 + 100},
		{"offset past the end", addr, 4096, size + 4096},
		{"length past the end", addr, size, 4096},
		{"offset negative", addr, 4096, -4096},
		{"offset near max", addr, 4096, math.MaxInt64 - 100},
	}
	a := newNode(t, "a", 1<<20, nodeOpts{})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fd := memfd(t, size)
			defer unix.Close(fd)
			require.False(t, listOne(t, a, "hostile", addr, size, tc.addr, tc.len, tc.off, fd), "a region beyond its memfd was accepted")
		})
	}
}

// TestHostileListing: a target floods a listing with "more" packets and
// fds. The peer holds neither without bound: fds no region refers to are
// closed at once, and a listing past the caps (256 distinct memfds,
// 65536 regions) fails with a clear error. Every fd is back
// afterwards. Before, all packets and fds were kept until the last packet
// and then every region mapped.
func TestHostileListing(t *testing.T) {
	const base = 0x7e0000000000
	var logs syncbuf.Buffer
	a := newNode(t, "a", 1<<20, nodeOpts{log: slog.New(slog.NewTextHandler(&logs, nil)), cfg: shm.Config{RevokeTimeout: 30 * time.Second}})

	// start has the fake target take a's list request.
	start := func(t *testing.T, name string) (c *net.UnixConn, id uint64, accepted <-chan bool) {
		f := newFakeTarget(t)
		p := f.peer(name, base, 1<<30)
		ch := make(chan bool, 1)
		go func() { ch <- a.tr.Accepts(p, base, 1) }()
		c = f.accept(t)
		f.ln.Close() // counted fds: only c is left
		m, _ := rawRecv(t, c)
		require.NotNil(t, m)
		require.Equal(t, "list", m.Op)
		return c, m.ID, ch
	}
	// refused checks that the listing failed with err and that the
	// process holds no fd more than before.
	refused := func(t *testing.T, name string, c *net.UnixConn, accepted <-chan bool, err string, before int) {
		require.False(t, <-accepted, "a listing past the caps was accepted")
		assert.Contains(t, logs.String(), err)
		m, fds := rawRecv(t, c)
		closeFDs(fds)
		assert.Nil(t, m, "the peer still listens to a target past the caps")
		a.tr.ClosePeer(name)
		c.Close()
		testutil.Eventually(t, "fds to be back", func() bool { return testutil.CountFDs(t) == before })
	}

	t.Run("fds no region refers to", func(t *testing.T) {
		before := testutil.CountFDs(t)
		fd := memfd(t, 4096)
		c, id, accepted := start(t, "unreferenced")
		held := testutil.CountFDs(t)
		dups := make([]int, 200)
		for i := range dups {
			dups[i] = fd
		}
		for range 20 {
			rawSend(t, c, []byte(fmt.Sprintf(`{"op":"regions","id":%d,"version":1,"more":true}`, id)), dups)
		}
		// The peer answers the revoke after handling every packet before.
		rawSend(t, c, []byte(`{"op":"revoke","id":9,"addr":1,"len":1}`), nil)
		m, fds := rawRecv(t, c)
		closeFDs(fds)
		require.NotNil(t, m)
		require.Equal(t, "revoked", m.Op)
		assert.Equal(t, held, testutil.CountFDs(t), "fds held while the listing is open")

		rawSend(t, c, []byte(fmt.Sprintf(`{"op":"regions","id":%d,"version":1}`, id)), nil)
		// Accepts lists again: nothing there either.
		served := answerLists(c, func(id uint64) string { return fmt.Sprintf(`{"op":"regions","id":%d,"version":1}`, id) })
		require.False(t, <-accepted)
		a.tr.ClosePeer("unreferenced")
		<-served
		c.Close()
		unix.Close(fd)
		testutil.Eventually(t, "fds to be back", func() bool { return testutil.CountFDs(t) == before })
	})

	t.Run("too many memfds", func(t *testing.T) {
		before := testutil.CountFDs(t)
		c, id, accepted := start(t, "memfds")
		// Two packets of 200 valid regions, each in its own memfd.
		for pkt := range 2 {
			var regions []string
			fds := make([]int, 200)
			for i := range fds {
				fds[i] = memfd(t, 4096)
				regions = append(regions, fmt.Sprintf(`{"addr":%d,"len":4096,"fd":%d,"off":0}`, base+(pkt*200+i)*4096, i))
			}
			rawSend(t, c, []byte(fmt.Sprintf(`{"op":"regions","id":%d,"version":1,"more":%t,"regions":[%s]}`,
				id, pkt == 0, strings.Join(regions, ","))), fds)
			closeFDs(fds)
		}
		refused(t, "memfds", c, accepted, "listing with more than 256 memfds", before)
	})

	t.Run("too many regions", func(t *testing.T) {
		before := testutil.CountFDs(t)
		c, id, accepted := start(t, "regions")
		// Only their count matters: no fd, so nothing would be mapped.
		const perPacket, packets = 6000, 1<<16/6000 + 1
		region := `{"len":1}`
		for i := range packets {
			pkt := fmt.Sprintf(`{"op":"regions","id":%d,"version":1,"more":%t,"regions":[%s]}`,
				id, i < packets-1, strings.Repeat(region+",", perPacket-1)+region)
			require.Less(t, len(pkt), 64<<10, "one packet")
			if _, err := c.Write([]byte(pkt)); err != nil {
				break // the peer hung up
			}
		}
		refused(t, "regions", c, accepted, "listing with more than 65536 regions", before)
	})
}

// memfd returns a new memfd of size bytes; the caller closes it.
func memfd(t *testing.T, size int64) int {
	fd, err := unix.MemfdCreate(fmt.Sprintf("crescent-shm-hostile-%d", os.Getpid()), unix.MFD_CLOEXEC)
	require.NoError(t, err)
	require.NoError(t, unix.Ftruncate(fd, size))
	return fd
}

// TestSparseRegionNotPrefaulted: a target listing a 2 GiB region of a
// memfd it never wrote makes the peer map it lazily: the listing
// allocates none of it (prefaulting it would have, in the peer).
func TestSparseRegionNotPrefaulted(t *testing.T) {
	const size = 2 << 30
	const addr = 0x7e0000000000
	a := newNode(t, "a", 1<<20, nodeOpts{})
	fd := memfd(t, size)
	defer unix.Close(fd)
	require.True(t, listOne(t, a, "sparse", addr, size, addr, size, 0, fd), "a sparse region was refused")
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(fd, &st))
	assert.Less(t, st.Blocks*512, int64(64<<20), "the listing faulted in %d bytes of the target's memfd", st.Blocks*512)
}

// listOne has a fake target named name (one buffer [base, +size)) answer
// a's listing with one region of fd, and reports whether a then accepts
// a transfer at base; a forgets the target afterwards.
func listOne(t *testing.T, a *node, name string, base, size, addr, n uint64, off int64, fd int) bool {
	t.Helper()
	f := newFakeTarget(t)
	p := f.peer(name, base, size)
	accepted := make(chan bool, 1)
	go func() { accepted <- a.tr.Accepts(p, base, 1) }()
	c := f.accept(t)
	defer c.Close()
	m, _ := rawRecv(t, c)
	require.NotNil(t, m)
	require.Equal(t, "list", m.Op)
	rawSend(t, c, []byte(fmt.Sprintf(`{"op":"regions","version":1,"id":%d,"regions":[{"addr":%d,"len":%d,"fd":0,"off":%d}]}`, m.ID, addr, n, off)), []int{fd})
	ok := <-accepted
	a.tr.ClosePeer(name)
	return ok
}
