package crpc

import (
	"io"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// pollWait is how long a reader about to block first waits for
// readability in its own thread (ppoll) before parking in the netpoller;
// 0: never. CRESCENT_CRPC_POLL=<µs> sets it (measurement only).
var pollWait = func() int64 {
	var us int64
	for _, c := range os.Getenv("CRESCENT_CRPC_POLL") {
		if c < '0' || c > '9' {
			return 0
		}
		us = us*10 + int64(c-'0')
	}
	return us * 1000
}()

// pollConn reads a TCP connection; while poll is set (a caller holds the
// read role), a read that would block waits in ppoll first, so a thread
// locked to its goroutine (a cgo caller) is woken by the kernel directly
// instead of by the netpoller and another thread.
type pollConn struct {
	net.Conn
	rc   syscall.RawConn
	poll bool
}

func newPollConn(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok || pollWait <= 0 {
		return c
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	return &pollConn{Conn: c, rc: rc}
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
				fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
				ts := unix.NsecToTimespec(pollWait)
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
