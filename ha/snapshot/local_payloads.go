package snapshot

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/crescent-kv/crescent/ha/internal/vfs"
)

// ErrExists is returned when creating or publishing an id that already
// holds something else.
var ErrExists = errors.New("snapshot: already exists")

const (
	snapSuffix = ".snap"
	tmpSuffix  = ".tmp"
)

// LocalPayloads keeps snapshot bodies in a directory: DIR/<id>.snap,
// written as DIR/.<id>.tmp and renamed on Commit. One process uses a
// directory at a time (the one holding its LocalCatalog's lock).
type LocalPayloads struct {
	dir string
	fs  vfs.FS

	mu      sync.Mutex
	writing map[string]bool // ids with a live writer
}

var _ Payloads = (*LocalPayloads)(nil)

// NewLocalPayloads opens (creating it if needed) the payload directory
// dir and removes the temporary files of writers that never committed
// (a crash mid-write).
func NewLocalPayloads(dir string) (*LocalPayloads, error) {
	return newLocalPayloads(dir, vfs.Default)
}

func newLocalPayloads(dir string, fsys vfs.FS) (*LocalPayloads, error) {
	if dir == "" {
		return nil, errors.New("snapshot: payload directory not set")
	}
	if err := fsys.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("snapshot: payload directory: %w", err)
	}
	p := &LocalPayloads{dir: dir, fs: fsys, writing: map[string]bool{}}
	err := vfs.RemoveStale(fsys, dir, func(name string) bool {
		id, ok := tmpPayloadID(name)
		return ok && checkID(id) == nil
	})
	if err != nil {
		return nil, fmt.Errorf("snapshot: payload directory: %w", err)
	}
	return p, nil
}

// tmpPayloadID returns <id> for ".<id>.tmp".
func tmpPayloadID(name string) (string, bool) {
	if !strings.HasPrefix(name, ".") || !strings.HasSuffix(name, tmpSuffix) {
		return "", false
	}
	return name[1 : len(name)-len(tmpSuffix)], true
}

func (p *LocalPayloads) path(id string) string { return filepath.Join(p.dir, id+snapSuffix) }
func (p *LocalPayloads) tmp(id string) string  { return filepath.Join(p.dir, "."+id+tmpSuffix) }

func (p *LocalPayloads) exists(id string) (bool, error) {
	f, err := p.fs.OpenFile(p.path(id), os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	f.Close()
	return true, nil
}

// Create starts id's body in DIR/.<id>.tmp. An id with a committed body
// or a live writer is ErrExists.
func (p *LocalPayloads) Create(ctx context.Context, id string) (PayloadWriter, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.writing[id] {
		return nil, fmt.Errorf("%w: payload %s is being written", ErrExists, id)
	}
	ok, err := p.exists(id)
	if err != nil {
		return nil, fmt.Errorf("snapshot: payload %s: %w", id, err)
	}
	if ok {
		return nil, fmt.Errorf("%w: payload %s", ErrExists, id)
	}
	f, err := p.fs.OpenFile(p.tmp(id), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("snapshot: create payload %s: %w", id, err)
	}
	p.writing[id] = true
	return &localWriter{p: p, id: id, f: f}, nil
}

// Open reads DIR/<id>.snap.
func (p *LocalPayloads) Open(ctx context.Context, id string) (io.ReadCloser, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	f, err := p.fs.OpenFile(p.path(id), os.O_RDONLY, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: payload %s", ErrNotFound, id)
	}
	if err != nil {
		return nil, fmt.Errorf("snapshot: open payload %s: %w", id, err)
	}
	return f, nil
}

// Delete removes DIR/<id>.snap (and makes the removal durable).
func (p *LocalPayloads) Delete(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	err := p.fs.Remove(p.path(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err == nil {
		err = p.fs.SyncDir(p.dir)
	}
	if err != nil {
		return fmt.Errorf("snapshot: delete payload %s: %w", id, err)
	}
	return nil
}

// IDs lists the committed bodies by ascending id; files of other names
// are ignored.
func (p *LocalPayloads) IDs(ctx context.Context) ([]string, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	ents, err := p.fs.ReadDir(p.dir)
	if err != nil {
		return nil, fmt.Errorf("snapshot: payload directory: %w", err)
	}
	var ids []string
	for _, e := range ents {
		if id, ok := strings.CutSuffix(e.Name(), snapSuffix); ok && checkID(id) == nil {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids, nil
}

type localWriter struct {
	p      *LocalPayloads
	id     string
	f      vfs.File
	closed bool  // f is closed
	done   bool  // committed or aborted
	werr   error // the first write error: Commit refuses
}

func (w *localWriter) Write(b []byte) (int, error) {
	if w.done {
		return 0, fmt.Errorf("snapshot: payload %s: write after commit or abort", w.id)
	}
	if w.werr != nil {
		return 0, w.werr
	}
	n, err := w.f.Write(b)
	if err != nil {
		w.werr = fmt.Errorf("snapshot: write payload %s: %w", w.id, err)
		return n, w.werr
	}
	return n, nil
}

// Commit makes the body durable and visible: fsync, close, rename to
// <id>.snap, fsync the directory. On any failure the body is dropped
// and nothing is visible under id.
func (w *localWriter) Commit() error {
	if w.done {
		return fmt.Errorf("snapshot: payload %s: commit after commit or abort", w.id)
	}
	if err := w.commit(); err != nil {
		w.Abort()
		return err
	}
	w.done = true
	return nil
}

func (w *localWriter) commit() error {
	if w.werr != nil {
		return w.werr
	}
	p := w.p
	if err := w.f.Sync(); err != nil {
		return fmt.Errorf("snapshot: sync payload %s: %w", w.id, err)
	}
	w.closed = true
	if err := w.f.Close(); err != nil {
		return fmt.Errorf("snapshot: close payload %s: %w", w.id, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	ok, err := p.exists(w.id)
	if err != nil {
		return fmt.Errorf("snapshot: payload %s: %w", w.id, err)
	}
	if ok {
		return fmt.Errorf("%w: payload %s", ErrExists, w.id)
	}
	if err := p.fs.Rename(p.tmp(w.id), p.path(w.id)); err != nil {
		return fmt.Errorf("snapshot: commit payload %s: %w", w.id, err)
	}
	if err := p.fs.SyncDir(p.dir); err != nil {
		// The rename may or may not survive a crash: take it back so that
		// a failed Commit never leaves the id visible.
		p.fs.Remove(p.path(w.id))
		return fmt.Errorf("snapshot: commit payload %s: %w", w.id, err)
	}
	delete(p.writing, w.id)
	return nil
}

// Abort drops the body; after a successful Commit it does nothing, so
// `defer w.Abort()` is the usual pattern.
func (w *localWriter) Abort() error {
	if w.done {
		return nil
	}
	w.done = true
	if !w.closed {
		w.closed = true
		w.f.Close()
	}
	p := w.p
	err := p.fs.Remove(p.tmp(w.id))
	if errors.Is(err, fs.ErrNotExist) {
		err = nil
	}
	p.mu.Lock()
	delete(p.writing, w.id)
	p.mu.Unlock()
	if err != nil {
		return fmt.Errorf("snapshot: abort payload %s: %w", w.id, err)
	}
	return nil
}
