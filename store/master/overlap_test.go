package master

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/store/alloc"
	"github.com/crescent-kv/crescent/store/errcode"
)

// TestMountRefusesOverlap is the silent-corruption sequence: two client
// ids mounting the same engine segment name, base and size would give the
// master two pool segments over the same bytes, and two objects on them.
func TestMountRefusesOverlap(t *testing.T) {
	e := newEnv(t, nil)
	a, b := cl(1), cl(2)
	const base, size = 1 << 30, 1 << 20
	seg := func(id uint64, name string, base, size uint64) alloc.Segment {
		return alloc.Segment{ID: UUID{Hi: 0x5e, Lo: id}, Name: name, Base: base, Size: size, Protocol: "tcp"}
	}
	sa := seg(1, "host:1", base, size)
	require.NoError(t, e.m.MountSegment(a, sa))

	for _, tc := range []struct {
		name string
		c    UUID
		s    alloc.Segment
	}{
		{"same range, another client", b, seg(2, "host:1", base, size)},
		{"same range, same client, new id", a, seg(3, "host:1", base, size)},
		{"overlapping the start", b, seg(4, "host:1", base-4096, 8192)},
		{"overlapping the end", b, seg(5, "host:1", base+size-4096, 8192)},
		{"inside", b, seg(6, "host:1", base+4096, 8192)},
		{"around", b, seg(7, "host:1", base-4096, size+8192)},
	} {
		err := e.m.MountSegment(tc.c, tc.s)
		require.ErrorIs(t, err, errcode.ErrSegmentAlreadyExists, tc.name)
		require.ErrorIs(t, e.m.ReMountSegment(tc.c, []alloc.Segment{tc.s}), errcode.ErrSegmentAlreadyExists, tc.name)
	}
	// Adjacent ranges, and the same range of another engine segment, are
	// other bytes.
	require.NoError(t, e.m.MountSegment(b, seg(8, "host:1", base+size, size)))
	require.NoError(t, e.m.MountSegment(b, seg(9, "host:1", base-size, size)))
	require.NoError(t, e.m.MountSegment(b, seg(10, "host:2", base, size)))
	require.Len(t, e.m.AllSegments(), 4)

	// A remount by the same client of the same segment stays idempotent.
	require.NoError(t, e.m.ReMountSegment(a, []alloc.Segment{sa}))
	require.Len(t, e.m.AllSegments(), 4)

	// Placement never puts two objects on the same bytes of host:1.
	for i := range 40 {
		e.put(cl(uint64(1+i%2)), string(rune('a'+i%26))+string(rune('a'+i/26)), 8<<10, ReplicateConfig{Preferred: []string{"host:1"}})
	}
	checkInvariants(t, e.m)
	type span struct{ lo, hi uint64 }
	var seen []span
	for _, k := range e.m.AllKeys() {
		info, err := e.m.QueryKey(k)
		require.NoError(t, err)
		for _, r := range info.Replicas {
			if r.SegmentName != "host:1" {
				continue
			}
			s := span{r.Addr, r.Addr + alloc.Reserved(r.Size)}
			for _, o := range seen {
				require.False(t, s.lo < o.hi && o.lo < s.hi, "key %q at [%#x,%#x) overlaps [%#x,%#x)", k, s.lo, s.hi, o.lo, o.hi)
			}
			seen = append(seen, s)
		}
	}

	// After the unmount the range is free to mount again, by anyone.
	require.NoError(t, e.m.UnmountSegment(a, sa.ID))
	require.NoError(t, e.m.MountSegment(b, seg(11, "host:1", base, size)))

	// A replayed log reproduces the refusals' outcome.
	standby, err := New(Config{Shards: 3, Clock: e.clk})
	require.NoError(t, err)
	for _, op := range e.log.all() {
		require.NoError(t, standby.Replay(op))
	}
	require.Empty(t, diffState(dumpState(e.m), dumpState(standby)))
}

// TestMountBounded: mounts past MaxSegmentsPerClient or MaxSegments are
// NO_AVAILABLE_HANDLE, through MountSegment and ReMountSegment alike;
// remounting a segment the master has still works, and an unmount makes
// room.
func TestMountBounded(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.MaxSegments, c.MaxSegmentsPerClient = 5, 3 })
	a, b, c := cl(1), cl(2), cl(3)
	seg := func(id uint64) alloc.Segment {
		return alloc.Segment{ID: UUID{Hi: 0x5e, Lo: id}, Name: fmt.Sprintf("host:%d", id), Base: 1 << 30, Size: 1 << 20, Protocol: "tcp"}
	}
	for i := range uint64(3) {
		require.NoError(t, e.m.MountSegment(a, seg(1+i)))
	}
	require.ErrorIs(t, e.m.MountSegment(a, seg(4)), errcode.ErrNoAvailableHandle)
	require.ErrorIs(t, e.m.ReMountSegment(a, []alloc.Segment{seg(1), seg(4)}), errcode.ErrNoAvailableHandle)
	require.NoError(t, e.m.ReMountSegment(a, []alloc.Segment{seg(1), seg(2), seg(3)}))
	require.ErrorIs(t, e.m.MountSegment(a, seg(1)), errcode.ErrSegmentAlreadyExists, "a segment the master has is no new mount")

	require.NoError(t, e.m.MountSegment(b, seg(5)))
	require.NoError(t, e.m.MountSegment(b, seg(6)))
	err := e.m.MountSegment(c, seg(7))
	require.ErrorIs(t, err, errcode.ErrNoAvailableHandle)
	require.ErrorContains(t, err, "at most 5")
	require.ErrorIs(t, e.m.ReMountSegment(c, []alloc.Segment{seg(7)}), errcode.ErrNoAvailableHandle)
	require.Len(t, e.m.AllSegments(), 5)

	require.NoError(t, e.m.UnmountSegment(b, seg(6).ID))
	require.NoError(t, e.m.MountSegment(c, seg(7)))
	checkInvariants(t, e.m)
}
