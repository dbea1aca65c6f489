package crpc

import (
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// pollConn reads a TCP connection; while poll is set (a caller holds the
// read role), a read that would block waits in ppoll first, so a thread
// locked to its goroutine (a cgo caller) is woken by the kernel directly
// instead of by the netpoller and another thread.
type pollConn struct {
	net.Conn
	rc     syscall.RawConn
	wait   unix.Timespec
	poll   bool
	polled atomic.Int64 // ppoll calls (tests)

	// One read's state, for the callback made once in newPollConn: only
	// the read role's holder reads, so a closure (and its captured
	// variables) need not be allocated per read.
	fn     func(fd uintptr) bool
	b      []byte
	n      int
	rerr   error
	waited bool
	fds    [1]unix.PollFd
	ts     unix.Timespec
}

// newPollConn wraps a plain TCP connection when wait > 0 (WithPollWait);
// TLS connections read through crypto/tls and are not wrapped.
func newPollConn(c net.Conn, wait time.Duration) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok || wait <= 0 {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	p := &pollConn{Conn: c, rc: rc, wait: unix.NsecToTimespec(int64(wait))}
	p.fn = p.readFd
	return p
}

func (p *pollConn) Read(b []byte) (int, error) {
	if !p.poll || len(b) == 0 {
		return p.Conn.Read(b)
	}
	p.b, p.n, p.rerr, p.waited = b, 0, nil, false
	err := p.rc.Read(p.fn)
	n, rerr := p.n, p.rerr
	p.b, p.rerr = nil, nil
	if err != nil {
		return 0, err
	}
	if rerr != nil {
		return 0, &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", rerr)}
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// readFd reads into p.b; the first time it would block it waits in ppoll
// (up to p.wait), then lets the netpoller wait.
func (p *pollConn) readFd(fd uintptr) bool {
	for {
		p.n, p.rerr = syscall.Read(int(fd), p.b)
		if p.rerr == syscall.EINTR {
			continue
		}
		if p.rerr == syscall.EAGAIN && !p.waited {
			p.waited = true
			p.polled.Add(1)
			p.fds[0] = unix.PollFd{Fd: int32(fd), Events: unix.POLLIN}
			p.ts = p.wait
			unix.Ppoll(p.fds[:], &p.ts, nil)
			continue
		}
		return p.rerr != syscall.EAGAIN
	}
}
