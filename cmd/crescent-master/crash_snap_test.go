package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/crescent-kv/crescent/ha/snapshot"
)

// Until ha/snapshot's local backends are in the tree, the crash test's
// master stores snapshots with dirSnaps: a minimal stand-in (bodies and
// metas as files renamed into place), enough for kill -9 (not for power
// loss: nothing is fsynced).
func init() {
	if localSnapshots == nil {
		localSnapshots = localBackends(func(dir string) (*dirSnaps, error) {
			return &dirSnaps{dir: dir}, os.MkdirAll(dir, 0o755)
		}, func(dir string) (dirCatalog, error) {
			return dirCatalog{&dirSnaps{dir: dir}}, nil
		})
	}
}

type dirSnaps struct {
	dir string
	mu  sync.Mutex
}

type dirWriter struct {
	f    *os.File
	path string
}

func (w *dirWriter) Write(b []byte) (int, error) { return w.f.Write(b) }
func (w *dirWriter) Abort() error {
	w.f.Close()
	return os.Remove(w.f.Name())
}
func (w *dirWriter) Commit() error {
	if err := w.f.Close(); err != nil {
		return err
	}
	return os.Rename(w.f.Name(), w.path)
}

func (d *dirSnaps) Create(_ context.Context, id string) (snapshot.PayloadWriter, error) {
	path := filepath.Join(d.dir, id+".snap")
	if _, err := os.Stat(path); err == nil {
		return nil, errors.New("exists")
	}
	f, err := os.CreateTemp(d.dir, ".tmp-*")
	if err != nil {
		return nil, err
	}
	return &dirWriter{f: f, path: path}, nil
}

func (d *dirSnaps) Open(_ context.Context, id string) (io.ReadCloser, error) {
	f, err := os.Open(filepath.Join(d.dir, id+".snap"))
	if errors.Is(err, os.ErrNotExist) {
		return nil, snapshot.ErrNotFound
	}
	return f, err
}

func (d *dirSnaps) Delete(_ context.Context, id string) error {
	if err := os.Remove(filepath.Join(d.dir, id+".snap")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

type dirCatalog struct{ *dirSnaps }

func (c dirCatalog) Publish(_ context.Context, m snapshot.Meta) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	tmp := filepath.Join(c.dir, ".meta.tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(c.dir, m.ID+".meta"))
}

func (c dirCatalog) List(context.Context) ([]snapshot.Meta, error) {
	names, err := filepath.Glob(filepath.Join(c.dir, "*.meta"))
	if err != nil {
		return nil, err
	}
	slices.Sort(names) // ids sort as their seqs
	var out []snapshot.Meta
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			return nil, err
		}
		var m snapshot.Meta
		if err := json.NewDecoder(bytes.NewReader(b)).Decode(&m); err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, nil
}

func (c dirCatalog) Latest(ctx context.Context) (snapshot.Meta, error) {
	ms, err := c.List(ctx)
	if err != nil || len(ms) == 0 {
		return snapshot.Meta{}, errors.Join(err, snapshot.ErrNoSnapshot)
	}
	return ms[len(ms)-1], nil
}

func (c dirCatalog) Delete(_ context.Context, id string) error {
	if err := os.Remove(filepath.Join(c.dir, id+".meta")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func (c dirCatalog) Close() error { return nil }

// TestCrashRecoverySnapshots is TestCrashRecovery with snapshots every
// 50 ms and a log compacted down to 20 entries below the latest, so the
// kills land before, during and after snapshots and compactions, and
// restarts recover from a snapshot plus the log's tail.
func TestCrashRecoverySnapshots(t *testing.T) {
	if testing.Short() {
		t.Skip("process test")
	}
	lines := runCrashRecovery(t, "--snapshot_interval", "50ms", "--oplog_retain", "20", "--snapshot_retain", "2")
	fromSnap := 0
	for _, l := range lines {
		if !strings.Contains(l, "snapshot=\"\"") && !strings.Contains(l, "snapshot= ") {
			fromSnap++
		}
	}
	t.Logf("%d of %d restarts began from a snapshot", fromSnap, len(lines))
	require.Greater(t, fromSnap, len(lines)/2, "restarts recovered from snapshots:\n%s", strings.Join(lines, "\n"))
}
