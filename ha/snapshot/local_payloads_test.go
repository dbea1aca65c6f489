package snapshot

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/crescent-kv/crescent/ha/internal/vfs/errorfs"
	"github.com/crescent-kv/crescent/internal/testutil"
)

// noLeaks checks, after every other cleanup of the test, that no
// goroutine or file descriptor outlived it.
func noLeaks(t *testing.T) {
	fds := testutil.CountFDs(t)
	t.Cleanup(func() {
		goleak.VerifyNone(t)
		assert.Equal(t, fds, testutil.CountFDs(t), "open file descriptors")
	})
}

func writePayload(t *testing.T, p Payloads, id string, body []byte) {
	t.Helper()
	w, err := p.Create(context.Background(), id)
	require.NoError(t, err)
	defer w.Abort()
	_, err = w.Write(body)
	require.NoError(t, err)
	require.NoError(t, w.Commit())
}

func readPayload(t *testing.T, p Payloads, id string) []byte {
	t.Helper()
	r, err := p.Open(context.Background(), id)
	require.NoError(t, err)
	defer r.Close()
	b, err := io.ReadAll(r)
	require.NoError(t, err)
	return b
}

func names(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var ns []string
	for _, e := range ents {
		ns = append(ns, e.Name())
	}
	return ns
}

func TestLocalPayloadsCommitMakesVisible(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	dir := t.TempDir()
	p, err := NewLocalPayloads(dir)
	require.NoError(t, err)
	id := IDFor(7, 1)
	body := make([]byte, 1<<20+3)
	testutil.Fill(body, 1)

	w, err := p.Create(ctx, id)
	require.NoError(t, err)
	_, err = w.Write(body[:100])
	require.NoError(t, err)
	_, err = w.Write(body[100:])
	require.NoError(t, err)
	_, err = p.Open(ctx, id)
	require.ErrorIs(t, err, ErrNotFound, "not visible before Commit")
	ids, err := p.IDs(ctx)
	require.NoError(t, err)
	assert.Empty(t, ids)
	assert.Equal(t, []string{"." + id + ".tmp"}, names(t, dir))

	require.NoError(t, w.Commit())
	assert.Equal(t, []string{id + ".snap"}, names(t, dir))
	assert.Equal(t, body, readPayload(t, p, id))
	ids, err = p.IDs(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{id}, ids)

	assert.NoError(t, w.Abort(), "Abort after Commit does nothing")
	assert.Equal(t, body, readPayload(t, p, id))
	_, err = w.Write([]byte("x"))
	assert.Error(t, err, "write after commit")
	assert.Error(t, w.Commit(), "second commit")

	_, err = p.Create(ctx, id)
	require.ErrorIs(t, err, ErrExists)

	require.NoError(t, p.Delete(ctx, id))
	_, err = p.Open(ctx, id)
	require.ErrorIs(t, err, ErrNotFound)
	require.NoError(t, p.Delete(ctx, id), "deleting an absent id")
	assert.Empty(t, names(t, dir))
}

func TestLocalPayloadsAbort(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	dir := t.TempDir()
	p, err := NewLocalPayloads(dir)
	require.NoError(t, err)
	id := IDFor(3, 1)
	w, err := p.Create(ctx, id)
	require.NoError(t, err)
	_, err = p.Create(ctx, id)
	require.ErrorIs(t, err, ErrExists, "one writer per id")
	_, err = w.Write([]byte("abc"))
	require.NoError(t, err)
	require.NoError(t, w.Abort())
	require.NoError(t, w.Abort())
	assert.Error(t, w.Commit(), "commit after abort")
	assert.Empty(t, names(t, dir))
	_, err = p.Open(ctx, id)
	require.ErrorIs(t, err, ErrNotFound)
	writePayload(t, p, id, []byte("again"))
	assert.Equal(t, []byte("again"), readPayload(t, p, id))
}

