package snapshot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/ha/internal/vfs"
	"github.com/crescent-kv/crescent/ha/internal/vfs/errorfs"
)

// catalogContract runs the behaviour every Catalog shares; open returns
// a fresh, empty catalog (closed by the test's cleanup).
func catalogContract(t *testing.T, open func(t *testing.T) Catalog) {
	ctx := context.Background()
	ids := func(t *testing.T, c Catalog) []string {
		t.Helper()
		ms, err := c.List(ctx)
		require.NoError(t, err)
		var s []string
		for _, m := range ms {
			s = append(s, m.ID)
		}
		return s
	}
	latest := func(t *testing.T, c Catalog) string {
		t.Helper()
		m, err := c.Latest(ctx)
		require.NoError(t, err)
		return m.ID
	}

	t.Run("Empty", func(t *testing.T) {
		c := open(t)
		_, err := c.Latest(ctx)
		require.ErrorIs(t, err, ErrNoSnapshot)
		ms, err := c.List(ctx)
		require.NoError(t, err)
		assert.Empty(t, ms)
		require.NoError(t, c.Delete(ctx, IDFor(1, 1)), "deleting an absent id")
	})

	t.Run("PublishLatestList", func(t *testing.T) {
		c := open(t)
		for _, seq := range []uint64{50, 10, 90, 1000, 200} {
			require.NoError(t, c.Publish(ctx, testMeta(seq, 2)))
		}
		m, err := c.Latest(ctx)
		require.NoError(t, err)
		assert.Equal(t, testMeta(1000, 2), m, "the meta comes back whole")
		ms, err := c.List(ctx)
		require.NoError(t, err)
		want := []Meta{testMeta(10, 2), testMeta(50, 2), testMeta(90, 2), testMeta(200, 2), testMeta(1000, 2)}
		assert.Equal(t, want, ms, "ascending seq")
	})

	t.Run("LowerSeqDoesNotMoveLatest", func(t *testing.T) {
		c := open(t)
		require.NoError(t, c.Publish(ctx, testMeta(10, 1)))
		require.NoError(t, c.Publish(ctx, testMeta(3, 1)))
		assert.Equal(t, IDFor(10, 1), latest(t, c))
		require.NoError(t, c.Publish(ctx, testMeta(10, 3)), "same seq, higher term")
		assert.Equal(t, IDFor(10, 3), latest(t, c))
		require.NoError(t, c.Publish(ctx, testMeta(10, 2)), "same seq, lower term")
		assert.Equal(t, IDFor(10, 3), latest(t, c))
		assert.Equal(t, []string{IDFor(3, 1), IDFor(10, 1), IDFor(10, 2), IDFor(10, 3)}, ids(t, c))
	})

	t.Run("HugeSeqsKeepOrder", func(t *testing.T) {
		// Above 2^53 a float64 score cannot tell neighbours apart.
		c := open(t)
		base := uint64(1) << 60
		for _, d := range []uint64{3, 1, 2} {
			require.NoError(t, c.Publish(ctx, testMeta(base+d, 1)))
		}
		assert.Equal(t, IDFor(base+3, 1), latest(t, c))
		assert.Equal(t, []string{IDFor(base+1, 1), IDFor(base+2, 1), IDFor(base+3, 1)}, ids(t, c))
		require.NoError(t, c.Delete(ctx, IDFor(base+3, 1)))
		assert.Equal(t, IDFor(base+2, 1), latest(t, c))
	})

	t.Run("RepublishIsIdempotent", func(t *testing.T) {
		c := open(t)
		require.NoError(t, c.Publish(ctx, testMeta(5, 1)))
		require.NoError(t, c.Publish(ctx, testMeta(7, 1)))
		require.NoError(t, c.Publish(ctx, testMeta(5, 1)), "a retry of the same meta")
		other := testMeta(5, 1)
		other.Size++
		require.ErrorIs(t, c.Publish(ctx, other), ErrExists)
		assert.Equal(t, IDFor(7, 1), latest(t, c))
		ms, err := c.List(ctx)
		require.NoError(t, err)
		assert.Equal(t, []Meta{testMeta(5, 1), testMeta(7, 1)}, ms)
	})

	t.Run("DeleteMovesLatest", func(t *testing.T) {
		c := open(t)
		for _, seq := range []uint64{1, 2, 3} {
			require.NoError(t, c.Publish(ctx, testMeta(seq, 1)))
		}
		require.NoError(t, c.Delete(ctx, IDFor(3, 1)))
		assert.Equal(t, IDFor(2, 1), latest(t, c))
		require.NoError(t, c.Delete(ctx, IDFor(1, 1)), "an older one")
		assert.Equal(t, IDFor(2, 1), latest(t, c))
		require.NoError(t, c.Delete(ctx, IDFor(9, 1)), "an absent one")
		assert.Equal(t, []string{IDFor(2, 1)}, ids(t, c))
		require.NoError(t, c.Delete(ctx, IDFor(2, 1)))
		_, err := c.Latest(ctx)
		require.ErrorIs(t, err, ErrNoSnapshot, "all deleted: empty again")
		require.NoError(t, c.Publish(ctx, testMeta(1, 1)), "an old seq after the catalog emptied")
		assert.Equal(t, IDFor(1, 1), latest(t, c))
	})

	t.Run("BadInput", func(t *testing.T) {
		c := open(t)
		m := testMeta(4, 1)
		m.Seq = 5
		require.ErrorIs(t, c.Publish(ctx, m), ErrBadID, "id does not name seq/term")
		m = testMeta(4, 1)
		m.ID = "../../x"
		require.ErrorIs(t, c.Publish(ctx, m), ErrBadID)
		m = testMeta(4, 1)
		m.Size = -1
		require.Error(t, c.Publish(ctx, m))
		m = testMeta(4, 1)
		m.Created = m.Created.AddDate(20000, 0, 0)
		require.Error(t, c.Publish(ctx, m), "a year JSON cannot hold")
		require.ErrorIs(t, c.Delete(ctx, "../LATEST"), ErrBadID)
		_, err := c.Latest(ctx)
		require.ErrorIs(t, err, ErrNoSnapshot, "nothing was published")
	})

	t.Run("Concurrent", func(t *testing.T) {
		c := open(t)
		const n = 16
		var wg sync.WaitGroup
		errs := make(chan error, 2*n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs <- c.Publish(ctx, testMeta(uint64(i*7%n+1), 1))
				_, err := c.Latest(ctx)
				errs <- err
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		assert.Equal(t, IDFor(n, 1), latest(t, c))
		assert.Len(t, ids(t, c), n)
	})

	t.Run("Prune", func(t *testing.T) {
		c := open(t)
		pl, err := NewLocalPayloads(t.TempDir())
		require.NoError(t, err)
		for seq := uint64(1); seq <= 5; seq++ {
			writePayload(t, pl, IDFor(seq, 1), []byte{byte(seq)})
			require.NoError(t, c.Publish(ctx, testMeta(seq, 1)))
		}
		_, err = Prune(ctx, c, pl, 0)
		require.Error(t, err, "keep 0")
		deleted, err := Prune(ctx, c, pl, 2)
		require.NoError(t, err)
		assert.Equal(t, []string{IDFor(1, 1), IDFor(2, 1), IDFor(3, 1)}, deleted)
		assert.Equal(t, []string{IDFor(4, 1), IDFor(5, 1)}, ids(t, c))
		assert.Equal(t, IDFor(5, 1), latest(t, c))
		for _, id := range deleted {
			_, err := pl.Open(ctx, id)
			require.ErrorIs(t, err, ErrNotFound)
		}
		assert.Equal(t, []byte{5}, readPayload(t, pl, IDFor(5, 1)))
		deleted, err = Prune(ctx, c, pl, 2)
		require.NoError(t, err)
		assert.Empty(t, deleted)
		deleted, err = Prune(ctx, c, pl, 10)
		require.NoError(t, err)
		assert.Empty(t, deleted)
	})

	t.Run("Closed", func(t *testing.T) {
		c := open(t)
		require.NoError(t, c.Close())
		require.NoError(t, c.Close(), "twice")
		require.ErrorIs(t, c.Publish(ctx, testMeta(1, 1)), ErrClosed)
		_, err := c.Latest(ctx)
		require.ErrorIs(t, err, ErrClosed)
		_, err = c.List(ctx)
		require.ErrorIs(t, err, ErrClosed)
		require.ErrorIs(t, c.Delete(ctx, IDFor(1, 1)), ErrClosed)
	})
}

func openLocalCatalog(t *testing.T, dir string) *LocalCatalog {
	t.Helper()
	c, err := NewLocalCatalog(dir)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

func TestLocalCatalogContract(t *testing.T) {
	noLeaks(t)
	catalogContract(t, func(t *testing.T) Catalog { return openLocalCatalog(t, t.TempDir()) })
}

func TestLocalCatalogLayout(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	dir := t.TempDir()
	c := openLocalCatalog(t, dir)
	require.NoError(t, c.Publish(ctx, testMeta(2, 1)))
	require.NoError(t, c.Publish(ctx, testMeta(1, 1)))
	assert.ElementsMatch(t, []string{".catalog.lock", "LATEST", IDFor(1, 1) + ".meta", IDFor(2, 1) + ".meta"}, names(t, dir))
	b, err := os.ReadFile(filepath.Join(dir, "LATEST"))
	require.NoError(t, err)
	assert.Equal(t, IDFor(2, 1)+"\n", string(b))
	b, err = os.ReadFile(filepath.Join(dir, IDFor(2, 1)+".meta"))
	require.NoError(t, err)
	assert.Equal(t, `{"v":1,"id":"00000000000000000002-00000000000000000001","seq":2,"term":1,`+
		`"created":"2023-11-14T22:13:22.123456789Z","size":20,"checksum":15}`+"\n"+
		string(encodeCRC(b[:len(b)-10])), string(b), "doc.go's format")

	// One process per directory; the payload store may share it.
	_, err = NewLocalCatalog(dir)
	require.ErrorIs(t, err, vfs.ErrLocked)
	pl, err := NewLocalPayloads(dir)
	require.NoError(t, err)
	writePayload(t, pl, IDFor(2, 1), []byte("x"))
	m, err := c.Latest(ctx)
	require.NoError(t, err)
	assert.Equal(t, IDFor(2, 1), m.ID)
	require.NoError(t, c.Close())
	c2 := openLocalCatalog(t, dir)
	ms, err := c2.List(ctx)
	require.NoError(t, err)
	assert.Len(t, ms, 2)
}

// Damage on disk is an error of its own, never ErrNoSnapshot: a master
// must not start empty over a catalog it cannot read.
func TestLocalCatalogCorruption(t *testing.T) {
	ctx := context.Background()
	metaFile := func(dir string, seq uint64) string { return filepath.Join(dir, IDFor(seq, 1)+".meta") }
	for _, c := range []struct {
		name   string
		damage func(t *testing.T, dir string)
		list   bool // List still works
	}{
		{"meta size changed", func(t *testing.T, dir string) {
			b, err := os.ReadFile(metaFile(dir, 2))
			require.NoError(t, err)
			b = bytes.Replace(b, []byte(`"size":20`), []byte(`"size":30`), 1) // valid JSON: only the CRC tells
			require.NoError(t, os.WriteFile(metaFile(dir, 2), b, 0o644))
		}, false},
		{"meta truncated", func(t *testing.T, dir string) {
			require.NoError(t, os.Truncate(metaFile(dir, 2), 7))
		}, false},
		{"meta huge", func(t *testing.T, dir string) {
			require.NoError(t, os.Truncate(metaFile(dir, 2), 1<<30))
		}, false},
		{"meta of another id", func(t *testing.T, dir string) {
			require.NoError(t, os.WriteFile(metaFile(dir, 2), encodeMeta(testMeta(1, 1)), 0o644))
		}, false},
		{"marker names a missing meta", func(t *testing.T, dir string) {
			require.NoError(t, os.Remove(metaFile(dir, 2)))
		}, true},
		{"marker garbage", func(t *testing.T, dir string) {
			require.NoError(t, os.WriteFile(filepath.Join(dir, "LATEST"), []byte("../../etc/passwd\n"), 0o644))
		}, true},
		{"marker empty", func(t *testing.T, dir string) {
			require.NoError(t, os.WriteFile(filepath.Join(dir, "LATEST"), nil, 0o644))
		}, true},
		{"marker huge", func(t *testing.T, dir string) {
			require.NoError(t, os.Truncate(filepath.Join(dir, "LATEST"), 1<<30))
		}, true},
		{"marker gone, metas left", func(t *testing.T, dir string) {
			require.NoError(t, os.Remove(filepath.Join(dir, "LATEST")))
		}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			noLeaks(t)
			dir := t.TempDir()
			cat := openLocalCatalog(t, dir)
			require.NoError(t, cat.Publish(ctx, testMeta(1, 1)))
			require.NoError(t, cat.Publish(ctx, testMeta(2, 1)))
			c.damage(t, dir)
			_, err := cat.Latest(ctx)
			require.Error(t, err)
			assert.False(t, errors.Is(err, ErrNoSnapshot), "%v", err)
			assert.ErrorIs(t, err, ErrCorrupt)
			_, err = cat.List(ctx)
			if c.list {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, ErrCorrupt)
			}
			// Reopening does not paper over it, except a missing LATEST
			// with whole metas: that is a crash inside the first Publish.
			require.NoError(t, cat.Close())
			cat = openLocalCatalog(t, dir)
			m, err := cat.Latest(ctx)
			if c.name == "marker gone, metas left" {
				require.NoError(t, err)
				assert.Equal(t, IDFor(2, 1), m.ID)
				return
			}
			require.ErrorIs(t, err, ErrCorrupt)
		})
	}
}

