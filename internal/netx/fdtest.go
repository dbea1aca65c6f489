package netx

import (
	"context"
	"log/slog"
	"sync"
	"syscall"
	"testing"
)

// ExhaustFDs lowers RLIMIT_NOFILE to the fds open now plus headroom and
// opens fds until the process is out of them (EMFILE), for tests of
// listeners under fd exhaustion. It returns the filler fds; undo with
// RestoreFDs. Tests that use it must not run in parallel; most want
// StarveFDs.
func ExhaustFDs(t testing.TB, headroom int) []int {
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
	lim.Cur = uint64(highest + 1 + headroom)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	var fds []int
	for {
		fd, err := syscall.Dup(0)
		if err != nil {
			if err != syscall.EMFILE {
				RestoreFDs(t, fds, old)
				t.Fatalf("dup: %v", err)
			}
			return fds
		}
		fds = append(fds, fd)
	}
}

// RestoreFDs closes the filler fds and restores the limit.
func RestoreFDs(t testing.TB, fds []int, old syscall.Rlimit) {
	t.Helper()
	for _, fd := range fds {
		syscall.Close(fd)
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Error(err)
	}
}

// StarveFDs is ExhaustFDs leaving exactly spare fds free (for the peers
// a test dials), so that a listener's accept fails with EMFILE. restore
// undoes it; it is idempotent and also runs at the test's cleanup.
func StarveFDs(t testing.TB, spare int) (restore func()) {
	t.Helper()
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	fds := ExhaustFDs(t, 64+spare)
	var once sync.Once
	restore = func() { once.Do(func() { RestoreFDs(t, fds, old) }) }
	t.Cleanup(restore)
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
