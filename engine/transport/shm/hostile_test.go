package shm_test

import (
	"fmt"
	"math"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
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
			f := newFakeTarget(t)
			fd, err := unix.MemfdCreate(fmt.Sprintf("crescent-shm-hostile-%d", os.Getpid()), unix.MFD_CLOEXEC)
			require.NoError(t, err)
			defer unix.Close(fd)
			require.NoError(t, unix.Ftruncate(fd, size))
			p := f.peer("hostile", addr, size)
			accepted := make(chan bool, 1)
			go func() { accepted <- a.tr.Accepts(p, addr, 1) }()
			c := f.accept(t)
			m, _ := rawRecv(t, c)
			require.NotNil(t, m)
			require.Equal(t, "list", m.Op)
			rawSend(t, c, []byte(fmt.Sprintf(`{"op":"regions","version":1,"id":%d,"regions":[{"addr":%d,"len":%d,"fd":0,"off":%d}]}`, m.ID, tc.addr, tc.len, tc.off)), []int{fd})
			require.False(t, <-accepted, "a region beyond its memfd was accepted")
			a.tr.ClosePeer("hostile")
		})
	}
}
