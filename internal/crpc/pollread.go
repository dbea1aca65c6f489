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
	return &pollConn{Conn: c, rc: rc, wait: unix.NsecToTimespec(int64(wait))}
}

func (p *pollConn) Read(b []byte) (int, error) {
	if !p.poll || len(b) == 0 {
		return p.Conn.Read(b)
	}
	var n int
	var rerr error
	polled := false
	err := p.rc.Read(func(fd uintptr) bool {
		for {
			n, rerr = syscall.Read(int(fd), b)
			if rerr == syscall.EINTR {
				continue
			}
			if rerr == syscall.EAGAIN && !polled {
				polled = true
				p.polled.Add(1)
				fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
				ts := p.wait
				unix.Ppoll(fds, &ts, nil)
				continue
			}
			return rerr != syscall.EAGAIN
		}
	})
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
