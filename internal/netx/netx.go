package netx

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Config bounds one listener. Zero values take the defaults.
type Config struct {
	// MaxConns caps live connections (default 4096; negative: no cap).
	MaxConns int
	// MaxConnsPerHost caps live connections from one remote IP (default
	// MaxConns; negative: no cap).
	MaxConnsPerHost int
	// IdleGrace is how long a connection must have been idle before the
	// global cap closes it (default 0). A handler that marks Busy on its
	// first bytes sets it so that a connection accepted a moment ago,
	// whose handler has not read yet, is not taken for a squatter.
	IdleGrace time.Duration
	// Name labels log lines ("tcp data port").
	Name string
	// Logger receives accept errors and evictions (default: discard).
	Logger *slog.Logger
	// OnEvict, when set, is called for every connection closed to make
	// room (for metrics).
	OnEvict func(*Conn)
	// Allow, when set, decides from the peer's address whether a
	// connection is served at all (the protected default: loopback
	// peers only). A refused connection is closed before the handler
	// sees it, and OnRefuse (when set) is called with its address.
	Allow    func(remote net.Addr) bool
	OnRefuse func(remote net.Addr)
}

const (
	msgBackoff      = "accept failed; backing off"
	defaultMaxConns = 4096
	minBackoff      = 5 * time.Millisecond
	maxBackoff      = time.Second
)

// Transient reports whether an accept error is worth retrying: the
// process or the system is out of a resource, or a peer gave up before
// accept returned.
func Transient(err error) bool {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS,
		syscall.ENOMEM, syscall.ECONNABORTED, syscall.EINTR, syscall.EAGAIN, syscall.EPROTO, syscall.EPERM} {
		if errors.Is(err, e) {
			return true
		}
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Backoff is the wait before accept attempt n+1 after n transient failures.
func Backoff(n int) time.Duration {
	d := minBackoff
	for i := 0; i < n && d < maxBackoff; i++ {
		d *= 2
	}
	return min(d, maxBackoff)
}

// Loop serves one listener; see Serve.
type Loop struct {
	ln      net.Listener
	cfg     Config
	handle  func(*Conn)
	log     *slog.Logger
	ctx     context.Context
	cancel  context.CancelFunc
	done    chan struct{} // closed when the accept goroutine returns
	wg      sync.WaitGroup
	mu      sync.Mutex
	cond    *sync.Cond
	conns   map[*Conn]struct{}
	perHost map[string]int
	closed  bool
	err     error

	refused    uint64
	refusedLog time.Time

	// held is set, under mu, while admit looks for room at the global
	// cap, so that Conn.Idle wakes it: the connection gone idle is now
	// room.
	held atomic.Bool
}

// Conn is an accepted connection tracked by its Loop. It is idle until
// Busy; handlers mark the span of each request with Busy and Idle so the
// loop evicts only connections that are not doing work.
type Conn struct {
	net.Conn
	l        *Loop
	host     string
	mu       sync.Mutex
	busy     bool
	idleFrom time.Time
	closed   bool
}

// Serve starts accepting on ln in a goroutine and runs handle for each
// connection in its own goroutine. The handler need not close the
// connection: it is closed when handle returns.
func Serve(ln net.Listener, cfg Config, handle func(*Conn)) *Loop {
	if cfg.MaxConns == 0 {
		cfg.MaxConns = defaultMaxConns
	}
	if cfg.MaxConnsPerHost == 0 {
		cfg.MaxConnsPerHost = cfg.MaxConns
	}
	l := &Loop{ln: ln, cfg: cfg, handle: handle, log: cfg.Logger,
		done: make(chan struct{}), conns: map[*Conn]struct{}{}, perHost: map[string]int{}}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	l.cond = sync.NewCond(&l.mu)
	l.ctx, l.cancel = context.WithCancel(context.Background())
	go l.run()
	return l
}

// Addr is the listener's address.
func (l *Loop) Addr() net.Addr { return l.ln.Addr() }

// Err is the error that ended accepting (nil after Close, or while
// running).
func (l *Loop) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Done is closed when the loop stops accepting.
func (l *Loop) Done() <-chan struct{} { return l.done }

// Len is the number of live connections.
func (l *Loop) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.conns)
}

