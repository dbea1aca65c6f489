// Package errorfs wraps a vfs.FS and fails chosen operations: the Nth
// write or sync from now, or every one after it. Tests use it to drive
// the ha stores into their failure paths on a real filesystem.
package errorfs

import (
	"errors"
	"io"
	"os"
	"sync"

	"github.com/crescent-kv/crescent/ha/internal/vfs"
)

// Op is a kind of operation that can be made to fail.
type Op int

const (
	OpWrite   Op = iota // File.Write
	OpSync              // File.Sync (fdatasync)
	OpSyncDir           // FS.SyncDir
	OpCreate            // FS.OpenFile with O_CREATE
	OpRemove            // FS.Remove
	OpRename            // FS.Rename
	nOps
)

// ErrInjected is the error injected failures return (unless told another).
var ErrInjected = errors.New("errorfs: injected error")

// FS is a vfs.FS whose operations fail as armed.
type FS struct {
	vfs.FS
	mu    sync.Mutex
	count [nOps]int
	rules [nOps]rule
}

type rule struct {
	at     int // fail the op whose count reaches at (0 = unarmed)
	sticky bool
	err    error
}

// New wraps fs (vfs.Default when nil).
func New(fs vfs.FS) *FS {
	if fs == nil {
		fs = vfs.Default
	}
	return &FS{FS: fs}
}

// FailNth makes the nth (1-based) op of kind op from now fail with err
// (ErrInjected when nil); with sticky, every later one fails too.
func (f *FS) FailNth(op Op, n int, sticky bool, err error) {
	if err == nil {
		err = ErrInjected
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules[op] = rule{at: f.count[op] + n, sticky: sticky, err: err}
}

// Reset disarms every rule.
func (f *FS) Reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules = [nOps]rule{}
}

// Count is how many ops of kind op were attempted.
func (f *FS) Count(op Op) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.count[op]
}

func (f *FS) check(op Op) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.count[op]++
	r := f.rules[op]
	if r.at == 0 {
		return nil
	}
	if f.count[op] == r.at || (r.sticky && f.count[op] > r.at) {
		return r.err
	}
	return nil
}

func (f *FS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	if flag&os.O_CREATE != 0 {
		if err := f.check(OpCreate); err != nil {
			return nil, &os.PathError{Op: "open", Path: name, Err: err}
		}
	}
	file, err := f.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &errFile{File: file, fs: f}, nil
}

func (f *FS) Remove(name string) error {
	if err := f.check(OpRemove); err != nil {
		return &os.PathError{Op: "remove", Path: name, Err: err}
	}
	return f.FS.Remove(name)
}

func (f *FS) Rename(o, n string) error {
	if err := f.check(OpRename); err != nil {
		return &os.LinkError{Op: "rename", Old: o, New: n, Err: err}
	}
	return f.FS.Rename(o, n)
}

func (f *FS) SyncDir(name string) error {
	if err := f.check(OpSyncDir); err != nil {
		return &os.PathError{Op: "fsync", Path: name, Err: err}
	}
	return f.FS.SyncDir(name)
}

func (f *FS) Lock(name string) (io.Closer, error) { return f.FS.Lock(name) }

type errFile struct {
	vfs.File
	fs *FS
}

// Write fails whole: an injected write error writes nothing.
func (e *errFile) Write(p []byte) (int, error) {
	if err := e.fs.check(OpWrite); err != nil {
		return 0, &os.PathError{Op: "write", Path: e.Name(), Err: err}
	}
	return e.File.Write(p)
}

func (e *errFile) Sync() error {
	if err := e.fs.check(OpSync); err != nil {
		return &os.PathError{Op: "fdatasync", Path: e.Name(), Err: err}
	}
	return e.File.Sync()
}
