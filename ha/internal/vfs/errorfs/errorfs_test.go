package errorfs

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/ha/internal/vfs"
)

func TestFailNth(t *testing.T) {
	fs := New(nil)
	f, err := fs.OpenFile(filepath.Join(t.TempDir(), "f"), os.O_CREATE|os.O_WRONLY, 0o644)
	require.NoError(t, err)
	defer f.Close()
	fs.FailNth(OpSync, 2, false, nil)
	assert.NoError(t, f.Sync())
	assert.ErrorIs(t, f.Sync(), ErrInjected)
	assert.NoError(t, f.Sync(), "not sticky")

	fs.FailNth(OpWrite, 1, true, nil)
	n, err := f.Write([]byte("x"))
	assert.ErrorIs(t, err, ErrInjected)
	assert.Zero(t, n, "an injected write writes nothing")
	_, err = f.Write([]byte("x"))
	assert.ErrorIs(t, err, ErrInjected, "sticky")
	fs.Reset()
	_, err = f.Write([]byte("x"))
	assert.NoError(t, err)
	assert.Equal(t, 3, fs.Count(OpWrite))
}

func TestLock(t *testing.T) {
	p := filepath.Join(t.TempDir(), "LOCK")
	a, err := vfs.Default.Lock(p)
	require.NoError(t, err)
	_, err = vfs.Default.Lock(p)
	assert.ErrorIs(t, err, vfs.ErrLocked)
	require.NoError(t, a.Close())
	b, err := vfs.Default.Lock(p)
	require.NoError(t, err)
	require.NoError(t, b.Close())
}