// A crash inside Publish after the meta is durable but before LATEST
// moved: the reopened catalog moves LATEST to it (the payload was
// committed before Publish), so List and Latest agree.
func TestLocalCatalogReopenRollsLatestForward(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	dir := t.TempDir()
	fs := errorfs.New(nil)
	c, err := newLocalCatalog(dir, fs)
	require.NoError(t, err)
	require.NoError(t, c.Publish(ctx, testMeta(1, 1)))
	fs.FailNth(errorfs.OpRename, 2, false, nil) // the meta's rename passes, LATEST's fails
	require.ErrorIs(t, c.Publish(ctx, testMeta(2, 1)), errorfs.ErrInjected)
	m, err := c.Latest(ctx)
	require.NoError(t, err)
	assert.Equal(t, IDFor(1, 1), m.ID, "LATEST did not move")
	require.NoError(t, c.Close())
	assert.NotContains(t, names(t, dir), ".LATEST.tmp")

	c2 := openLocalCatalog(t, dir)
	m, err = c2.Latest(ctx)
	require.NoError(t, err)
	assert.Equal(t, testMeta(2, 1), m)

	// The very first Publish crashing before LATEST existed.
	dir = t.TempDir()
	c, err = newLocalCatalog(dir, fs)
	require.NoError(t, err)
	fs.FailNth(errorfs.OpRename, 2, false, nil)
	require.ErrorIs(t, c.Publish(ctx, testMeta(7, 1)), errorfs.ErrInjected)
	require.NoError(t, c.Close())
	c3 := openLocalCatalog(t, dir)
	m, err = c3.Latest(ctx)
	require.NoError(t, err)
	assert.Equal(t, testMeta(7, 1), m)
}