// A process that dies mid-write leaves DIR/.<id>.tmp: it is never
// visible, and the next open removes it (and nothing else).
func TestLocalPayloadsCrashLeavesNoVisibleBody(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	dir := t.TempDir()
	p, err := NewLocalPayloads(dir)
	require.NoError(t, err)
	writePayload(t, p, IDFor(1, 1), []byte("old"))
	id := IDFor(2, 1)
	w, err := p.Create(ctx, id)
	require.NoError(t, err)
	_, err = w.Write([]byte("half a snapshot"))
	require.NoError(t, err)
	lw := w.(*localWriter)
	require.NoError(t, lw.f.Close()) // the crash: the process is gone, the tmp stays
	lw.closed = true

	_, err = p.Open(ctx, id)
	require.ErrorIs(t, err, ErrNotFound)
	ids, err := p.IDs(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{IDFor(1, 1)}, ids)
	// Files that are not a writer's tmp survive the cleanup.
	for _, n := range []string{".other.tmp", "notes.txt", ".0-1.tmp"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n), nil, 0o644))
	}

	p2, err := NewLocalPayloads(dir)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{IDFor(1, 1) + ".snap", ".other.tmp", "notes.txt", ".0-1.tmp"}, names(t, dir))
	assert.Equal(t, []byte("old"), readPayload(t, p2, IDFor(1, 1)))
	writePayload(t, p2, id, []byte("whole"))
	assert.Equal(t, []byte("whole"), readPayload(t, p2, id))
}

// A failure anywhere in Commit leaves nothing under the id, no tmp, and
// the id free for another attempt.
func TestLocalPayloadsFailedCommitLeavesNothing(t *testing.T) {
	for _, c := range []struct {
		name string
		op   errorfs.Op
	}{
		{"write", errorfs.OpWrite},
		{"fsync", errorfs.OpSync},
		{"rename", errorfs.OpRename},
		{"dir fsync", errorfs.OpSyncDir},
	} {
		t.Run(c.name, func(t *testing.T) {
			noLeaks(t)
			ctx := context.Background()
			dir := t.TempDir()
			fs := errorfs.New(nil)
			p, err := newLocalPayloads(dir, fs)
			require.NoError(t, err)
			id := IDFor(5, 2)
			fs.FailNth(c.op, 1, false, nil)
			w, err := p.Create(ctx, id)
			require.NoError(t, err)
			_, werr := w.Write([]byte("body"))
			err = w.Commit()
			require.ErrorIs(t, err, errorfs.ErrInjected)
			if c.op == errorfs.OpWrite {
				require.ErrorIs(t, werr, errorfs.ErrInjected)
			}
			assert.Empty(t, names(t, dir))
			_, err = p.Open(ctx, id)
			require.ErrorIs(t, err, ErrNotFound)
			writePayload(t, p, id, []byte("body"))
			assert.Equal(t, []byte("body"), readPayload(t, p, id))
		})
	}
}

func TestLocalPayloadsRefuseBadIDs(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	parent := t.TempDir()
	dir := filepath.Join(parent, "snaps")
	p, err := NewLocalPayloads(dir)
	require.NoError(t, err)
	for _, id := range []string{"", "../escape", "../" + IDFor(1, 1), IDFor(1, 1) + "/x", "1-1", "LATEST"} {
		_, err := p.Create(ctx, id)
		require.ErrorIs(t, err, ErrBadID, "%q", id)
		_, err = p.Open(ctx, id)
		require.ErrorIs(t, err, ErrBadID, "%q", id)
		require.ErrorIs(t, p.Delete(ctx, id), ErrBadID, "%q", id)
	}
	assert.Equal(t, []string{"snaps"}, names(t, parent))
	assert.Empty(t, names(t, dir))
	_, err = NewLocalPayloads("")
	require.Error(t, err)
}

// Writers racing for one id: exactly one gets to create it.
func TestLocalPayloadsConcurrentWriters(t *testing.T) {
	noLeaks(t)
	ctx := context.Background()
	p, err := NewLocalPayloads(t.TempDir())
	require.NoError(t, err)
	const n = 8
	id := IDFor(9, 9)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w, err := p.Create(ctx, id)
			if err != nil {
				errs[i] = err
				return
			}
			w.Write([]byte{byte(i)})
			errs[i] = w.Commit()
		}()
	}
	wg.Wait()
	won := -1
	for i, err := range errs {
		if err == nil {
			require.Equal(t, -1, won, "two writers created %s", id)
			won = i
		} else {
			require.ErrorIs(t, err, ErrExists)
		}
	}
	require.NotEqual(t, -1, won)
	assert.Equal(t, []byte{byte(won)}, readPayload(t, p, id))
}
