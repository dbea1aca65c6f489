package snapshot

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/ha/internal/vfs/errorfs"
)

func publishN(t *testing.T, c Catalog, pl Payloads, seqs ...uint64) {
	t.Helper()
	for _, seq := range seqs {
		writePayload(t, pl, IDFor(seq, 1), []byte{byte(seq)})
		require.NoError(t, c.Publish(context.Background(), testMeta(seq, 1)))
	}
}

// Prune deletes the catalog entry before the payload: a payload delete
// that fails leaves an orphan body, never an entry without one, and
// CleanOrphans removes the orphan later.
func TestPruneFailureLeavesOnlyOrphans(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	dir := t.TempDir()
	fs := errorfs.New(nil)
	pl, err := newLocalPayloads(dir, fs)
	require.NoError(t, err)
	c := openLocalCatalog(t, dir)
	publishN(t, c, pl, 1, 2, 3, 4)

	fs.FailNth(errorfs.OpRemove, 2, false, nil) // the second payload
	deleted, err := Prune(ctx, c, pl, 1)
	require.ErrorIs(t, err, errorfs.ErrInjected)
	assert.Equal(t, []string{IDFor(1, 1)}, deleted)
	ms, err := c.List(ctx)
	require.NoError(t, err)
	for _, m := range ms {
		readPayload(t, pl, m.ID) // every listed snapshot has its body
	}
	assert.Len(t, ms, 2, "3 and 4 left in the catalog")
	ids, err := pl.IDs(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{IDFor(2, 1), IDFor(3, 1), IDFor(4, 1)}, ids, "2 is an orphan")

	orphans, err := CleanOrphans(ctx, c, pl)
	require.NoError(t, err)
	assert.Equal(t, []string{IDFor(2, 1)}, orphans)
	deleted, err = Prune(ctx, c, pl, 1)
	require.NoError(t, err)
	assert.Equal(t, []string{IDFor(3, 1)}, deleted)
	ids, err = pl.IDs(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{IDFor(4, 1)}, ids)
}

// A catalog delete that fails stops Prune before the payload goes.
func TestPruneCatalogFailureKeepsPayload(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	fs := errorfs.New(nil)
	c, err := newLocalCatalog(t.TempDir(), fs)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	pl, err := NewLocalPayloads(t.TempDir())
	require.NoError(t, err)
	publishN(t, c, pl, 1, 2)
	fs.FailNth(errorfs.OpRemove, 1, false, nil)
	deleted, err := Prune(ctx, c, pl, 1)
	require.ErrorIs(t, err, errorfs.ErrInjected)
	assert.Empty(t, deleted)
	assert.Equal(t, []byte{1}, readPayload(t, pl, IDFor(1, 1)))
}

func TestCleanOrphans(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	dir := t.TempDir()
	pl, err := NewLocalPayloads(dir)
	require.NoError(t, err)
	c := openLocalCatalog(t, dir)

	writePayload(t, pl, IDFor(1, 1), nil)
	deleted, err := CleanOrphans(ctx, c, pl)
	require.NoError(t, err)
	assert.Empty(t, deleted, "nothing published: any body may be on its way")

	publishN(t, c, pl, 5, 9)
	writePayload(t, pl, IDFor(7, 1), nil)  // committed, never published
	writePayload(t, pl, IDFor(9, 0), nil)  // same seq, lower term
	writePayload(t, pl, IDFor(12, 1), nil) // above latest: maybe about to be published
	deleted, err = CleanOrphans(ctx, c, pl)
	require.NoError(t, err)
	assert.Equal(t, []string{IDFor(1, 1), IDFor(7, 1), IDFor(9, 0)}, deleted)
	ids, err := pl.IDs(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{IDFor(5, 1), IDFor(9, 1), IDFor(12, 1)}, ids)

	// A catalog it cannot read deletes nothing.
	require.NoError(t, c.Close())
	_, err = CleanOrphans(ctx, c, pl)
	require.ErrorIs(t, err, ErrClosed)
	ids, err = pl.IDs(ctx)
	require.NoError(t, err)
	assert.Len(t, ids, 3)
}
