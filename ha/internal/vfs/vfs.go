// Package vfs is the small filesystem interface the ha packages write
// through, so tests can inject faults (package errorfs) under the real
// code: the pebble vfs habit.
package vfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// File is an open file. Sync is fdatasync: the data and the metadata
// needed to read it back (size), which is what a log needs.
type File interface {
	io.Reader
	io.ReaderAt
	io.Writer
	io.Closer
	Sync() error
	Truncate(size int64) error
	Stat() (os.FileInfo, error)
	Name() string
}

// FS is the set of operations the ha packages use.
type FS interface {
	OpenFile(name string, flag int, perm os.FileMode) (File, error)
	Rename(oldname, newname string) error
	Remove(name string) error
	ReadDir(name string) ([]os.DirEntry, error)
	MkdirAll(name string, perm os.FileMode) error
	// SyncDir fsyncs a directory, making creations, renames and removals
	// of its entries durable.
	SyncDir(name string) error
	// Lock takes an exclusive, non-blocking flock on name (created if
	// missing); ErrLocked when another holder has it. Close releases it.
	Lock(name string) (io.Closer, error)
}

// ErrLocked is Lock's error when the lock is held elsewhere.
var ErrLocked = errors.New("vfs: locked by another holder")

// Default is the operating system's filesystem.
var Default FS = osFS{}

type osFS struct{}

type osFile struct{ *os.File }

func (f osFile) Sync() error {
	for {
		err := unix.Fdatasync(int(f.Fd()))
		if err != unix.EINTR {
			if err != nil {
				return &os.PathError{Op: "fdatasync", Path: f.File.Name(), Err: err}
			}
			return nil
		}
	}
}

func (osFS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return osFile{f}, nil
}

func (osFS) Rename(o, n string) error                     { return os.Rename(o, n) }
func (osFS) Remove(name string) error                     { return os.Remove(name) }
func (osFS) ReadDir(name string) ([]os.DirEntry, error)   { return os.ReadDir(name) }
func (osFS) MkdirAll(name string, perm os.FileMode) error { return os.MkdirAll(name, perm) }

func (osFS) SyncDir(name string) error {
	d, err := os.Open(name)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

func (osFS) Lock(name string) (io.Closer, error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrLocked, name)
		}
		return nil, &os.PathError{Op: "flock", Path: name, Err: err}
	}
	return f, nil // closing the fd releases the flock
}

// WriteFileAtomic replaces dir/name with b durably: it writes dir/tmp,
// fdatasyncs and closes it, renames it over name and fsyncs dir. On an
// error before the rename the temporary file is removed, so a crash or a
// failure leaves the old file or the new one, never a torn one.
func WriteFileAtomic(fsys FS, dir, tmp, name string, b []byte) error {
	tp := filepath.Join(dir, tmp)
	f, err := fsys.OpenFile(tp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = fsys.Rename(tp, filepath.Join(dir, name))
	}
	if err != nil {
		fsys.Remove(tp)
		return err
	}
	return fsys.SyncDir(dir)
}

// RemoveStale removes the entries of dir that stale matches (temporary
// files a crash left behind) and, when it removed any, fsyncs dir.
func RemoveStale(fsys FS, dir string, stale func(name string) bool) error {
	ents, err := fsys.ReadDir(dir)
	if err != nil {
		return err
	}
	removed := false
	for _, e := range ents {
		if !stale(e.Name()) {
			continue
		}
		if err := fsys.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove stale %s: %w", e.Name(), err)
		}
		removed = true
	}
	if removed {
		return fsys.SyncDir(dir)
	}
	return nil
}
