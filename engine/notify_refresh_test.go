package engine_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/engine"
	"github.com/crescent-kv/crescent/engine/mempool"
	"github.com/crescent-kv/crescent/engine/transport"
)

// Notify delivers a message to an opened segment with no batch.
func TestNotifyWithoutBatch(t *testing.T) {
	a := newNode(t, 1<<20, engine.Config{Protocols: []string{"tcp"}})
	b := newNode(t, 1<<20, engine.Config{Protocols: []string{"tcp"}})
	seg, err := a.e.OpenSegment(context.Background(), b.e.Name())
	require.NoError(t, err)
	require.NoError(t, a.e.Notify(seg, "kv ready"))
	got := b.e.Notifications()
	require.Len(t, got, 1)
	assert.Equal(t, engine.Notification{From: a.e.Name(), Msg: "kv ready"}, got[0])

	assert.ErrorIs(t, a.e.Notify(seg+12345, "x"), engine.ErrInvalidSegment)
	require.NoError(t, a.e.CloseSegment(seg))
	assert.ErrorIs(t, a.e.Notify(seg, "x"), engine.ErrInvalidSegment)
}

// RefreshSegments makes every opened segment's cached descriptor current.
func TestRefreshSegments(t *testing.T) {
	a := newNode(t, 1<<20, engine.Config{Protocols: []string{"tcp"}})
	b := newNode(t, 1<<20, engine.Config{Protocols: []string{"tcp"}})
	c := newNode(t, 1<<20, engine.Config{Protocols: []string{"tcp"}})
	ctx := context.Background()
	sb, err := a.e.OpenSegment(ctx, b.e.Name())
	require.NoError(t, err)
	sc, err := a.e.OpenSegment(ctx, c.e.Name())
	require.NoError(t, err)

	// b and c register more memory after a opened them.
	var extra []uint64
	for _, n := range []*node{b, c} {
		p, err := mempool.New(mempool.Options{Size: 1 << 20, SlabSize: 1 << 20})
		require.NoError(t, err)
		t.Cleanup(func() { p.Close() })
		mem, err := p.Alloc(1 << 20)
		require.NoError(t, err)
		require.NoError(t, n.e.RegisterMemory(mem, ""))
		t.Cleanup(func() { n.e.UnregisterMemory(context.Background(), mem) })
		extra = append(extra, transport.AddrOf(mem))
	}
	has := func(id engine.SegmentID, addr uint64) bool {
		d, err := a.e.SegmentDesc(id)
		require.NoError(t, err)
		for _, buf := range d.Buffers {
			if buf.Addr == addr {
				return true
			}
		}
		return false
	}
	require.False(t, has(sb, extra[0]), "the cached descriptor is not refreshed by itself this soon")
	require.NoError(t, a.e.RefreshSegments(ctx))
	assert.True(t, has(sb, extra[0]))
	assert.True(t, has(sc, extra[1]))

	// A peer gone is reported, the others still refreshed.
	require.NoError(t, c.e.Close())
	err = a.e.RefreshSegments(ctx)
	require.Error(t, err)
	assert.False(t, errors.Is(err, engine.ErrClosed))

	require.NoError(t, a.e.Close())
	assert.ErrorIs(t, a.e.RefreshSegments(ctx), engine.ErrClosed)
}
