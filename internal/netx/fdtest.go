package netx

import (
	"context"
	"log/slog"
	"sync"
	"syscall"
	"testing"
)

// StarveFDs lowers RLIMIT_NOFILE to the fds open now plus a little and
// fills it, leaving exactly spare fds free (for the peers a test dials),
// so that a listener's accept fails with EMFILE. restore closes the
// fillers and restores the limit; it is idempotent and also runs at the
// test's cleanup. Tests that use it must not run in parallel.
func StarveFDs(t testing.TB, spare int) (restore func()) {
	t.Helper()
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	highest := 0
	for fd := 0; fd < int(min(old.Cur, 1<<16)); fd++ {
		var st syscall.Stat_t
		if syscall.Fstat(fd, &st) == nil {
			highest = fd
		}
	}
	lim := old
	lim.Cur = uint64(highest + 1 + 64 + spare)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	var fds []int
	var once sync.Once
	restore = func() {
		once.Do(func() {
			for _, fd := range fds {
				syscall.Close(fd)
			}
			if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(restore)
	for {
		fd, err := syscall.Dup(0)
		if err == syscall.EMFILE {
			break
		}
		if err != nil {
			restore()
			t.Fatalf("dup: %v", err)
		}
		fds = append(fds, fd)
	}
	if len(fds) < spare {
		restore()
		t.Fatalf("only %d fds to spare", len(fds))
	}
	for _, fd := range fds[len(fds)-spare:] {
		syscall.Close(fd)
	}
	fds = fds[:len(fds)-spare]
	return restore
}

// AcceptFailed returns a logger to give a listener (Config.Logger, or
// the Logger a server passes on) and a channel closed once that listener
// reports a failed accept it backs off from, so fd-exhaustion tests know
// the loop has hit EMFILE without sleeping.
func AcceptFailed() (*slog.Logger, <-chan struct{}) {
	h := &tap{ch: make(chan struct{})}
	return slog.New(h), h.ch
}

type tap struct {
	once sync.Once
	ch   chan struct{}
}

func (h *tap) Enabled(context.Context, slog.Level) bool { return true }
func (h *tap) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *tap) WithGroup(string) slog.Handler            { return h }
func (h *tap) Handle(_ context.Context, r slog.Record) error {
	if r.Message == msgBackoff {
		h.once.Do(func() { close(h.ch) })
	}
	return nil
}