func (l *Loop) run() {
	defer close(l.done)
	for attempt := 0; ; {
		c, err := l.ln.Accept()
		if err != nil {
			if l.ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			if !Transient(err) {
				l.mu.Lock()
				l.err = err
				l.mu.Unlock()
				l.log.Error("accept failed; listener stops", "listener", l.cfg.Name, "err", err)
				return
			}
			if attempt == 0 {
				l.log.Warn(msgBackoff, "listener", l.cfg.Name, "err", err)
			}
			select {
			case <-l.ctx.Done():
				return
			case <-time.After(Backoff(attempt)):
			}
			attempt++
			continue
		}
		attempt = 0
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetNoDelay(true)
		}
		l.admit(c)
	}
}

func hostOf(a net.Addr) string {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	if a == nil {
		return ""
	}
	h, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return h
}

func (l *Loop) admit(raw net.Conn) {
	if l.cfg.Allow != nil && !l.cfg.Allow(raw.RemoteAddr()) {
		l.refuse(raw)
		return
	}
	c := &Conn{Conn: raw, l: l, host: hostOf(raw.RemoteAddr()), idleFrom: time.Now()}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		raw.Close()
		return
	}
	// At the global cap make room from the idle, else hold this one
	// (and stop accepting) until a slot frees or a connection goes idle.
	// A newcomer whose host is at its own cap takes the place of one of
	// that host's connections or none: refused below when only other
	// hosts' are idle, it must not have cost one of theirs its place.
	for l.cfg.MaxConns > 0 && len(l.conns) >= l.cfg.MaxConns && !l.closed {
		l.held.Store(true)
		from := "" // any host
		if l.cfg.MaxConnsPerHost > 0 && l.perHost[c.host] >= l.cfg.MaxConnsPerHost {
			from = c.host
		}
		v, since, unread := l.idlestLocked(from)
		if v == nil && from != "" {
			other, _, otherUnread := l.idlestLocked("")
			if other != nil {
				break // refused by the per-host check
			}
			unread = unread || otherUnread
		}
		switch {
		case v == nil && unread:
			// An idle connection's handler has bytes to read: it is
			// about to work, or to go idle again, and neither wakes
			// the cond.
			l.waitLocked(pendingRecheck)
		case v == nil:
			l.waitLocked(0)
		case l.cfg.IdleGrace-time.Since(since) > 0:
			// Look again when it has been idle long enough.
			l.waitLocked(l.cfg.IdleGrace - time.Since(since))
		default:
			l.evictLocked(v)
		}
	}
	l.held.Store(false)
	if l.closed {
		l.mu.Unlock()
		raw.Close()
		return
	}
	if l.cfg.MaxConnsPerHost > 0 && l.perHost[c.host] >= l.cfg.MaxConnsPerHost {
		v, _, _ := l.idlestLocked(c.host)
		if v == nil {
			l.mu.Unlock()
			l.log.Warn("connection refused: per-host limit", "listener", l.cfg.Name,
				"peer", c.host, "limit", l.cfg.MaxConnsPerHost)
			raw.Close()
			return
		}
		l.evictLocked(v)
	}
	l.conns[c] = struct{}{}
	l.perHost[c.host]++
	l.wg.Add(1)
	l.mu.Unlock()
	go func() {
		defer l.wg.Done()
		defer c.Close()
		l.handle(c)
	}()
}

// refuse closes a connection Allow turned down, logging at most one line
// per refuseLogEvery so that a scan cannot flood the log.
func (l *Loop) refuse(raw net.Conn) {
	addr := raw.RemoteAddr()
	raw.Close()
	// Counted before OnRefuse, so whoever it tells sees the count.
	l.mu.Lock()
	l.refused++
	n, now := l.refused, time.Now()
	quiet := now.Sub(l.refusedLog) < refuseLogEvery
	if !quiet {
		l.refusedLog = now
	}
	l.mu.Unlock()
	if l.cfg.OnRefuse != nil {
		l.cfg.OnRefuse(addr)
	}
	if !quiet {
		l.log.Warn("connection refused: peer not allowed", "listener", l.cfg.Name, "peer", addr.String(), "refused_total", n)
	}
}

const refuseLogEvery = 10 * time.Second

// Refused counts connections Allow turned down.
func (l *Loop) Refused() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.refused
}

