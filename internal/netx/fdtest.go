package netx

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"os"
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

// StarveWithPeer connects a peer to addr while the process is out of fds,
// so the listener's accept fails with EMFILE while the peer waits in the
// backlog. The peer's socket is made before the fds run out: anything
// else in the process that opens an fd meanwhile (a background redial)
// cannot take the one the peer needed. finish gives the fds back and
// returns the peer, closed at the test's cleanup; it must be called.
func StarveWithPeer(t testing.TB, addr string) (finish func() net.Conn) {
	t.Helper()
	ap, err := netip.ParseAddrPort(addr)
	if err != nil || !ap.Addr().Is4() {
		t.Fatalf("StarveWithPeer wants an IPv4 address:port, got %q", addr)
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	restore := StarveFDs(t, 0)
	// A blocking connect returns once the kernel completes the handshake,
	// with the connection queued for an accept that cannot happen yet.
	if err := syscall.Connect(fd, &syscall.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}); err != nil {
		restore()
		syscall.Close(fd)
		t.Fatalf("connect %s: %v", addr, err)
	}
	return func() net.Conn {
		restore()
		f := os.NewFile(uintptr(fd), "peer")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
}
