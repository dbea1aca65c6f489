package snapshot

import (
	"bytes"
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

// ErrClosed is returned by a closed catalog.
var ErrClosed = errors.New("snapshot: catalog closed")

const (
	metaSuffix  = ".meta"
	latestName  = "LATEST"
	latestTmp   = ".LATEST.tmp"
	catalogLock = ".catalog.lock"
)

// LocalCatalog keeps the catalog in a directory: DIR/<id>.meta per
// published snapshot and DIR/LATEST naming the latest (doc.go,
// "Catalogs"). It holds an flock on DIR/.catalog.lock until Close, so
// one process uses a directory at a time; the directory may be the
// LocalPayloads one.
type LocalCatalog struct {
	dir  string
	fs   vfs.FS
	lock io.Closer

	mu     sync.Mutex
	closed bool
}

var _ Catalog = (*LocalCatalog)(nil)

// NewLocalCatalog opens (creating it if needed) the catalog directory
// dir. It removes temporary files a crash left behind and, when a meta
// newer than LATEST exists (a crash inside Publish, after the meta was
// durable), moves LATEST to it.
func NewLocalCatalog(dir string) (*LocalCatalog, error) {
	return newLocalCatalog(dir, vfs.Default)
}

func newLocalCatalog(dir string, fsys vfs.FS) (*LocalCatalog, error) {
	if dir == "" {
		return nil, errors.New("snapshot: catalog directory not set")
	}
	if err := fsys.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("snapshot: catalog directory: %w", err)
	}
	lock, err := fsys.Lock(filepath.Join(dir, catalogLock))
	if err != nil {
		return nil, fmt.Errorf("snapshot: catalog directory: %w", err)
	}
	c := &LocalCatalog{dir: dir, fs: fsys, lock: lock}
	if err := c.recover(); err != nil {
		lock.Close()
		return nil, err
	}
	return c, nil
}

func (c *LocalCatalog) recover() error {
	err := vfs.RemoveStale(c.fs, c.dir, func(n string) bool {
		id, isMetaTmp := strings.CutSuffix(n, metaSuffix+tmpSuffix)
		return n == latestTmp || (isMetaTmp && strings.HasPrefix(id, ".") && checkID(id[1:]) == nil)
	})
	if err != nil {
		return fmt.Errorf("snapshot: catalog directory: %w", err)
	}
	ids, err := c.ids()
	if err != nil || len(ids) == 0 {
		return err
	}
	cur, ok, err := c.readLatest()
	if err != nil {
		// A corrupt marker is left for Latest to report: guessing could
		// pick a snapshot the log was never compacted behind.
		return nil
	}
	if top := ids[len(ids)-1]; !ok || top > cur {
		return c.writeLatest(top)
	}
	return nil
}

func (c *LocalCatalog) metaPath(id string) string { return filepath.Join(c.dir, id+metaSuffix) }

// ids lists the meta files by ascending id.
func (c *LocalCatalog) ids() ([]string, error) {
	ents, err := c.fs.ReadDir(c.dir)
	if err != nil {
		return nil, fmt.Errorf("snapshot: catalog directory: %w", err)
	}
	var ids []string
	for _, e := range ents {
		if id, ok := strings.CutSuffix(e.Name(), metaSuffix); ok && checkID(id) == nil {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	return ids, nil
}

// readFile reads at most max bytes of name; a longer file is ErrCorrupt.
func (c *LocalCatalog) readFile(name string, max int) ([]byte, error) {
	f, err := c.fs.OpenFile(name, os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, int64(max)+1))
	if err != nil {
		return nil, err
	}
	if len(b) > max {
		return nil, fmt.Errorf("%w: %s is longer than %d bytes", ErrCorrupt, filepath.Base(name), max)
	}
	return b, nil
}

// readLatest returns the id LATEST names; ok is false when there is no
// marker.
func (c *LocalCatalog) readLatest() (id string, ok bool, err error) {
	b, err := c.readFile(filepath.Join(c.dir, latestName), idLen+1)
	if errors.Is(err, fs.ErrNotExist) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("snapshot: read %s: %w", latestName, err)
	}
	id, nl := strings.CutSuffix(string(b), "\n")
	if !nl || checkID(id) != nil {
		return "", false, fmt.Errorf("%w: %s holds %q, not a snapshot id", ErrCorrupt, latestName, b)
	}
	return id, true, nil
}

// writeLatest replaces LATEST durably: tmp, fsync, rename, fsync dir.
func (c *LocalCatalog) writeLatest(id string) error {
	if err := c.writeFile(latestTmp, latestName, []byte(id+"\n")); err != nil {
		return fmt.Errorf("snapshot: write %s: %w", latestName, err)
	}
	return nil
}

func (c *LocalCatalog) removeLatest() error {
	err := c.fs.Remove(filepath.Join(c.dir, latestName))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err == nil {
		err = c.fs.SyncDir(c.dir)
	}
	if err != nil {
		return fmt.Errorf("snapshot: remove %s: %w", latestName, err)
	}
	return nil
}