// pendingRecheck is how soon a loop held at the cap looks again when the
// only idle connections had unread bytes.
const pendingRecheck = 5 * time.Millisecond

// waitLocked waits for the cond, or for at most d when d > 0.
func (l *Loop) waitLocked(d time.Duration) {
	if d <= 0 {
		l.cond.Wait()
		return
	}
	t := time.AfterFunc(d, func() {
		l.mu.Lock()
		l.cond.Broadcast()
		l.mu.Unlock()
	})
	l.cond.Wait()
	t.Stop()
}

// idlestLocked is the connection idle longest (of host, or of any host
// when host is ""), or nil, and since when it is idle. A connection with
// request bytes waiting is not idle: its handler has not read them yet;
// unread says one was passed over for that.
func (l *Loop) idlestLocked(host string) (_ *Conn, _ time.Time, unread bool) {
	var skip map[*Conn]bool
	for {
		var best *Conn
		var bestT time.Time
		for c := range l.conns {
			if (host != "" && c.host != host) || skip[c] {
				continue
			}
			c.mu.Lock()
			idle, t := !c.busy && !c.closed, c.idleFrom
			c.mu.Unlock()
			if idle && (best == nil || t.Before(bestT)) {
				best, bestT = c, t
			}
		}
		if best == nil || !pending(best.Conn) {
			return best, bestT, skip != nil
		}
		if skip == nil {
			skip = map[*Conn]bool{}
		}
		skip[best] = true
	}
}

// pending reports whether c has received bytes not read yet.
func pending(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	n := 0
	rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	return n > 0
}

// evictLocked closes v and forgets it at once so its slot is free.
func (l *Loop) evictLocked(v *Conn) {
	l.forgetLocked(v)
	l.log.Debug("idle connection closed to make room", "listener", l.cfg.Name, "peer", v.host)
	if l.cfg.OnEvict != nil {
		l.cfg.OnEvict(v)
	}
	v.closeRaw()
}

func (l *Loop) forgetLocked(c *Conn) {
	if _, ok := l.conns[c]; !ok {
		return
	}
	delete(l.conns, c)
	if l.perHost[c.host]--; l.perHost[c.host] <= 0 {
		delete(l.perHost, c.host)
	}
	l.cond.Broadcast()
}

// Close stops accepting, closes the listener and every live connection,
// and waits for the handlers to return.
func (l *Loop) Close() error {
	err := l.Shutdown(false)
	return err
}

// Shutdown stops accepting and closes the listener. With keepConns it
// leaves the live connections to finish on their own (a graceful stop);
// it waits for their handlers either way.
func (l *Loop) Shutdown(keepConns bool) error {
	l.mu.Lock()
	already := l.closed
	l.closed = true
	var conns []*Conn
	if !keepConns {
		for c := range l.conns {
			conns = append(conns, c)
		}
	}
	l.cond.Broadcast()
	l.mu.Unlock()
	l.cancel()
	var err error
	if !already {
		err = l.ln.Close()
	}
	for _, c := range conns {
		c.closeRaw()
	}
	<-l.done
	l.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// Busy marks the connection as doing work: it is not evicted until Idle.
func (c *Conn) Busy() {
	c.mu.Lock()
	c.busy = true
	c.mu.Unlock()
}

// Idle marks the connection as waiting for its peer.
func (c *Conn) Idle() {
	c.mu.Lock()
	c.busy = false
	c.idleFrom = time.Now()
	c.mu.Unlock()
	// After busy is cleared: a loop that set held before this load scans
	// after the store above; one that sets it later scans later still.
	if l := c.l; l.held.Load() {
		l.mu.Lock()
		l.cond.Broadcast()
		l.mu.Unlock()
	}
}

// Host is the remote IP the per-host cap counts.
func (c *Conn) Host() string { return c.host }

func (c *Conn) closeRaw() {
	c.mu.Lock()
	already := c.closed
	c.closed = true
	c.mu.Unlock()
	if !already {
		c.Conn.Close()
	}
}

// Close closes the connection and frees its slot.
func (c *Conn) Close() error {
	c.mu.Lock()
	already := c.closed
	c.closed = true
	c.mu.Unlock()
	c.l.mu.Lock()
	c.l.forgetLocked(c)
	c.l.mu.Unlock()
	if already {
		return nil
	}
	return c.Conn.Close()
}
