package transport

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/crescent-kv/crescent/internal/testutil"
)

// memfdRegion adds a 64 KiB memfd-backed region; the test's own memfd
// descriptor is closed at once, so the registry's duplicate is the only
// one left.
func memfdRegion(t *testing.T, g *Registry) ([]byte, *Region) {
	t.Helper()
	const size = 64 << 10
	fd, err := unix.MemfdCreate("crescent-registry-test", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	require.NoError(t, unix.Ftruncate(fd, size))
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Munmap(mem) })
	r, err := g.Add(mem, "cpu:0", fd, 0, size)
	unix.Close(fd)
	require.NoError(t, err)
	return mem, r
}

func endedCtx() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// TestRegistryBusyRemoveClosesFdWithLastUser: a Remove that times out
// leaves the region draining, with its memfd open only until the last
// user leaves.
func TestRegistryBusyRemoveClosesFdWithLastUser(t *testing.T) {
	g := NewRegistry()
	before := testutil.CountFDs(t)
	mem, r := memfdRegion(t, g)
	require.Equal(t, before+1, testutil.CountFDs(t))
	l, err := g.Acquire(AddrOf(mem), 16)
	require.NoError(t, err)
	v := g.Version()
	_, err = g.Remove(endedCtx(), AddrOf(mem))
	require.ErrorIs(t, err, ErrBufferBusy)
	require.Greater(t, g.Version(), v, "a busy remove must change the table (and so the descriptor)")
	_, ok := g.Find(AddrOf(mem), 1)
	require.False(t, ok, "a draining region is still offered")
	require.Equal(t, before+1, testutil.CountFDs(t), "fd closed while a user still holds the region")
	l.Release()
	require.Equal(t, before, testutil.CountFDs(t), "memfd kept open after the last user left")
	select {
	case <-r.Idle():
	default:
		t.Fatal("Idle not closed after the last user left")
	}
}

// TestRegistryBusyRemoveRetry: a retried Remove finds a draining region
// (busy again while used, done once unused) instead of ErrNotRegistered.
func TestRegistryBusyRemoveRetry(t *testing.T) {
	g := NewRegistry()
	mem, _ := memfdRegion(t, g)
	l, err := g.Acquire(AddrOf(mem), 16)
	require.NoError(t, err)
	_, err = g.Remove(endedCtx(), AddrOf(mem))
	require.ErrorIs(t, err, ErrBufferBusy)
	_, err = g.Remove(endedCtx(), AddrOf(mem))
	require.ErrorIs(t, err, ErrBufferBusy, "retry while still in use")
	r, draining := g.Lookup(AddrOf(mem))
	require.True(t, draining)
	require.NotNil(t, r)

	done := make(chan error, 1)
	go func() {
		_, err := g.Remove(context.Background(), AddrOf(mem))
		done <- err
	}()
	l.Release()
	require.NoError(t, <-done, "retry after the last user left")
	_, err = g.Remove(context.Background(), AddrOf(mem))
	require.ErrorIs(t, err, ErrNotRegistered, "a confirmed removal is forgotten")
	_, draining = g.Lookup(AddrOf(mem))
	require.False(t, draining)
}

// TestRegistryRemoveEndedCtxNoUsers: with no users an ended ctx does not
// matter; it must succeed every time, not half of them.
func TestRegistryRemoveEndedCtxNoUsers(t *testing.T) {
	g := NewRegistry()
	mem := make([]byte, 4096)
	ctx := endedCtx()
	for i := 0; i < 500; i++ {
		_, err := g.Add(mem, "", -1, 0, 0)
		require.NoError(t, err)
		_, err = g.Remove(ctx, AddrOf(mem))
		require.NoError(t, err, "round %d", i)
	}
}

// TestRegistryCloseClosesDraining: Close drops the memfds of draining
// regions too.
func TestRegistryCloseClosesDraining(t *testing.T) {
	g := NewRegistry()
	before := testutil.CountFDs(t)
	mem, _ := memfdRegion(t, g)
	l, err := g.Acquire(AddrOf(mem), 16)
	require.NoError(t, err)
	defer l.Release()
	_, err = g.Remove(endedCtx(), AddrOf(mem))
	require.ErrorIs(t, err, ErrBufferBusy)
	g.Close()
	require.Equal(t, before, testutil.CountFDs(t))
}

// TestRegistryAddOverDraining: memory still used since its removal cannot
// be registered again; once drained it can.
func TestRegistryAddOverDraining(t *testing.T) {
	g := NewRegistry()
	mem := make([]byte, 4096)
	_, err := g.Add(mem, "", -1, 0, 0)
	require.NoError(t, err)
	l, err := g.Acquire(AddrOf(mem), 16)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	_, err = g.Remove(ctx, AddrOf(mem))
	require.ErrorIs(t, err, ErrBufferBusy)
	_, err = g.Add(mem[100:200], "", -1, 0, 0)
	require.ErrorIs(t, err, ErrAlreadyExists)
	l.Release()
	_, err = g.Add(mem, "", -1, 0, 0)
	require.NoError(t, err)
}
