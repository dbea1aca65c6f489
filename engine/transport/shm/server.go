package shm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/crescent-kv/crescent/internal/auth"
	"github.com/crescent-kv/crescent/internal/netx"
)

// serverConn is one peer connected to our control socket.
type serverConn struct {
	t  *Transport
	nc *netx.Conn
	c  *net.UnixConn

	wmu sync.Mutex // serialises writes

	mu      sync.Mutex
	waiting map[uint64]chan struct{} // revoke id -> ack
}

// idleGrace spares a connection accepted a moment ago from eviction at
// the cap before its first request could arrive.
const idleGrace = 250 * time.Millisecond

// serve runs one control connection. It is idle (evictable at the cap)
// until the peer's first message: after that the peer may hold mappings
// that only this connection can revoke.
func (t *Transport) serve(nc *netx.Conn) {
	c := nc.Conn.(*net.UnixConn)
	if err := t.checkPeer(c); err != nil {
		t.log.Warn("shm: refused peer", "err", err)
		send(c, &message{Op: "error", Error: err.Error()}, nil)
		return
	}
	if t.cfg.Token != nil {
		// Idle (evictable at the cap) until the peer proved the token.
		if err := auth.Server(packets{c}, t.cfg.Token, auth.PurposeShmControl, 0); err != nil {
			t.log.Warn("shm: peer failed authentication", "err", err)
			return
		}
	}
	sc := &serverConn{t: t, nc: nc, c: c, waiting: make(map[uint64]chan struct{})}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.conns[sc] = struct{}{}
	t.mu.Unlock()
	sc.serve()
	nc.Close()
	t.mu.Lock()
	delete(t.conns, sc)
	t.mu.Unlock()
	sc.mu.Lock()
	for _, ch := range sc.waiting {
		close(ch) // a departed peer holds no mapping
	}
	sc.waiting = nil
	sc.mu.Unlock()
}

// checkPeer allows our own uid, the configured ones, or anyone if told.
func (t *Transport) checkPeer(c *net.UnixConn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cred *unix.Ucred
	var cerr error
	rc.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if cerr != nil {
		return fmt.Errorf("shm: SO_PEERCRED: %w", cerr)
	}
	if t.cfg.AllowAnyUID || cred.Uid == t.uid || slices.Contains(t.cfg.AllowUIDs, cred.Uid) {
		return nil
	}
	return fmt.Errorf("%w: uid %d (pid %d)", ErrPermission, cred.Uid, cred.Pid)
}

func (sc *serverConn) serve() {
	buf := make([]byte, maxPacket)
	oob := make([]byte, unix.CmsgSpace(4*maxFDs))
	for {
		m, fds, err := recv(sc.c, buf, oob)
		closeAll(fds)
		if err == nil && len(fds) > 0 {
			err = fmt.Errorf("%w: %d fds attached", errBadMessage, len(fds)) // peers have no reason to send us fds
		}
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				sc.t.log.Debug("shm: control connection ended", "err", err)
			}
			return
		}
		sc.nc.Busy() // for good: see serve
		switch m.Op {
		case "list":
			if err := sc.sendRegions(m.ID); err != nil {
				return
			}
		case "revoked":
			sc.mu.Lock()
			if ch, ok := sc.waiting[m.ID]; ok {
				close(ch)
				delete(sc.waiting, m.ID)
			}
			sc.mu.Unlock()
		default:
			sc.write(&message{Op: "error", Error: "unknown op " + m.Op}, nil)
			return
		}
	}
}

// sendRegions lists every memfd-backed region, attaching the memfds;
// several packets when there are many.
func (sc *serverConn) sendRegions(id uint64) error {
	regs := sc.t.listable()
	version := sc.t.env.Registry.Version()
	m := &message{Op: "regions", ID: id, Version: version}
	var fds []int // our duplicates, closed after each packet
	var inodes []uint64
	flush := func(more bool) error {
		m.More = more
		err := sc.write(m, fds)
		closeAll(fds)
		m = &message{Op: "regions", ID: id, Version: version}
		fds, inodes = fds[:0], inodes[:0]
		return err
	}
	for _, r := range regs {
		// A packet stays well under maxPacket (~60 bytes a region).
		if len(m.Regions) >= 800 || len(fds) == maxFDs {
			if err := flush(true); err != nil {
				return err
			}
		}
		fd, err := r.DupFd()
		if err != nil {
			continue // not shareable, or unregistered meanwhile
		}
		var st unix.Stat_t
		if unix.Fstat(fd, &st) != nil {
			unix.Close(fd)
			continue
		}
		// One fd per memfd per packet, however many regions it backs.
		i := slices.Index(inodes, st.Ino)
		if i >= 0 {
			unix.Close(fd)
		} else {
			seal(fd)
			fds, inodes = append(fds, fd), append(inodes, st.Ino)
			i = len(fds) - 1
		}
		m.Regions = append(m.Regions, region{Addr: r.Addr, Len: r.Len(), FD: i, Off: r.FdOffset})
	}
	return flush(false)
}

func (sc *serverConn) write(m *message, fds []int) error {
	sc.wmu.Lock()
	defer sc.wmu.Unlock()
	return send(sc.c, m, fds)
}

// revoke asks the peer to unmap [addr, addr+length) and waits for its
// confirmation. When ctx ends first it returns, with the error, a channel
// closed once the peer confirms late or its connection is gone; our
// writing half is shut so the peer learns, and drops its mappings.
func (sc *serverConn) revoke(ctx context.Context, id, addr, length uint64) (<-chan struct{}, error) {
	ch := make(chan struct{})
	sc.mu.Lock()
	if sc.waiting == nil {
		sc.mu.Unlock()
		return nil, nil // connection already gone
	}
	sc.waiting[id] = ch
	sc.mu.Unlock()
	if err := sc.write(&message{Op: "revoke", ID: id, Addr: addr, Len: length}, nil); err != nil {
		return nil, nil // the peer is gone, and with it its mapping
	}
	select {
	case <-ch:
		return nil, nil
	case <-ctx.Done():
		// A silent peer (stopped, say) may still write into the buffer:
		// closing our end would lose the one sign that it cannot any
		// more, its end closing.
		sc.c.CloseWrite()
		return ch, fmt.Errorf("shm: peer did not confirm unmapping %#x: %w", addr, ctx.Err())
	}
}