func (c *LocalCatalog) writeFile(tmp, name string, b []byte) error {
	return vfs.WriteFileAtomic(c.fs, c.dir, tmp, name, b)
}

func (c *LocalCatalog) enter(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	return nil
}

// Publish writes DIR/<id>.meta durably, then moves LATEST to id when id
// is above the one it names. Publishing the same Meta again is a no-op
// success (a retry); a different Meta under a published id is
// ErrExists.
func (c *LocalCatalog) Publish(ctx context.Context, m Meta) error {
	if err := checkMeta(m); err != nil {
		return err
	}
	if err := c.enter(ctx); err != nil {
		return err
	}
	defer c.mu.Unlock()
	enc := encodeMeta(m)
	old, err := c.readFile(c.metaPath(m.ID), maxMetaSize)
	switch {
	case err == nil:
		if !bytes.Equal(old, enc) {
			return fmt.Errorf("%w: snapshot %s is published with another meta", ErrExists, m.ID)
		}
	case errors.Is(err, fs.ErrNotExist):
		if err := c.writeFile("."+m.ID+metaSuffix+tmpSuffix, m.ID+metaSuffix, enc); err != nil {
			return fmt.Errorf("snapshot: publish %s: %w", m.ID, err)
		}
	default:
		return fmt.Errorf("snapshot: publish %s: %w", m.ID, err)
	}
	cur, ok, err := c.readLatest()
	if err != nil {
		return fmt.Errorf("snapshot: publish %s: %w", m.ID, err)
	}
	if !ok || m.ID > cur {
		return c.writeLatest(m.ID)
	}
	return nil
}

// Latest reads the meta LATEST names. No marker and no meta is
// ErrNoSnapshot; a marker naming a missing or corrupt meta, or metas
// without a marker, is an error.
func (c *LocalCatalog) Latest(ctx context.Context) (Meta, error) {
	if err := c.enter(ctx); err != nil {
		return Meta{}, err
	}
	defer c.mu.Unlock()
	id, ok, err := c.readLatest()
	if err != nil {
		return Meta{}, err
	}
	if !ok {
		ids, err := c.ids()
		if err != nil {
			return Meta{}, err
		}
		if len(ids) > 0 {
			return Meta{}, fmt.Errorf("%w: no %s marker but %d meta files (newest %s)", ErrCorrupt, latestName, len(ids), ids[len(ids)-1])
		}
		return Meta{}, ErrNoSnapshot
	}
	m, err := c.readMeta(id)
	if err != nil {
		return Meta{}, fmt.Errorf("snapshot: %s names %s: %w", latestName, id, err)
	}
	return m, nil
}

func (c *LocalCatalog) readMeta(id string) (Meta, error) {
	b, err := c.readFile(c.metaPath(id), maxMetaSize)
	if errors.Is(err, fs.ErrNotExist) {
		return Meta{}, fmt.Errorf("%w: meta %s is missing", ErrCorrupt, id)
	}
	if err != nil {
		return Meta{}, err
	}
	return decodeMeta(b, id)
}

// List reads every meta by ascending id (= ascending Seq); a corrupt one
// fails the whole list.
func (c *LocalCatalog) List(ctx context.Context) ([]Meta, error) {
	if err := c.enter(ctx); err != nil {
		return nil, err
	}
	defer c.mu.Unlock()
	ids, err := c.ids()
	if err != nil {
		return nil, err
	}
	ms := make([]Meta, 0, len(ids))
	for _, id := range ids {
		m, err := c.readMeta(id)
		if err != nil {
			return nil, err
		}
		ms = append(ms, m)
	}
	return ms, nil
}

// Delete removes id's meta. When LATEST names id it is first moved to
// the next highest id (or removed), so a crash in between never leaves
// a marker naming a missing meta.
func (c *LocalCatalog) Delete(ctx context.Context, id string) error {
	if err := checkID(id); err != nil {
		return err
	}
	if err := c.enter(ctx); err != nil {
		return err
	}
	defer c.mu.Unlock()
	cur, ok, err := c.readLatest()
	if err != nil {
		return fmt.Errorf("snapshot: delete %s: %w", id, err)
	}
	if ok && cur == id {
		ids, err := c.ids()
		if err != nil {
			return err
		}
		next := ""
		for _, o := range ids {
			if o != id {
				next = o // ascending: the last one wins
			}
		}
		if next != "" {
			err = c.writeLatest(next)
		} else {
			err = c.removeLatest()
		}
		if err != nil {
			return fmt.Errorf("snapshot: delete %s: %w", id, err)
		}
	}
	err = c.fs.Remove(c.metaPath(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err == nil {
		err = c.fs.SyncDir(c.dir)
	}
	if err != nil {
		return fmt.Errorf("snapshot: delete %s: %w", id, err)
	}
	return nil
}

// Close releases the directory lock; later calls return ErrClosed.
func (c *LocalCatalog) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	return c.lock.Close()
}