// Stale temporary files (a crash mid-write) are removed at open and were
// never visible.
func TestLocalCatalogRemovesStaleTmp(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	dir := t.TempDir()
	c := openLocalCatalog(t, dir)
	require.NoError(t, c.Publish(ctx, testMeta(1, 1)))
	require.NoError(t, c.Close())
	stale := []string{"." + IDFor(2, 1) + ".meta.tmp", ".LATEST.tmp"}
	require.NoError(t, os.WriteFile(filepath.Join(dir, stale[0]), encodeMeta(testMeta(2, 1)), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, stale[1]), []byte(IDFor(2, 1)+"\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "keep.txt"), nil, 0o644))
	c2 := openLocalCatalog(t, dir)
	for _, n := range stale {
		assert.NoFileExists(t, filepath.Join(dir, n))
	}
	assert.FileExists(t, filepath.Join(dir, "keep.txt"))
	ms, err := c2.List(ctx)
	require.NoError(t, err)
	assert.Equal(t, []Meta{testMeta(1, 1)}, ms)
}

// A failed write of the meta publishes nothing and leaves no tmp.
func TestLocalCatalogFailedPublish(t *testing.T) {
	for _, op := range []errorfs.Op{errorfs.OpCreate, errorfs.OpWrite, errorfs.OpSync, errorfs.OpRename} {
		t.Run(fmt.Sprint(op), func(t *testing.T) {
			noLeaks(t)
			ctx := context.Background()
			dir := t.TempDir()
			fs := errorfs.New(nil)
			c, err := newLocalCatalog(dir, fs)
			require.NoError(t, err)
			t.Cleanup(func() { c.Close() })
			fs.FailNth(op, 1, false, nil)
			require.ErrorIs(t, c.Publish(ctx, testMeta(3, 1)), errorfs.ErrInjected)
			_, err = c.Latest(ctx)
			require.ErrorIs(t, err, ErrNoSnapshot)
			assert.Equal(t, []string{".catalog.lock"}, names(t, dir))
			require.NoError(t, c.Publish(ctx, testMeta(3, 1)))
		})
	}
}

// Deleting the latest moves LATEST before removing the meta: a crash
// between (the meta's removal failing here) leaves a readable catalog.
func TestLocalCatalogDeleteLatestCrashSafe(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	dir := t.TempDir()
	fs := errorfs.New(nil)
	c, err := newLocalCatalog(dir, fs)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.Publish(ctx, testMeta(1, 1)))
	require.NoError(t, c.Publish(ctx, testMeta(2, 1)))
	fs.FailNth(errorfs.OpRemove, 1, false, nil)
	require.ErrorIs(t, c.Delete(ctx, IDFor(2, 1)), errorfs.ErrInjected)
	m, err := c.Latest(ctx)
	require.NoError(t, err)
	assert.Equal(t, IDFor(1, 1), m.ID)
	require.NoError(t, c.Delete(ctx, IDFor(2, 1)))
	ms, err := c.List(ctx)
	require.NoError(t, err)
	assert.Equal(t, []Meta{testMeta(1, 1)}, ms)
}
